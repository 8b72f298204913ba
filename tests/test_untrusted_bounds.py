"""Small hostile traces must not cause large work or large allocations.

Each hostile pair is a real recording (fixtures/torch_dot.py, recorded once) copied and
edited with h5py: many unpaired inputs across frameworks, many differing alignment
regions, op parameters that ask a replay for a huge output, a huge manifest, millions of
strings. The commands run in a subprocess under an address-space limit (an over-allocation
fails there) and a generous timeout (not a timing assertion: the old code took minutes).
The builders are reused at full size by benchmarks/hostile_scale.py.
"""

import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tracediff.trace import schema
from tracediff.trace.values import digest

from .helpers import ROOT, script_env

AS_LIMIT = 3 << 30          # address space of a checked command (torch alone maps ~1.2 GB)
TIMEOUT = 120               # seconds; the hostile inputs took minutes before the fix


# -- building hostile traces from a real one ------------------------------------------------

def _append(f, name, rows):
    """Append rows to a table and commit them; returns the first new row's index."""
    ds = f[name]
    n = int(f.attrs[f"committed_{name}"])
    ds.resize((n + len(rows),))
    ds[n:] = rows
    f.attrs[f"committed_{name}"] = n + len(rows)
    return n


def _strings(f, texts):
    """Append strings to the strings table; returns their indices."""
    n = int(f.attrs["committed_strings"])
    ds = f["strings"]
    ds.resize((n + len(texts),))
    ds[n:] = np.array(texts, dtype=object)
    f.attrs["committed_strings"] = n + len(texts)
    return list(range(n, n + len(texts)))


def _events(n, fw, kind, op):
    ev = np.zeros(n, schema.EVENT_DTYPE)
    ev["framework"], ev["kind"], ev["op"] = fw, kind, op
    for col in ("params", "name_stack", "source", "node"):
        ev[col] = -1
    ev["call"] = ev["parent"] = ev["iter"] = -1
    return ev


def many_inputs(src, a, b, n, seed=0):
    """A cross-framework pair (a relabelled JAX) with `n` extra external inputs on each
    side that pair with nothing by bytes: a's are float32[1], b's float64[1] except the
    last, a float32[1] that the first input of a pairs with by size ("structure")."""
    rng = np.random.default_rng(seed)
    for path, fw, side in ((a, schema.FW_JAX, "a"), (b, schema.FW_TORCH, "b")):
        shutil.copyfile(src, path)
        with h5py.File(path, "r+") as f:
            ev = f["events"][:]
            ev["framework"] = fw
            f["events"][:] = ev
            op, f32, f64, shape = _strings(f, ["<input>", "float32", "float64", "1"])
            first = _append(f, "events", _events(n, fw, schema.KIND_INPUT, op))
            vals = np.zeros(n, schema.VALUE_DTYPE)
            vals["event"] = np.arange(first, first + n)
            vals["dtype"] = vals["storage"] = f32 if side == "a" else f64
            vals["shape"], vals["name"], vals["offset"] = shape, -1, 0
            vals["nbytes"] = 4 if side == "a" else 8
            if side == "b":
                vals["dtype"][-1] = vals["storage"][-1] = f32
                vals["nbytes"][-1] = 4
            vals["hash"] = rng.integers(1, 1 << 62, n, dtype=np.int64).astype(np.uint64)
            _append(f, "values", vals)


def many_regions(src, a, b, regions, length):
    """A same-framework pair with `regions` optimizer-step anchors, each followed by
    `length` distinct ops, rotated by the region's number (no two regions alike): in b
    they come in reverse order, so every region needs ~2 x length edits (more than the
    aligner's cap) while the two regions hold the same ops (no count-based shortcut)."""
    for path, rev in ((a, False), (b, True)):
        shutil.copyfile(src, path)
        with h5py.File(path, "r+") as f:
            ids = _strings(f, ["optimizer.step"] + [f"aten::op{i}" for i in range(length)])
            ops = np.array(ids[1:], np.int32)
            ev = _events(regions * (length + 1), schema.FW_TORCH, schema.KIND_OP, 0)
            ev["op"] = np.concatenate([np.concatenate([[ids[0]], (lambda r: r[::-1] if rev
                                                                  else r)(np.roll(ops, -k))])
                                       for k in range(regions)])
            ev["kind"][::length + 1] = schema.KIND_OPTIM
            ev["step"] = np.repeat(np.arange(regions), length + 1)
            _append(f, "events", ev)


