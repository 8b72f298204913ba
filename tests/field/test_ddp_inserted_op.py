"""An op only one rank runs (issue #27, items 1 and 2): a 4-rank gloo DDP run under
torchrun where rank 2 alone multiplies its local loss by (1 + 1e-6) in step 0
(fixtures/torch_ddp.py `--fault loss`), against the clean run.

Truth, by construction: the multiply exists only on rank 2, on the fixture's
`loss = loss * (1 + 1e-6)` line, before the gradient all-reduce of step 0; every other
rank receives the difference through that all-reduce.
"""

import json
import os

import pytest

from ..helpers import fixture_line, run_cli
from ..test_ranks import _torchrun

NPROC, FAULT_RANK = 4, 2




@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp_loss")
    base = 29400 + os.getpid() % 200 * 2
    procs = [_torchrun(f"{d / 'clean'}{os.sep}", base, nproc=NPROC),
             _torchrun(f"{d / 'bad'}{os.sep}", base + 1, "--fault", "loss", "--fault-rank",
                       str(FAULT_RANK), "--fault-step", "0", nproc=NPROC)]
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-4000:]
    return d / "clean", d / "bad"


def test_the_rank_with_the_extra_op_is_named_first(runs):
    proc = run_cli("locate", *runs, "--json", "--workers", "1", "--no-explain")
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    line = fixture_line("torch_ddp.py", "loss = loss * (1 + 1e-6)")
    assert r["first_rank"] == FAULT_RANK
    st = r["structural"]
    assert st["first"] and st["side"] == "b"
    assert (st["event"]["op"], st["event"]["source"], st["event"]["step"]) == \
        ("aten::mul.Tensor", line, 0)
    assert st["text"] == f"only in b: aten::mul.Tensor at {line}, rank {FAULT_RANK}"
    ranks = {x["rank"]: x for x in r["ranks"]}
    spread = {s["rank"]: s for s in r["spread"]}
    assert sorted(spread) == [x for x in range(NPROC) if x != FAULT_RANK]
    for s in spread.values():   # every other rank received it through step 0's all-reduce
        assert s["via"] == "c10d::allreduce_" and s["step"] == 0
        assert ranks[s["rank"]]["collective"] == ranks[FAULT_RANK]["collective"]
        assert ranks[s["rank"]]["at_collective"]
    out = run_cli("locate", *runs, "--workers", "1", "--no-explain",
                  env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert f"it started on rank {FAULT_RANK}: aten::mul.Tensor step 0" in out.stdout
    assert f"first difference: only in b: aten::mul.Tensor at {line}, rank {FAULT_RANK}" in out.stdout
