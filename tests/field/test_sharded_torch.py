"""torch's sharded world, 2 ranks under torchrun (gloo), two Adam steps (issue #36):
FSDP2 (`fully_shard`, tests/field/programs/fsdp2_train.py) and a plain DTensor program
(`distribute_tensor` with `Shard(0)`, dtensor_train.py); `--bad`: rank 1 adds 1e-3 to its
local shard of one weight after step 0. Before: capture stopped at the first DTensor
(".numpy() is not supported for tensor subclasses") and `locate clean/ bad/` said MATCH.

Truth (tests/field/sharded.py): the parameters the program gathers in full after each
step, and its losses, compared between the runs independently of tracediff.

`--bad mul` (issue 51): rank 1 scales its shard in place through the DTensor's local view
(`to_local().mul_(1.001)`); the program prints which rank, parameter and step it wrote.
Before: `explain` named a later collective as the origin and blamed the environment
("hardware"), and gave a view of the values an amplification.
"""

import json
import os
import re

import pytest

from tests.helpers import run_cli

from . import sharded

# program: its port base (one range per program, so both can run at once)
PROGRAMS = {"fsdp2_train.py": 29700, "dtensor_train.py": 29750}


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def runs(request, tmp_path_factory):
    program = request.param
    out = sharded.record_runs(tmp_path_factory.mktemp(program[:-3]), program,
                              PROGRAMS[program] + os.getpid() % 40)
    out["program"] = program
    return out


def test_every_rank_is_recorded_in_full_and_unchanged(runs):
    sharded.check_recorded_in_full(runs)


def test_located_at_rank_1_its_shard_of_the_parameter_step_1(runs):
    truth = sharded.truth(runs, runs["program"])
    assert (truth["rank"], truth["step"]) == (1, 1)     # the construction, as printed
    sharded.check_located(runs, runs["program"])


def test_located_the_same_on_a_dask_cluster(runs):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        sharded.check_located(runs, runs["program"], scheduler=cluster.scheduler_address)


def test_two_clean_runs_match(runs):
    sharded.check_clean_runs_match(runs)


@pytest.fixture(scope="module")
def mul_runs(tmp_path_factory):
    """FSDP2 clean and `--bad mul` (rank 1's `to_local().mul_`), recorded per rank."""
    folder, port = tmp_path_factory.mktemp("fsdp2_mul"), 29800 + os.getpid() % 40
    out = {"dirs": {}, "stdout": {}}
    for i, (name, args) in enumerate((("clean", ()), ("bad", ("--bad", "mul")))):
        proc = sharded.torchrun("fsdp2_train.py", folder / name, port + i, *args)
        out["dirs"][name], out["stdout"][name] = folder / name, proc.stdout
    return out


VIEWS = ("aten::t", "aten::view", "aten::_unsafe_view", "aten::transpose", "aten::reshape",
         "aten::alias", "aten::detach", "aten::expand", "aten::slice", "aten::select",
         "aten::_reshape_alias", "aten::as_strided", "aten::permute")


def _is_view(op):
    return op.split(".")[0] in VIEWS


def test_in_place_mul_on_rank_1s_shard_is_named_with_rank_param_and_step(mul_runs):
    """locate names the `mul_` (not the `to_local()` view), rank 1, `2.weight`'s shard and
    step; explain's origin is that `mul_`, no environment cause, no view amplified."""
    want = sharded.truth(mul_runs, "fsdp2_train.py", marker="# the mul fault")
    printed = re.search(r"fault rank (\d+) param (\S+) step (\d+) op (\S+)",
                        mul_runs["stdout"]["bad"])
    assert printed, mul_runs["stdout"]["bad"][-2000:]
    assert (want["rank"], want["param"], want["step"]) == \
        (int(printed[1]), printed[2], int(printed[3]) + 1) == (1, "2.weight", 1)
    clean, bad = mul_runs["dirs"]["clean"], mul_runs["dirs"]["bad"]

    proc = run_cli("locate", clean, bad, "--json", "--no-explain", "--workers", "1")
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    assert r["first_rank"] == want["rank"]
    first = next(s for s in r["ranks"] if s["rank"] == want["rank"])
    assert first["op"] == "aten::mul_.Tensor", first
    assert (first["param"], first["step"]) == (want["param"], want["step"]), first
    assert first["source"].endswith(want["source"]), first
    assert first["shard"].startswith(f"offset {want['offset']} of {want['global_shape']} "), first

    proc = run_cli("explain", clean, bad, env={"NO_COLOR": "1"})
    assert proc.returncode == 1, proc.stderr
    text = proc.stdout
    assert text.startswith(f"rank {want['rank']}: explaining its pair"), text[:300]
    origin = next(line for line in text.splitlines() if line.startswith("origin:"))
    assert "aten::mul_.Tensor" in origin and f"rank {want['rank']}" in origin, origin
    assert want["source"] in origin, origin
    assert "hardware" not in text
    doc = json.loads(run_cli("explain", clean, bad, "--json").stdout)
    assert doc["rank"] == want["rank"] and doc["verdict"] == "diverged"
    o = doc["origin"]
    assert o["write"] is True and o["b"]["op"] == "aten::mul_.Tensor"
    assert (o["b"]["rank"], o["b"]["step"]) == (want["rank"], want["step"])
    assert doc["environment"]["causes"] == []
    blamed = [op for src in doc["sources"]["sources"] for op, _ in src["ops"]]
    assert "aten::addcdiv_" not in blamed, doc["sources"]   # Adam read what the write left
    for hop in doc["chain"]:
        if _is_view(hop["a"]["op"]):
            assert hop["amplification"] is None and "origin" not in hop["role"], hop
