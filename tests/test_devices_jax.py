"""JAX per device (issue 13): 8 simulated CPU devices, a fault injected on one device by
the script itself, located by device, step, op and source line; per-device values read
back through `Trace.device_values`."""

import json
import os
import shutil

import numpy as np
import pytest

import tracediff
from tracediff.diff.compare import devices as diff_devices
from tracediff.errors import TraceError

from .helpers import FIXTURES, fixture_line, locate_json, require_loopback, run_cli

EIGHT = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
SCRIPTS = {"sm": "jax_shard_map_pmean.py", "pmap": "jax_pmap.py", "dp": "jax_sharded_dp.py"}




@pytest.fixture(scope="module")
def runs(recorded):
    jobs = {}
    for key, script in SCRIPTS.items():
        jobs[key + "_a"] = (script, (), EIGHT)
        jobs[key + "_b"] = (script, ("--fault",), EIGHT)
    # device 3 scales its copy of the averaged gradient: the replicated weights part
    jobs["sm_after"] = ("jax_shard_map_pmean.py", ("--fault", "after"), EIGHT)
    return recorded.many(jobs)


@pytest.fixture(scope="module")
def reports(runs):
    return {k: locate_json(runs[k + "_a"], runs[k + "_b"]) for k in SCRIPTS}


def test_shard_map_fault_is_named_at_the_op_inside_the_body_with_its_device(reports):
    r = reports["sm"]
    assert r["verdict"] == "diverged" and r["exit_code"] == 1
    for f in (r["first_difference"], r["first_beyond_tolerance"]):
        a = f["a"]
        assert (a["op"], a["device"], a["step"], a["kind"]) == ("mul", "cpu:3", 1, "eqn")
        assert a["source"] == fixture_line("jax_shard_map_pmean.py", 'lax.axis_index("data") == 3')
        assert f["b"]["device"] == "cpu:3"
        assert f["call"]["op"] == "jit:train_step"


def test_shard_map_body_is_recorded_per_device_with_collectives(runs):
    with tracediff.load(runs["sm_a"]) as t:
        assert t.has_devices()
        table = t.events_table()
        body = np.flatnonzero(table["device"] != "")
        assert len(body) and len(body) % 8 == 0
        assert set(table["device"][body]) == {f"cpu:{i}" for i in range(8)}
        # every body event is a child of the shard_map equation, at a line inside the body
        sm = {int(t.events["parent"][i]) for i in body}
        assert {t.event(p)["op"] for p in sm} == {"shard_map"}
        assert all(t.event(i)["source"] != t.event(next(iter(sm)))["source"] for i in body[:8])
        # pmean is a psum across the devices: each device's event reads all 8 inputs and
        # gets the same sum
        psum = [i for i in body if table["op"][i] == "psum"]
        assert len(psum) == 16   # 2 steps x 8 devices
        first = psum[:8]
        assert [t.event(i)["device"] for i in first] == [f"cpu:{k}" for k in range(8)]
        assert len(t.input_rows(first[0])) == 8
        producers = [int(r["producer"]) for r in t.input_rows(first[0])]
        parts = [t.outputs(p)[0] for p in producers]
        outs = [t.outputs(i)[0] for i in first]
        np.testing.assert_allclose(outs[0], np.sum(parts, axis=0), rtol=1e-6)
        assert all(np.array_equal(o, outs[0]) for o in outs)
        dv = t.device_values(first[3])
        assert [(v.device, v.shard, v.replica) for v in dv] == [("cpu:3", "", 0)]
        assert np.array_equal(dv[0].value(), outs[3])
        # the call's replicated result: one copy per device, bitwise equal
        call = int(np.flatnonzero(table["op"] == "jit:train_step")[-1])
        reps = t.device_values(call)
        assert sorted(v.device for v in reps) == sorted(f"cpu:{i}" for i in range(8))
        assert {v.shard for v in reps} == {""} and len({v.digest for v in reps}) == 1
        assert np.array_equal(reps[5].value(), t.outputs(call)[0])