def expand_op(src, a, b, size=(250_000_000, 4)):
    """A pair whose first difference is an `aten::expand` (event 2, a float32 scalar)
    whose recorded parameters ask for a `size` output."""
    for path in (a, b):
        shutil.copyfile(src, path)
        with h5py.File(path, "r+") as f:
            op, params = _strings(f, ["aten::expand", f"size=[{size[0]}, {size[1]}]"])
            ev = f["events"][:]
            ev["op"][2], ev["params"][2] = op, params
            f["events"][:] = ev
            if path == b:   # b's output of event 2 differs
                vals = f["values"][:]
                row = np.flatnonzero(vals["event"] == 2)[0]
                x = np.float32(-1.5)
                off = int(vals["offset"][row])
                f["blob"][off:off + 4] = np.frombuffer(x.tobytes(), np.uint8)
                vals["hash"][row] = digest(x.tobytes())
                f["values"][:] = vals


def huge_manifest(src, out, nbytes):
    """A trace whose manifest is a valid JSON object of about `nbytes` bytes; returns
    its exact size."""
    shutil.copyfile(src, out)
    with h5py.File(out, "r+") as f:
        text = json.dumps({"tracediff_version": "0", "pad": "x" * max(0, nbytes - 40)})
        del f["manifest"]
        f.create_dataset("manifest", data=text, dtype=h5py.string_dtype())
    return len(text.encode())


def many_strings(src, out, n, vlen=True):
    """A trace whose strings table holds `n` more strings that nothing refers to
    (variable-length like the writer's, or fixed-length)."""
    shutil.copyfile(src, out)
    with h5py.File(out, "r+") as f:
        old = list(f["strings"][:int(f.attrs["committed_strings"])])
        if vlen:
            ds = f["strings"]
            ds.resize((len(old) + n,))
            step = 1 << 20
            for lo in range(len(old), len(old) + n, step):
                k = min(step, len(old) + n - lo)
                ds[lo:lo + k] = np.full(k, b"s", dtype=object)
        else:
            width = max(16, max(len(s) for s in old))
            data = np.full(len(old) + n, b"s", dtype=f"S{width}")
            data[:len(old)] = old
            del f["strings"]
            f.create_dataset("strings", data=data)
        f.attrs["committed_strings"] = len(old) + n


# -- running a command under limits ----------------------------------------------------------

# The child writes its own peak RSS (VmHWM: ru_maxrss would include the parent's, kept
# across fork and exec) when it exits.
_CHILD = """
import atexit, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))

def peak():
    hwm = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")]
    if hwm:   # gVisor's /proc has no VmHWM: then no peak is known
        open({peak!r}, "w").write(str(int(hwm[0]) * 1024))

atexit.register(peak)
sys.argv = ["tracediff"] + sys.argv[1:]
from tracediff.cli import main
main()
"""


def _kernel_reports_peak_rss():
    with open("/proc/self/status") as f:
        return any(line.startswith("VmHWM:") for line in f)


# Premise of the peak-RSS assertions (the address-space limit holds without it)
PEAK_RSS_KNOWN = _kernel_reports_peak_rss()


def assert_peak_below(peak, limit):
    """The child's peak RSS is under LIMIT, where the kernel reports one (not on gVisor)."""
    if PEAK_RSS_KNOWN:
        assert peak is not None and peak < limit, peak


def run_bounded(*args, tmp, limit=AS_LIMIT, timeout=TIMEOUT):
    """Run the CLI in a child limited to `limit` bytes of address space; returns
    (CompletedProcess, the child's peak RSS in bytes or None if it did not exit normally)."""
    peak_file = os.path.join(tmp, "peak.txt")
    env = script_env({"NO_COLOR": "1"})
    env.pop("XLA_FLAGS", None)
    code = _CHILD.format(limit=limit, peak=peak_file)
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    peak = int(open(peak_file).read()) if os.path.exists(peak_file) else None
    return proc, peak


@pytest.fixture(scope="module")
def dot(recorded):
    return recorded("torch_dot.py")


# -- the attacks ---------------------------------------------------------------------------------

