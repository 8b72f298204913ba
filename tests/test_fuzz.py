"""Fuzz the reader and locate with mutated real traces (seeded, in-process, fast).

Two small real traces (torch and JAX) are recorded once; every case copies one, applies
one seeded mutation (byte flips, truncation, zeroed ranges, HDF5-level edits of datasets
and attributes, garbled table values and strings, hostile manifests, links to other
files, filters) and then opens it, summarises it, shows a few events and locates it
against the intact trace. Each case must end in `TraceError` or a valid result, within a
time budget, and never with another exception.

TRACEDIFF_FUZZ_CASES and TRACEDIFF_FUZZ_SEED change the number of cases and the seed.
"""

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import tracediff
from tracediff.errors import TraceError
from tracediff.report.summary import event_detail, print_event, print_summary, trace_summary
from tracediff.trace import schema

from .helpers import ROOT

N_CASES = int(os.environ.get("TRACEDIFF_FUZZ_CASES", "520"))
SEED = int(os.environ.get("TRACEDIFF_FUZZ_SEED", "20261130"))
CASE_SECONDS = 10.0   # per case; the slowest legitimate case takes well under a second
HUGE = [2**62, 2**63 - 1, -(2**63), -1, -2, 2**31, 2**32 + 7, 10**15]


@pytest.fixture(scope="module")
def seeds(recorded):
    paths = recorded.many({"torch": ("torch_dot.py", (), None),
                           "jax": ("jax_control_flow.py", (), None)})
    # the child computes the live byte positions
    return {key: (str(path), None) for key, path in paths.items()}


# -- mutations: each takes (rng, path, live byte positions) and edits the file in place --

def m_flip(rng, path, live):
    with open(path, "r+b") as fh:
        for pos in rng.choice(live, size=int(rng.integers(1, 24))):
            fh.seek(int(pos))
            b = fh.read(1)
            fh.seek(int(pos))
            fh.write(bytes([b[0] ^ (1 << int(rng.integers(0, 8)))]))
    return "flip bytes"


def m_random_bytes(rng, path, live):
    with open(path, "r+b") as fh:
        pos = int(rng.choice(live))
        fh.seek(pos)
        fh.write(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes())
    return "overwrite a run of bytes"