def test_pmap_fault_is_named_on_its_device(reports, runs):
    f = reports["pmap"]["first_beyond_tolerance"]
    a = f["a"]
    assert (a["op"], a["device"], a["kind"], a["origin"]) == ("mul", "cpu:5", "eqn", "replay")
    assert a["source"] == fixture_line("jax_pmap.py", 'lax.axis_index("dev") == 5')
    assert a["step"] == 0   # no optimizer: every event is step 0; the call tells the steps
    with tracediff.load(runs["pmap_a"]) as t:
        calls = [i for i in range(len(t)) if t.event(i)["kind"] == "call"]
        assert len(calls) == 2 and calls[0] < a["index"] and calls[1] == f["call"]["a"]
        # the pmapped step's psum: per device, recorded
        assert {t.event(i)["device"] for i in range(len(t)) if t.event(i)["op"] == "psum"} == \
            {f"cpu:{i}" for i in range(8)}


def test_sharded_data_parallel_fault_in_one_devices_loader(reports, runs):
    f = reports["dp"]["first_difference"]
    a = f["a"]
    # the loader's wrong scale, a literal of the program, converted on device 3 only
    assert (a["op"], a["device"], a["step"]) == ("convert_element_type", "cpu:3", 1)
    assert a["source"] == fixture_line("jax_sharded_dp.py", "blocks.append((xb - 1.0) / scale)")
    assert f["call"]["op"] == "jit:true_divide"
    # the sharded batch the jitted step got: only device 3's block differs
    with tracediff.load(runs["dp_a"]) as ta, tracediff.load(runs["dp_b"]) as tb:
        step1 = [i for i in range(len(ta)) if ta.event(i)["kind"] == "input"
                 and ta.event(i)["step"] == 1 and ta.outputs(i)[0].shape == (16, 4)]
        x = step1[-1]
        da, db = ta.device_values(x), tb.device_values(x)
        assert [v.shard for v in da] == [f"{2 * i}:{2 * i + 2}," for i in range(8)] or \
            [v.shard for v in da] == [f"{2 * i}:{2 * i + 2},:" for i in range(8)]
        differ = [v.device for v, w in zip(da, db) if v.digest != w.digest]
        assert differ == ["cpu:3"]
        whole = tb.outputs(x)[0]
        assert np.array_equal(db[3].value(), whole[6:8])
        assert not np.array_equal(db[3].value(), da[3].value())
        rows, note = diff_devices.spread(ta, tb, x, x)
        assert note == "differs on cpu:3 only (shard 3 of 8)"
        assert [d.device for d in rows if d.differs] == ["cpu:3"]