def test_many_unpaired_inputs_across_frameworks(dot, tmp_path):
    """Cross-framework pairing of external inputs by size was a scan of all of b's left
    inputs for each of a's (O(N^2): 100k inputs, 225 s); pairing now starts from what
    computing ops read, so inputs nothing reads cost nothing."""
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    n = 60_000
    many_inputs(dot, a, b, n)
    proc, _ = run_bounded("locate", a, b, "--json", "--no-explain", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(proc.stdout)
    assert d["verdict"] == "match"
    pairs = {(m["a"], m["b"]): m["by"] for m in d["mapping"]}
    # the real ops pair by dataflow from the value both sides read; the extra inputs are
    # read by nothing and pair with nothing (pairing follows what computing ops read)
    assert pairs[(1, 1)] == "dataflow"
    assert not [k for k in pairs if k[0] >= 10 or k[1] >= 10]


def test_many_differing_alignment_regions(dot, tmp_path):
    """40 anchor regions that each need more edits than the aligner's cap cost ~2.4 s
    each before; now one budget for the whole alignment (seconds in all)."""
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    regions, length = 40, 1100
    many_regions(dot, a, b, regions, length)
    proc, _ = run_bounded("locate", a, b, "--json", "--no-explain", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(proc.stdout)
    al = d["alignment"]
    assert al["events_a"] == al["events_b"] == 10 + regions * (length + 1)
    assert al["anchors_matched"] == regions
    # every region is too different to align within the cap: each falls back to pairing
    # equal ops position by position, and a reversed even-length run has none
    assert al["fallback_regions"] == regions
    assert al["matched"] == 10 + regions
    assert d["verdict"] == "match"
    assert "44000 events only in a" in proc.stderr


def test_replay_refuses_an_output_larger_than_recorded(dot, tmp_path):
    """An expand whose recorded parameters ask for [2.5e8, 4] made locate's replay
    verdict allocate 15.9 GB; it is now refused before anything runs (explain's replay of
    the event: locate never replays a view)."""
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    expand_op(dot, a, b)
    proc, _ = run_bounded("locate", a, b, "--json", tmp=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    d = json.loads(proc.stdout)
    assert d["first_difference"]["a"]["index"] == 2
    assert d["first_difference"]["a"]["op"] == "aten::expand"
    # a view is never the origin locate replays (it reinterprets what it reads); asked to
    # explain that very event, the replay is refused before anything runs
    proc, _ = run_bounded("explain", a, b, 2, "--json", tmp=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["replay"]["verdict"] == (
        "cannot replay aten::expand: replay refused: the op would output "
        "1,000,000,000 elements (4.0 GB), more than its recorded outputs (1 element, 4 bytes)")


def test_repro_refuses_an_output_larger_than_recorded(dot, tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    expand_op(dot, a, b)
    out = tmp_path / "repro"
    proc, _ = run_bounded("repro", a, 2, "-o", out, tmp=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == (
        "tracediff: error: cannot write a reproducer for aten::expand (event 2): replay refused: "
        "the op would output 1,000,000,000 elements (4.0 GB), more than its recorded outputs "
        "(1 element, 4 bytes)\n")
    assert not out.exists()


def test_replay_cap_holds_whatever_the_recording_claims(dot, tmp_path):
    """A recorded output that claims the same huge shape (metadata, not stored) does not
    lift the budget: the 256 MiB cap holds."""
    from tracediff.diff.explain.replay.calls import build_call, ReplayRefused

    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    expand_op(dot, a, b)
    call = build_call("torch", "aten::expand", "size=[250000000, 4]", 1,
                      (1_000_000_000, 4_000_000_000))
    with pytest.raises(ReplayRefused, match=r"^replay refused: the op would output "
                       r"1,000,000,000 elements \(4\.0 GB\), more than the 256 MiB a replay "
                       r"may produce$"):
        call.run([np.float32(1.0)])
    # within budget, the same call runs
    small = build_call("torch", "aten::expand", "size=[2, 4]", 1, (8, 32))
    assert small.run([np.float32(1.5)])[0].tolist() == [[1.5] * 4] * 2


def test_huge_manifest_is_refused_before_it_is_read(dot, tmp_path):
    """A 250 MB manifest was read whole (1.46 GB RSS) before being refused."""
    path = tmp_path / "m.h5"
    size = huge_manifest(dot, path, 200 << 20)
    proc, peak = run_bounded("info", path, "--json", tmp=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == ""
    assert proc.stderr == (f"tracediff: error: {path}: the manifest is {size:,} bytes, more "
                           f"than the 16 MiB a manifest may hold\n")
    assert_peak_below(peak, 200 << 20)


def test_millions_of_unreferenced_strings_are_not_read(dot, tmp_path):
    """A trace with 5M strings made `info` use 1.0 GB; only referenced strings are read."""
    path = tmp_path / "s.h5"
    many_strings(dot, path, 2_000_000)
    proc, peak = run_bounded("info", path, "--json", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(proc.stdout)
    assert d["events"] == 10
    assert {o["op"]: o["count"] for o in d["operations"]} == {
        "aten::mul.Tensor": 4, "aten::arange": 1, "aten::dot": 1, "aten::ones_like": 1,
        "aten::add.Tensor": 1, "aten::detach": 1, "aten::_local_scalar_dense": 1}
    assert_peak_below(peak, 250 << 20)


def test_string_count_and_length_limits(dot, tmp_path):
    from tracediff.errors import TraceError
    from tracediff.trace import reader
    from tracediff.trace.reader import limits

    path = tmp_path / "long.h5"
    shutil.copyfile(dot, path)
    with h5py.File(path, "r+") as f:   # the op name of event 0: a 2 MiB string
        idx = _strings(f, ["x" * (2 << 20)])[0]
        ev = f["events"][:]
        ev["op"][0] = idx
        f["events"][:] = ev
    with pytest.raises(TraceError, match=r": the strings table holds a string of 2,097,152 "
                       r"bytes, more than the 1 MiB a string may hold$"):
        reader.Trace(path)
    path = tmp_path / "count.h5"
    shutil.copyfile(dot, path)
    with h5py.File(path, "r+") as f:   # a count past the limit, checked before reading
        f["strings"].resize((limits.MAX_STRINGS + 1,))
        f.attrs["committed_strings"] = limits.MAX_STRINGS + 1
    with pytest.raises(TraceError, match=r": the strings table holds 16,777,217 strings, more "
                       r"than the 16,777,216 a trace may hold$"):
        reader.Trace(path)


def _side(sig, kind):
    from tracediff.diff.align import sequence as align

    return align.Side(trace=None, gid=None, sig=np.asarray(sig, np.uint64), content=None,
                      n_out=None, kind=np.asarray(kind, np.int64), call=None, parent=None,
                      vkey=None, vrow=None)


def _regions(bodies):
    """Signatures and kinds of anchor + body regions (anchor signature 0)."""
    sig = np.concatenate([np.concatenate([[0], body]) for body in bodies]).astype(np.uint64)
    kind = np.full(len(sig), schema.KIND_OP)
    kind[np.cumsum([0] + [len(x) + 1 for x in bodies[:-1]])] = schema.KIND_OPTIM
    return sig, kind


def test_alignment_budget_spares_repeated_regions_and_bounds_distinct_ones():
    """A legitimate run repeats one step's structure: 60 steps whose regions each need 400
    edits (more than the pool could pay 60 times; a small pool here, to keep the test
    fast) still align exactly, because a repeated region is diffed once. 60 distinct such
    regions exhaust the pool: the rest fall back (bounded work), none is mis-paired."""
    from tracediff.diff.align import sequence as align

    rng = np.random.default_rng(0)
    body_a = rng.permutation(np.arange(1, 601))
    # b: every third op of a removed, 200 new ones inserted (400 edits)
    body_b = np.insert(np.delete(body_a, np.arange(0, 600, 3)), np.arange(0, 400, 2),
                       np.arange(1001, 1201))
    steps = 60
    sa, sb = _side(*_regions([body_a] * steps)), _side(*_regions([body_b] * steps))
    al = align.align(sa, sb, budget=align.Budget(pool=500_000))
    one = align.align(_side(*_regions([body_a])), _side(*_regions([body_b])))
    assert al.fallback_regions == 0 and one.fallback_regions == 0
    per_region = int((one.a2b >= 0).sum())
    assert int((al.a2b >= 0).sum()) == steps * per_region
    # distinct regions (each body shifted into its own range of signatures)
    shift = [body_a + 10_000 * k for k in range(steps)], [body_b + 10_000 * k for k in range(steps)]
    budget = align.Budget(pool=500_000)
    al = align.align(_side(*_regions(shift[0])), _side(*_regions(shift[1])), budget=budget)
    assert 0 < al.fallback_regions < steps and budget.exhausted == al.fallback_regions
    m = np.flatnonzero(al.a2b >= 0)
    assert np.all(_regions(shift[0])[0][m] == _regions(shift[1])[0][al.a2b[m]])


def test_a_value_running_past_the_stored_bytes_is_refused_when_the_trace_opens(dot, tmp_path):
    """A value that starts inside the committed bytes but ends past them (a commit count
    cut short, a forged row) is damage found when the trace opens: one line, exit 2,
    never bytes read from beyond the commit (uncommitted or unwritten data)."""
    from tracediff.errors import TraceError
    from tracediff.trace.reader import Trace

    from .helpers import run_cli

    bad = tmp_path / "short.h5"
    shutil.copyfile(dot, bad)
    with h5py.File(bad, "r+") as f:
        v = f["values"][:int(f.attrs["committed_values"])]
        v = v[(v["offset"] >= 0) & (v["nbytes"] >= 2)]
        end = int((v["offset"] + v["nbytes"]).max())
        assert end == int(f.attrs["committed_blob"])   # the real trace: its last value ends the blob
        f.attrs["committed_blob"] = end - 1             # that value now runs one byte past the end
    with pytest.raises(TraceError, match="value bytes lie outside the stored data"):
        Trace(str(bad))
    proc = run_cli("show", bad, "0")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "value bytes lie outside" in proc.stderr
