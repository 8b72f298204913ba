"""torch's sharded world, 2 ranks under torchrun (gloo), two Adam steps (issue #36):
FSDP2 (`fully_shard`, tests/field/programs/fsdp2_train.py) and a plain DTensor program
(`distribute_tensor` with `Shard(0)`, dtensor_train.py); `--bad`: rank 1 adds 1e-3 to its
local shard of one weight after step 0. Before: capture stopped at the first DTensor
(".numpy() is not supported for tensor subclasses") and `locate clean/ bad/` said MATCH.

Truth (tests/field/sharded.py): the parameters the program gathers in full after each
step, and its losses, compared between the runs independently of tracediff.
"""

import os

import pytest

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