def m_truncate(rng, path, live):
    size = os.path.getsize(path)
    cut = int(rng.choice([rng.integers(0, 4096), rng.integers(0, size), int(live[-1]) // 2]))
    with open(path, "r+b") as fh:
        fh.truncate(cut)
    return f"truncate to {cut}"


def m_zero(rng, path, live):
    with open(path, "r+b") as fh:
        pos = int(rng.choice(live))
        fh.seek(pos)
        fh.write(b"\0" * int(rng.integers(1, 4096)))
    return "zero a range (torn write)"


DATASETS = ["events", "values", "inputs", "strings", "blob", "manifest"]


def m_delete(rng, path, live):
    name = str(rng.choice(DATASETS))
    with h5py.File(path, "r+") as f:
        del f[name]
    return f"delete {name}"


def m_replace_dataset(rng, path, live):
    name = str(rng.choice(DATASETS))
    choice = int(rng.integers(0, 6))
    with h5py.File(path, "r+") as f:
        del f[name]
        if choice == 0:
            f.create_dataset(name, data=np.arange(10, dtype="f8"))
        elif choice == 1:
            f.create_dataset(name, data=np.zeros((3, 4), dtype="u1"))
        elif choice == 2:
            f.create_group(name)
        elif choice == 3:
            f.create_dataset(name, data=np.int64(7))
        elif choice == 4:  # a sparse dataset claiming a huge number of rows
            dt = schema.TABLES.get(name, np.dtype("u1"))
            f.create_dataset(name, shape=(10**12,), maxshape=(None,), dtype=dt, chunks=(1024,))
        else:
            f.create_dataset(name, data=np.array(["x", "y"], dtype=h5py.string_dtype()))
    return f"replace {name} ({choice})"


def m_link(rng, path, live):
    name = str(rng.choice(DATASETS))
    kind = int(rng.integers(0, 3))
    with h5py.File(path, "r+") as f:
        del f[name]
        if kind == 0:
            f[name] = h5py.ExternalLink("/etc/passwd", "/x")
        elif kind == 1:
            f[name] = h5py.SoftLink("/nowhere")
        else:
            f[name] = h5py.SoftLink("/" + name)  # a link to itself
    return f"link {name} ({kind})"


def m_storage(rng, path, live):
    """Datasets whose bytes live elsewhere or need a filter: external raw files, gzip."""
    name = str(rng.choice(["blob", "events", "values", "strings"]))
    with h5py.File(path, "r+") as f:
        data = f[name][()]
        del f[name]
        if rng.integers(0, 2) and name != "strings":
            f.create_dataset(name, shape=data.shape, dtype=data.dtype,
                             external=[("/etc/hostname", 0, h5py.h5f.UNLIMITED)])
        else:
            f.create_dataset(name, data=data, maxshape=(None,), chunks=True, compression="gzip")
    return f"storage of {name}"


def _attr_value(rng):
    return [lambda: int(rng.choice(HUGE)), lambda: -5, lambda: 3.5, lambda: "12",
            lambda: np.arange(4), lambda: b"\xff\xfe", lambda: "x" * 100_000,
            lambda: np.zeros((2, 2)), lambda: True, lambda: 0][int(rng.integers(0, 10))]()


def m_attrs(rng, path, live):
    names = ["format", "schema_version", "complete", "committed_events", "committed_values",
             "committed_inputs", "committed_strings", "committed_blob"]
    with h5py.File(path, "r+") as f:
        edits = []
        for _ in range(int(rng.integers(1, 4))):
            name = str(rng.choice(names))
            if rng.integers(0, 6) == 0:
                del f.attrs[name]
                edits.append(f"del {name}")
            else:
                f.attrs[name] = value = _attr_value(rng)
                edits.append(f"{name}={str(value)[:20]}")
        if rng.integers(0, 8) == 0:
            f.attrs["format"] = "tracediff.trace"
            f.attrs["schema_version"] = int(rng.choice([2, 99, 2**40]))
            edits.append("newer schema")
    return "attrs " + ", ".join(edits)


def _deep(n):
    return "[" * n + "]" * n


MANIFESTS = [
    lambda rng: "not json {",
    lambda rng: "[1, 2, 3]",
    lambda rng: _deep(100_000),
    lambda rng: json.dumps({"end": "crashed", "script": 5}),
    lambda rng: json.dumps({"script": {"sha256": 12345, "name": ["x"]}, "end": {"exit_code": "1"}}),
    lambda rng: json.dumps({"packages": [1], "env": "x", "os": {"platform": 3}}),
    lambda rng: json.dumps({"created": 5, "hostname": {"a": 1}, "cpu": {"model": 7}}),
    lambda rng: json.dumps({"distributed": {"rank": "0"}, "frameworks": {"jax": [1]}}),
    lambda rng: "\udcff" if False else "\u0000\u0001",
    lambda rng: json.dumps({"x": "y" * (17 << 20)}),
    lambda rng: "1e999999",
    lambda rng: json.dumps({}),
]


def m_manifest(rng, path, live):
    k = int(rng.integers(0, len(MANIFESTS)))
    with h5py.File(path, "r+") as f:
        del f["manifest"]
        if rng.integers(0, 6) == 0:
            f.create_dataset("manifest", data=np.bytes_(MANIFESTS[k](rng).encode()[:1000]))
        else:
            f.create_dataset("manifest", data=MANIFESTS[k](rng), dtype=h5py.string_dtype())
    return f"manifest {k}"


TABLE_COLUMNS = {
    "events": ["op", "params", "name_stack", "source", "node", "call", "parent", "step", "iter",
               "kind", "framework", "phase", "origin"],
    "values": ["event", "slot", "role", "flags", "dtype", "storage", "shape", "name", "offset",
               "nbytes", "hash"],
    "inputs": ["event", "slot", "producer", "producer_slot"],
}


def m_table(rng, path, live):
    table = str(rng.choice(list(TABLE_COLUMNS)))
    with h5py.File(path, "r+") as f:
        ds = f[table]
        rows = ds[()]
        if not len(rows):
            return f"{table} empty"
        edits = []
        for _ in range(int(rng.integers(1, 4))):
            col = str(rng.choice(TABLE_COLUMNS[table]))
            i = int(rng.integers(0, len(rows)))
            info = np.iinfo(rows.dtype[col])
            pick = int(rng.integers(0, 4))
            if pick == 0:
                v = int(rng.integers(info.min, info.max, dtype=np.int64, endpoint=False)) \
                    if info.bits < 64 else int(rng.choice(HUGE)) % (info.max + 1 - info.min) + info.min
            elif pick == 1:
                v = info.max
            elif pick == 2:
                v = max(info.min, -1 if info.min < 0 else 0) if info.min < 0 else info.max
            else:
                v = max(info.min, min(info.max, int(rows[col][i]) + int(rng.integers(-3, 4))))
            rows[col][i] = v
            edits.append(f"{col}[{i}]={v}")
        ds[...] = rows
    return f"{table} " + ", ".join(edits)


HOSTILE_STRINGS = ["99999999999,99999999999", "4294967296,4294967296", "-1", "a,b", "1," * 200,
                   "", "object", "O", "V8", "<U10", "float8_e4m3fn", "complex256", "int4",
                   "9" * 5000, "\x00", "1,,2", " 3", "3e2", "0,99999999999999999999999"]


def m_strings(rng, path, live):
    with h5py.File(path, "r+") as f:
        ds = f["strings"]
        n = ds.shape[0]
        edits = []
        for _ in range(int(rng.integers(1, 6))):
            i = int(rng.integers(0, n))
            s = str(rng.choice(HOSTILE_STRINGS))
            if rng.integers(0, 10) == 0:
                s = "x" * (1 << 20)
            ds[i] = s
            edits.append(f"[{i}]={s[:12]!r}")
        if rng.integers(0, 8) == 0:  # the shape strings of all values at once
            v = f["values"][()]
            for idx in np.unique(v["shape"]):
                if 0 <= idx < n:
                    ds[int(idx)] = str(rng.choice(HOSTILE_STRINGS[:6]))
            edits.append("all shapes")
    return "strings " + ", ".join(edits)


def m_blob(rng, path, live):
    with h5py.File(path, "r+") as f:
        blob = f["blob"]
        pick = int(rng.integers(0, 3))
        if pick == 0:
            n = int(f.attrs["committed_blob"])
            if n:
                i = int(rng.integers(0, n))
                blob[i] = blob[i] ^ 0xFF  # hash no longer matches: a valid trace with odd values
        elif pick == 1:
            blob.resize((int(rng.integers(0, max(1, blob.shape[0]))),))
        else:
            blob.resize((10**13,))
    return f"blob {pick}"


MUTATIONS = [m_flip, m_flip, m_flip, m_random_bytes, m_truncate, m_zero, m_delete,
             m_replace_dataset, m_link, m_storage, m_attrs, m_attrs, m_manifest, m_table,
             m_table, m_table, m_strings, m_strings, m_blob]


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def _exercise(path, intact):
    """What info, show and locate do with a trace; returns normally or raises."""
    sink = io.StringIO()
    from rich.console import Console

    console = Console(file=sink, width=120)
    with tracediff.load(path) as t:
        summary = trace_summary(t)
        print_summary(summary, console=console)
        json.dumps(summary, default=str)
        for eid in sorted({0, len(t) // 2, len(t) - 1} - {-1}):
            if 0 <= eid < len(t):
                detail, _ = event_detail(t, eid)
                print_event(detail, console=console)
    result = tracediff.locate(intact, path)
    json.dumps(tracediff.to_json(result))
    from tracediff.report.terminal import print_locate

    print_locate(result, console=console)
    return result


def run_cases(seeds, n_cases, seed, work, progress=None):
    """Run `n_cases` mutations; returns (failures, outcomes, mutation counts)."""
    rng = np.random.default_rng(seed)
    failures, outcomes, kinds = [], {"TraceError": 0, "result": 0}, {}
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for case in range(n_cases):
            key = ("torch", "jax")[case % 2]
            src, live = seeds[key]
            shutil.copyfile(src, work)
            mutate = MUTATIONS[int(rng.integers(0, len(MUTATIONS)))]
            kinds[mutate.__name__] = kinds.get(mutate.__name__, 0) + 1
            try:
                what = mutate(rng, str(work), live)
            except Exception as exc:  # the mutation itself failed on a damaged file
                what = f"{mutate.__name__} (partial: {type(exc).__name__})"
            if progress:
                progress.write(f"case {case} ({key}): {what}\n")
                progress.flush()
            signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    _exercise(str(work), src)
                outcomes["result"] += 1
            except TraceError as exc:
                outcomes["TraceError"] += 1
                if "\n" in str(exc):
                    failures.append((case, key, what, f"multi-line TraceError: {exc!r}"[:300]))
            except _Hang:
                failures.append((case, key, what, f"no answer within {CASE_SECONDS}s"))
            except Exception as exc:  # noqa: BLE001 - this is what the test is looking for
                failures.append((case, key, what, f"{type(exc).__name__}: {exc}"[:300]))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old)
    return failures, outcomes, kinds


def test_fuzz_mutated_traces_end_in_trace_error_or_a_result(seeds, tmp_path):
    """The cases run in a child process, so that a crash inside HDF5 (a segfault cannot be
    caught) fails this test with the case that caused it instead of ending the session."""
    t0 = time.time()
    spec = {"seeds": {k: v[0] for k, v in seeds.items()}, "n": N_CASES, "seed": SEED,
            "work": str(tmp_path / "case.h5")}
    progress = tmp_path / "progress.txt"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    with open(progress, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "tests.test_fuzz", json.dumps(spec)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=fh, text=True,
                              timeout=N_CASES * CASE_SECONDS + 120)
    last = progress.read_text().strip().splitlines()[-1:] or ["(none)"]
    assert proc.returncode == 0, (f"the fuzz process died (exit {proc.returncode}) during "
                                  f"{last[0]}")
    failures, outcomes, kinds = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\nfuzz: {N_CASES} cases in {time.time() - t0:.1f}s, outcomes {outcomes}, "
          f"mutations {kinds}")
    assert not failures, f"{len(failures)} of {N_CASES} cases failed:\n" + "\n".join(
        f"case {c} ({k}, {w}): {e}" for c, k, w, e in failures[:25])
    # the mutations must really exercise both outcomes
    assert outcomes["TraceError"] > N_CASES // 10 and outcomes["result"] > N_CASES // 10


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    seeds = {}
    for key, path in spec["seeds"].items():
        data = open(path, "rb").read()
        # byte flips aimed where the file says something (metadata, tables, strings),
        # not at the unused tail of pre-allocated chunks
        seeds[key] = (path, np.flatnonzero(np.frombuffer(data, dtype=np.uint8)))
    result = run_cases(seeds, spec["n"], spec["seed"], spec["work"], progress=sys.stderr)
    print(json.dumps(result))


@pytest.mark.parametrize("table,col", [("events", "op"), ("events", "source"),
                                       ("values", "dtype"), ("values", "name")])
def test_a_string_index_one_past_the_strings_table_is_refused(seeds, tmp_path, table, col):
    """The last string is index n-1: index n (one past the table) is as dangling as any
    other and must be refused when the trace opens, not read as ""."""
    path = tmp_path / "t.h5"
    shutil.copyfile(seeds["torch"][0], path)
    with h5py.File(path, "r+") as f:
        n = int(f.attrs["committed_strings"])
        rows = f[table][()]
        rows[col][0] = n - 1           # the last string: fine
        f[table][...] = rows
    with tracediff.load(str(path)) as t:
        assert len(t.strings) == n
    with h5py.File(path, "r+") as f:
        rows[col][0] = n
        f[table][...] = rows
    with pytest.raises(TraceError, match=rf"damaged trace \({table}\.{col} refers to a string "
                                         r"that does not exist\)"):
        tracediff.load(str(path))


def _manifest_edits(manifest, depth=3):
    """Every field of the manifest down to `depth`, renamed (a flipped bit in its key) and,
    for sections and lists, replaced by the other kind of container ({} <-> [], also one
    bit each way): (what, edited manifest)."""
    def walk(obj, path):
        if len(path) >= depth or not isinstance(obj, dict):
            return
        for key, value in obj.items():
            yield path + (key,), value
            yield from walk(value, path + (key,))

    for path, value in walk(manifest, ()):
        edits = [("renamed", lambda parent, k: parent.__setitem__(k + "x", parent.pop(k)))]
        if isinstance(value, dict):
            edits.append(("a list", lambda parent, k: parent.__setitem__(k, list(parent[k].values()))))
        elif isinstance(value, list):
            edits.append(("an object", lambda parent, k: parent.__setitem__(
                k, {str(i): v for i, v in enumerate(parent[k])})))
        for what, edit in edits:
            m = json.loads(json.dumps(manifest))
            parent = m
            for k in path[:-1]:
                parent = parent[k]
            edit(parent, path[-1])
            yield f"{'.'.join(path)} {what}", m


def test_every_manifest_field_renamed_or_of_the_other_kind_ends_in_trace_error_or_a_result(
        seeds, tmp_path):
    """What a flipped bit does to the manifest's JSON and stays valid JSON: a key's name
    changes ("captured" -> "capturad" made it look like a framework's section, and the
    environment comparison called .get on a list), or "{}" becomes "[]"."""
    failures, cases = [], 0
    for key, (src, _) in seeds.items():
        with h5py.File(src, "r") as f:
            manifest = json.loads(f["manifest"][()])
        for what, edited in _manifest_edits(manifest):
            if what.startswith(("libraries.", "packages.", "env.")):
                continue   # free-form maps of names: a renamed entry is just another name
            cases += 1
            work = tmp_path / "case.h5"
            shutil.copyfile(src, work)
            with h5py.File(work, "r+") as f:
                del f["manifest"]
                f.create_dataset("manifest", data=json.dumps(edited), dtype=h5py.string_dtype())
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    _exercise(str(work), src)
            except TraceError:
                pass
            except Exception as exc:  # noqa: BLE001 - this is what the test is looking for
                failures.append(f"{key} trace, manifest field {what}: {type(exc).__name__}: {exc}")
    assert cases > 100
    assert not failures, "\n".join(failures)
