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

from .helpers import run_cli, shared_folder
from .test_ranks import (FAULT_LINE, FAULT_RANK, FAULT_STEP, NPROC, _line, _torchrun,
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
    assert first.a.source == _line("x = torch.randn(4, 8, generator=gen)")


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


def test_one_trace_without_devices_has_nothing_to_compare(runs):
    """Nothing replicated to check is said as such, never "CONSISTENT: 0 compared"."""
    r = json.loads(run_cli("replicas", runs["faulty"] / "rank2.h5", "--json").stdout)
    assert r["verdict"] == "nothing_to_compare" and r["checked"] == 0
    assert r["exit_code"] == 0 and "no per-device values" in r["note"]
    shown = run_cli("replicas", runs["faulty"] / "rank2.h5").stdout
    assert "NOTHING TO COMPARE" in shown and "CONSISTENT" not in shown


@pytest.mark.parametrize("case", ["one_rank", "missing", "not_a_trace"])
def test_bad_input_is_a_one_line_error(runs, tmp_path, case):
    target = tmp_path / "run"
    target.mkdir()
    if case == "one_rank":
        shutil.copy(runs["clean"] / "rank0.h5", target)
        shutil.copy(runs["clean"] / "rank1.h5", target / "again.h5")   # rank 1 twice
        shutil.copy(runs["clean"] / "rank1.h5", target)
    elif case == "missing":
        target = tmp_path / "nowhere"
    else:
        (target / "x.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    proc = run_cli("replicas", target)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