def test_device_in_show_and_reports(runs, reports, tmp_path):
    a = reports["sm"]["first_beyond_tolerance"]["a"]
    shown = run_cli("show", runs["sm_a"], str(a["index"]))
    assert shown.returncode == 0 and "device: cpu:3" in shown.stdout
    terminal = run_cli("locate", runs["sm_a"], runs["sm_b"])
    assert "device: cpu:3" in terminal.stdout
    for name in ("r.md", "r.html"):   # the report's finding table has a device row
        out = tmp_path / name
        proc = run_cli("report", runs["sm_a"], runs["sm_b"], "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        text = out.read_text()
        assert "device" in text and "cpu:3" in text


# -- `tracediff replicas` on one trace: the per-device copies that must agree

AFTER_LINE = 'return g * (1.0 + after * (lax.axis_index("data") == 3))'


def test_replicas_names_the_device_step_op_and_line_inside_the_body(runs):
    proc = run_cli("replicas", runs["sm_after"], "--json")
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    first = r["first"]
    assert r["verdict"] == "diverged" and r["devices"] == ["cpu:3"] and r["ranks"] == []
    # the op inside the shard_map body that took device 3's copy away from the pmean's
    # result, not the shard_map call around it
    assert (first["device"], first["step"], first["op"]) == ("cpu:3", 1, "mul")
    assert first["source"] == fixture_line("jax_shard_map_pmean.py", AFTER_LINE)
    with tracediff.load(runs["sm_after"]) as t:
        ev = t.event(first["event"])
        assert ev["device"] == "cpu:3" and t.event(ev["parent"])["op"] == "shard_map"
        # its first input is the pmean's result, equal on every device
        pmean = int(t.input_rows(first["event"])[0]["producer"])
        assert t.event(pmean)["op"] == "div" and t.event(pmean)["device"] == "cpu:3"
    shown = run_cli("replicas", runs["sm_after"], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert shown.returncode == 1
    assert ("replicas part on device cpu:3 at mul (forward) step 1  "
            + fixture_line("jax_shard_map_pmean.py", AFTER_LINE)) in shown.stdout


def test_replicas_of_the_clean_run_and_of_a_fault_before_the_pmean_are_consistent(runs):
    for key in ("sm_a", "sm_b"):   # before the pmean: every device gets the same average
        proc = run_cli("replicas", runs[key], "--json")
        assert proc.returncode == 0, proc.stderr
        r = json.loads(proc.stdout)
        assert r["verdict"] == "consistent" and r["first"] is None and r["checked"] >= 16
    shown = run_cli("replicas", runs["sm_a"], env={"NO_COLOR": "1"})
    assert "consistent" in shown.stdout.lower()


def test_locate_names_the_same_device_step_and_line_on_dask(runs, tmp_path):
    """Two runs against each other, each a directory holding its one 8-device trace: the
    pair is one task on a Dask LocalCluster (the per-rank pool of `locate DIR DIR`)."""
    distributed = pytest.importorskip("distributed")
    require_loopback()
    dirs = []
    for key in ("sm_a", "sm_after"):
        d = tmp_path / key
        d.mkdir()
        shutil.copyfile(runs[key], d / "run.h5")
        dirs.append(d)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        proc = run_cli("locate", *dirs, "--json", "--no-explain", "--scheduler",
                       cluster.scheduler_address)
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    a = r["first_difference"]["a"]
    assert (a["device"], a["step"], a["op"]) == ("cpu:3", 1, "mul")
    assert a["source"] == fixture_line("jax_shard_map_pmean.py", AFTER_LINE)
    assert r["ranks"][0]["device"] == "cpu:3"
    # the global value of the call matches; its copy on device 3 does not: the script saw it
    assert "copy on cpu:3 differs" in r["first_beyond_tolerance"]["note"]


def test_spread_names_the_device_of_each_ranks_divergence(runs):
    """Two per-rank results combined as `locate DIR DIR` combines them (the recordings
    are single-process: rank 0 = the fault before the pmean, rank 1 = after it)."""
    from tracediff.diff.distributed import ranks as diff_ranks
    from tracediff.report.ranks import print_ranks
    from rich.console import Console

    opts = {"rtol": None, "atol": None, "ulp": None, "explain": False}
    rr = diff_ranks.combine([diff_ranks.locate_pair(0, runs["sm_a"], runs["sm_b"], opts),
                             diff_ranks.locate_pair(1, runs["sm_a"], runs["sm_after"], opts)])
    assert rr.first_rank == 0 and [s.device for s in rr.ranks] == ["cpu:3", "cpu:3"]
    (sp,) = rr.spread
    assert (sp.rank, sp.device, sp.step, sp.via) == (1, "cpu:3", 1, None)
    assert sp.source == fixture_line("jax_shard_map_pmean.py", AFTER_LINE)
    assert tracediff.to_json(rr)["spread"][0]["device"] == "cpu:3"
    console = Console(record=True, width=200, color_system=None)
    print_ranks(rr, console=console)
    assert "rank 1 on cpu:3 diverged on its own at mul step 1" in console.export_text()


# -- the per-device tables as untrusted input (written by the real writer, edited with h5py)

def _small_trace(path):
    from tracediff.trace.writer import TraceWriter

    w = TraceWriter(str(path), {})
    e = w.add_event(framework=1, kind=2, op="add")
    g = np.arange(16, dtype=np.float32).reshape(8, 2)
    w.add_value(e, 0, g)
    for i in range(4):
        part = g[2 * i:2 * i + 2].copy()
        if i == 3:
            part[0, 0] += 1   # a copy that departs from the global value: its bytes are kept
        w.add_shard(e, 0, part, device=f"cpu:{i}", index=(slice(2 * i, 2 * i + 2), slice(None)),
                    replica=0, whole=g)
    w.add_event(framework=1, kind=1, op="mul", device="cpu:5")
    w.close()
    return g


def test_device_values_round_trip_and_old_traces(tmp_path):
    g = _small_trace(tmp_path / "t.h5")
    with tracediff.load(str(tmp_path / "t.h5")) as t:
        dv = t.device_values(0)
        assert [(v.device, v.shard, v.replica) for v in dv] == \
            [(f"cpu:{i}", f"{2 * i}:{2 * i + 2},:", 0) for i in range(4)]
        assert np.array_equal(dv[1].value(), g[2:4])        # the global value's slice
        assert dv[3].value()[0, 0] == g[6, 0] + 1            # its own bytes
        assert t.event(1)["device"] == "cpu:5" and t.event(0)["device"] == ""
    old = os.path.join(FIXTURES, "traces", "jax_divide.jax-0.7.2.h5")
    with tracediff.load(old) as t:   # written before the tables existed
        assert not t.has_devices() and t.device_values(0) == [] and t.event(0)["device"] == ""


@pytest.mark.parametrize("table,col,value,message", [
    ("devices", "device", 10 ** 6, "devices.device refers to a string"),
    ("shards", "index", 10 ** 6, "shards.index refers to a string"),
    ("shards", "replica", -4, "invalid replica"),
    ("shards", "offset", 10 ** 9, "shard bytes lie outside"),
])
def test_damaged_device_tables_fail_with_one_line(tmp_path, table, col, value, message):
    import h5py

    path = tmp_path / "t.h5"
    _small_trace(path)
    with h5py.File(path, "r+") as f:
        rows = f[table][:]
        rows[-1][col] = value
        f[table][:] = rows
    with pytest.raises(TraceError, match=message):
        tracediff.load(str(path))
    proc = run_cli("show", str(path), "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_damaged_shard_index_or_shape_fails_when_read(tmp_path):
    import h5py

    path = tmp_path / "t.h5"
    _small_trace(path)
    with h5py.File(path, "r+") as f:
        strings = list(f["strings"][:])
        bad = strings.index(b"2:4,:") if b"2:4,:" in strings else None
        assert bad is not None
        f["strings"][bad] = "14:16,:"       # past the global value's end (a SHARD_SLICE row)
    with tracediff.load(str(path)) as t:
        dv = t.device_values(0)
        with pytest.raises(TraceError, match="outside a value of shape"):
            dv[1].value()


@pytest.mark.parametrize("index,message", [
    ("2:99,:", r"shard index '2:99,:' does not match the shard's shape \(2, 2\)"),
    ("0:99999999999999999999999,:", r"shard index '0:99999999999999999999999,:' is not "
                                    r"start:stop per dimension \(at most 18 digits each\)"),
    ("0:2;rm,:", "shard index .* is not start:stop per dimension"),
    ("\u0661:\u0663,:", "shard index .* is not start:stop per dimension"),   # not ASCII digits
])
def test_a_malformed_shard_index_is_refused_when_the_trace_opens(tmp_path, index, message):
    import h5py

    path = tmp_path / "t.h5"
    _small_trace(path)
    with h5py.File(path, "r+") as f:
        strings = list(f["strings"][:])
        f["strings"][strings.index(b"2:4,:")] = index
    with pytest.raises(TraceError, match=r"t\.h5: damaged trace \(shards: " + message):
        tracediff.load(str(path))


def test_a_malformed_shard_index_in_b_never_hides_a_divergence(runs, tmp_path):
    """Device 3's copy of the replicated weights departs after the pmean (sm_after): b's
    rows of that copy given the index `0:99999999999999999999999,:` paired with nothing
    in a, and locate said MATCH (exit 0) with no warning. The trace is refused instead
    (one line, exit 2); unedited, the divergence is found."""
    import h5py

    assert locate_json(runs["sm_a"], runs["sm_after"])["verdict"] == "diverged"
    bad = tmp_path / "b.h5"
    shutil.copyfile(runs["sm_after"], bad)
    with h5py.File(bad, "r+") as f:
        n = int(f.attrs["committed_strings"])
        cpu3 = [s.decode() if isinstance(s, bytes) else s for s in f["strings"][:n]].index("cpu:3")
        f["strings"].resize((n + 1,))
        f["strings"][n] = "0:99999999999999999999999,:"
        f.attrs["committed_strings"] = n + 1
        sh = f["shards"][()]
        assert (sh["device"] == cpu3).any()
        sh["index"][sh["device"] == cpu3] = n
        f["shards"][...] = sh
    proc = run_cli("locate", runs["sm_a"], bad)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[:2000]
    assert proc.stderr == (f"tracediff: error: {bad}: damaged trace (shards: shard index "
                           f"'0:99999999999999999999999,:' is not start:stop per dimension "
                           f"(at most 18 digits each))\n")


def test_an_open_shard_index_on_a_smaller_shard_is_refused(runs, tmp_path):
    """Every shard index of b rewritten to `:,:` (parseable; read as the whole value) made a
    diverging pair MATCH: each device's smaller shard stood for the global value. A shard
    whose open index parts do not reach across the global value is refused (exit 2)."""
    import h5py

    bad = tmp_path / "b.h5"
    shutil.copyfile(runs["sm_after"], bad)
    with h5py.File(bad, "r+") as f:
        n = int(f.attrs["committed_strings"])
        f["strings"].resize((n + 1,))
        f["strings"][n] = ":,:"
        f.attrs["committed_strings"] = n + 1
        sh = f["shards"][()]
        strings = [x.decode() if isinstance(x, bytes) else x for x in f["strings"][:n]]
        partial = [i for i, x in enumerate(strings) if x and x[0].isdigit() and ":" in x]
        assert np.isin(sh["index"], partial).any()     # the premise: real partial shards
        sh["index"][:] = n
        f["shards"][...] = sh
    proc = run_cli("locate", runs["sm_a"], bad)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[:2000]
    assert "damaged trace (shards: shard index ':,:' does not match the shard's shape" in \
        proc.stderr and "in a value of shape" in proc.stderr


def test_long_shard_index_strings_are_refused_before_they_are_parsed(tmp_path):
    """2,000 shard rows whose index holds a 4,000-digit number made `show` take 79 s; the
    length is bounded before any digit is read: the trace is refused at once."""
    import h5py

    from tracediff.trace import values

    with pytest.raises(ValueError, match="shard index of 4,004 characters, longer than"):
        values.parse_shard_index("0:" + "9" * 4000 + ",:", (8, 2))
    path = tmp_path / "long.h5"
    _small_trace(path)
    with h5py.File(path, "r+") as f:
        n = int(f.attrs["committed_strings"])
        f["strings"].resize((n + 2000,))
        f["strings"][n:] = np.array([f"0:{k}{'9' * 4000},:" for k in range(2000)], dtype=object)
        f.attrs["committed_strings"] = n + 2000
        sh = f["shards"][()]
        rows = np.resize(sh, 2000)
        rows["index"] = np.arange(n, n + 2000)
        del f["shards"]
        f.create_dataset("shards", data=rows, maxshape=(None,), chunks=True)
        f.attrs["committed_shards"] = 2000
    proc = run_cli("show", path, "0")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"tracediff: error: {path}: damaged trace (shards: shard index "
                                  f"of 4,00") and proc.stderr.count("\n") == 1


def test_multi_process_manifest_section():
    """jax.distributed cannot be started cheaply here: the manifest section is checked on
    its own (a launcher's rank is kept; JAX's process index fills what is missing)."""
    from tracediff.capture.jax.devices import merge_distributed

    assert merge_distributed(None, 0, 1, ["cpu:0"]) is None
    d = merge_distributed(None, 1, 2, ["cpu:4", "cpu:5"])
    assert d == {"rank": 1, "world_size": 2, "backend": "jax.distributed", "process_index": 1,
                 "process_count": 2, "local_devices": ["cpu:4", "cpu:5"]}
    launcher = {"rank": 1, "local_rank": None, "world_size": 2, "launcher": "jax"}
    d = merge_distributed(launcher, 1, 2, [])
    assert d["launcher"] == "jax" and d["rank"] == 1 and d["process_count"] == 2


def test_a_replica_that_departed_is_named_though_the_global_values_match(tmp_path):
    """Replicated weights whose copy on one device differs (a bad transfer to one chip):
    the global value (replica 0) is equal in both runs, the copies are not."""
    from tracediff.trace.writer import TraceWriter

    w0 = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    for name, bad in (("a.h5", False), ("b.h5", True)):
        w = TraceWriter(str(tmp_path / name), {})
        e = w.add_event(framework=1, kind=5, op="input", step=2)
        w.add_value(e, 0, w0)
        for i in range(4):
            copy = w0.copy()
            if bad and i == 2:
                copy[1, 1] = np.nextafter(copy[1, 1], np.float32(2))
            w.add_shard(e, 0, copy, device=f"cpu:{i}", index=(), replica=i, whole=w0)
        w.close()
    r = locate_json(str(tmp_path / "a.h5"), str(tmp_path / "b.h5"))
    assert r["verdict"] == "match"
    assert any("cpu:2 (replica 2) differs" in w and "event #0" in w for w in r["warnings"])
    with tracediff.load(str(tmp_path / "b.h5")) as t:
        dv = t.device_values(0)
        assert [v.replica for v in dv] == [0, 1, 2, 3]
        assert len({v.digest for v in dv}) == 2
        assert dv[2].value()[1, 1] != w0[1, 1] and np.array_equal(dv[1].value(), w0)
