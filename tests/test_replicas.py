"""`tracediff replicas`: one run, no reference. The faulty 3-rank DDP run of
test_ranks.py (rank 2's gradient scaled after the all-reduce, in step 0) is named by
rank, step, op and line from its own traces; the clean run is consistent. Recorded once
per session (`test_ranks.record_ddp_runs`). A run where rank 0 itself departs is recorded
here, with a file name for `-o` (one NAME.rank{R}.h5 per rank)."""

import json
import os
import shutil

import pytest

import tracediff

from .helpers import fixture_line, run_cli, shared_folder
from .test_ranks import (FAULT_LINE, FAULT_RANK, FAULT_STEP, NPROC, _torchrun,
                         record_ddp_runs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return record_ddp_runs(shared_folder(tmp_path_factory, "ddp"))


def test_faulty_run_names_rank_step_op_and_line(runs):
    proc = run_cli("replicas", runs["faulty"], "--json", "--workers", "1")
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    assert r["verdict"] == "diverged" and r["exit_code"] == 1
    first = r["first"]
    assert (first["rank"], first["step"], first["op"], first["source"]) == \
        (FAULT_RANK, FAULT_STEP, "aten::mul_.Tensor", FAULT_LINE)
    assert first["device"] == "" and r["departed"] == [FAULT_RANK]
    assert r["ranks"] == list(range(NPROC)) and r["reference_rank"] == 0


@pytest.fixture(scope="module")
def rank0_departs(tmp_path_factory):
    """3 ranks, 1 step, rank 0's gradient scaled after the all-reduce: the reference rank
    itself departs (the smallest run where a majority can tell; ~20 s of CPU). Recorded
    with `-o run.h5`, a file name: each rank writes run.rank{R}.h5 beside it."""
    out = tmp_path_factory.mktemp("rank0")
    proc = _torchrun(out / "run.h5", 28100 + os.getpid() % 500, "--steps", "1", "--fault-rank",
                     "0", "--fault-step", "0", nproc=3)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return out


def test_torchrun_with_a_file_name_writes_one_trace_per_rank_beside_it(rank0_departs):
    """`-o run.h5` under torchrun: no run.h5, one complete run.rank{R}.h5 per rank; two
    ranks of one run run the same program, so every op pairs and the first difference is
    each rank's own data, named at its line."""
    assert sorted(os.listdir(rank0_departs)) == [f"run.rank{r}.h5" for r in range(3)]
    for r in range(3):
        with tracediff.load(rank0_departs / f"run.rank{r}.h5") as t:
            assert t.complete and len(t) > 0 and t.rank == r
            assert t.manifest["distributed"]["world_size"] == 3
    a, b = rank0_departs / "run.rank0.h5", rank0_departs / "run.rank1.h5"
    result = tracediff.locate(a, b)
    with tracediff.load(a) as t:
        assert result.alignment["matched"] == len(t)
    first = result.first_difference
    assert first.a.op == first.b.op == "aten::randn.generator" and first.inputs_match
    assert first.a.source == fixture_line("torch_ddp.py", "x = torch.randn(4, 8, generator=gen)")


def test_rank_0_departing_is_named_by_the_majority(rank0_departs):
    proc = run_cli("replicas", rank0_departs, "--json", "--workers", "1")
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    first = r["first"]
    assert (first["rank"], first["step"], first["op"], first["source"]) == \
        (0, 0, "aten::mul_.Tensor", FAULT_LINE)
    assert r["departed"] == [0] and r["ranks"] == [0, 1, 2] and r["note"] in ("", None)
    shown = run_cli("replicas", rank0_departs, "--workers", "1", env={"NO_COLOR": "1"})
    assert f"replicas part on rank 0 at aten::mul_.Tensor (forward) step 0  {FAULT_LINE}" \
        in shown.stdout


def test_clean_run_is_consistent(runs):
    proc = run_cli("replicas", runs["clean"], "--json", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["verdict"] == "consistent" and r["first"] is None
    assert r["checked"] > 20   # the all-reduce results, the copies into .grad, ...


def test_terminal_output(runs):
    proc = run_cli("replicas", runs["faulty"], "--workers", "1", env={"NO_COLOR": "1"})
    assert proc.returncode == 1
    assert (f"replicas part on rank {FAULT_RANK} at aten::mul_.Tensor (forward) step "
            f"{FAULT_STEP}  {FAULT_LINE}") in proc.stdout


def test_one_trace_without_devices_is_nothing_to_compare(runs):
    """Nothing compared is never CONSISTENT (it said so, exit 0): "nothing_to_compare", exit 2."""
    proc = run_cli("replicas", runs["faulty"] / "rank2.h5", "--json")
    assert proc.returncode == 2, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["verdict"], r["exit_code"], r["checked"]) == ("nothing_to_compare", 2, 0)
    assert r["note"].startswith("no per-device values in this trace")
    shown = run_cli("replicas", runs["faulty"] / "rank2.h5", env={"NO_COLOR": "1"})
    assert shown.returncode == 2 and "CONSISTENT" not in shown.stdout
    assert shown.stdout.startswith("NOTHING TO COMPARE: no replicated value across the devices "
                                   "of one trace; nothing was checked")


def _edit_manifest(path, **dist):
    import h5py

    os.chmod(path, 0o644)
    with h5py.File(path, "r+") as f:
        m = json.loads(f["manifest"][()])
        m["distributed"].update(dist)
        del f["manifest"]
        f.create_dataset("manifest", data=json.dumps(m), dtype=h5py.string_dtype())


def test_mixed_world_sizes_or_a_missing_rank_are_refused(runs, tmp_path):
    """Traces that are not every rank of one run said "CONSISTENT: 0 replicated values
    compared across 3 ranks" (exit 0); now one line and exit 2."""
    gap = tmp_path / "gap"
    gap.mkdir()
    for r in (0, 2):
        shutil.copy(runs["clean"] / f"rank{r}.h5", gap)
    proc = run_cli("replicas", gap, "--workers", "1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"tracediff: error: {gap}: the traces are of a 3-rank run but rank 1 "
                           f"is missing (it holds ranks 0, 2); replicas compares every rank of "
                           f"one run\n")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for r in range(NPROC):
        shutil.copy(runs["clean"] / f"rank{r}.h5", mixed)
    _edit_manifest(mixed / "rank2.h5", world_size=4)     # rank 2 of a 4-rank run
    proc = run_cli("replicas", mixed, "--workers", "1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"tracediff: error: {mixed / 'rank2.h5'}: a run of world size 4 "
                           f"beside rank 0's trace of world size 3 ({mixed / 'rank0.h5'}): these "
                           f"traces are not the ranks of one run; put each run's per-rank traces "
                           f"in their own directory\n")


def test_ranks_without_a_replicated_collective_are_nothing_to_compare(runs, tmp_path):
    """The clean run with its collectives renamed (nothing is replicated by definition):
    "nothing_to_compare", exit 2, saying why."""
    import h5py

    run = tmp_path / "run"
    run.mkdir()
    for r in range(NPROC):
        shutil.copy(runs["clean"] / f"rank{r}.h5", run)
        path = run / f"rank{r}.h5"
        os.chmod(path, 0o644)
        with h5py.File(path, "r+") as f:
            n = int(f.attrs["committed_strings"])
            for i, s in enumerate(f["strings"][:n]):
                s = s.decode() if isinstance(s, bytes) else s
                if s.startswith("c10d::"):
                    f["strings"][i] = "x10d::" + s[6:]
    proc = run_cli("replicas", run, "--json", "--workers", "1")
    assert proc.returncode == 2, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["verdict"], r["checked"], r["ranks"]) == ("nothing_to_compare", 0, [0, 1, 2])
    assert r["note"] == ("no replicated value in these 3 ranks' traces: no replicated collective "
                         "(all-reduce, broadcast, all-gather) in rank 0's trace and no per-device "
                         "values")


def test_the_device_that_departs_is_the_one_against_the_majority(tmp_path):
    """Four replicas of one value, the first (cpu:0) departs: the majority of three names
    cpu:0, not the copies that agree (a vote, not "differs from the first copy")."""
    import numpy as np

    from tracediff.diff.distributed.replicas import _minority, check_devices
    from tracediff.trace.writer import TraceWriter

    w0 = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    path = tmp_path / "t.h5"
    w = TraceWriter(str(path), {})
    e = w.add_event(framework=1, kind=5, op="input", step=1)
    w.add_value(e, 0, w0)
    for i in range(4):
        copy = w0.copy()
        if i == 0:
            copy[0, 0] = np.nextafter(copy[0, 0], np.float32(2))
        w.add_shard(e, 0, copy, device=f"cpu:{i}", index=(), replica=i, whole=w0)
    w.close()
    r = check_devices(str(path))
    assert (r.verdict, r.devices, r.first.device, r.checked) == ("diverged", ["cpu:0"], "cpu:0", 1)
    assert _minority(["b", "a", "a"]) == 0 and _minority(["a", "a", "b", "a"]) == 2
    assert _minority(["a", "b"]) == 1 and _minority(["a", "a"]) is None


@pytest.mark.parametrize("case", ["one_rank", "missing", "not_a_trace"])
def test_bad_input_is_a_one_line_error(runs, tmp_path, case):
    target = tmp_path / "run"
    target.mkdir()
    if case == "one_rank":
        shutil.copy(runs["clean"] / "rank0.h5", target)
        shutil.copyfile(runs["clean"] / "rank1.h5", target / "again.h5")   # rank 1 twice
        shutil.copy(runs["clean"] / "rank1.h5", target)
    elif case == "missing":
        target = tmp_path / "nowhere"
    else:
        (target / "x.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    proc = run_cli("replicas", target)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """2 ranks, 1 step, rank 1's gradient scaled after the all-reduce (~10 s)."""
    out = tmp_path_factory.mktemp("two_ranks")
    proc = _torchrun(f"{out}{os.sep}", 27600 + os.getpid() % 500, "--steps", "1",
                     "--fault-rank", "1", "--fault-step", "0", nproc=2)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return out


def test_two_ranks_name_the_other_rank_never_the_reference(two_ranks):
    """With two ranks there is no majority: the reference (rank 0) is never blamed, the
    other rank is named and the note says which one departed cannot be told (a single
    other rank trivially "agreed with the others" and the reference was named)."""
    proc = run_cli("replicas", two_ranks, "--json", "--workers", "1")
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    first = r["first"]
    assert (first["rank"], first["step"], first["op"], first["source"]) == \
        (1, 0, "aten::mul_.Tensor", FAULT_LINE)
    assert r["departed"] == [1] and r["ranks"] == [0, 1] and r["reference_rank"] == 0
    assert r["note"] == "two ranks: which one departed cannot be told; rank 1 is named " \
                        "against rank 0"
