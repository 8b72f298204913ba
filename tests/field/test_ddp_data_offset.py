"""A data bug under torchrun (gloo DDP, 2 ranks): rank 1 reads its batch one row off (its
slice of the shared dataset starts at row 9 instead of 8). `tracediff locate clean/ bad/`
names rank 1, the `aten::slice`, and what changed in it: start 8 vs 9 (not a float64
replay verdict, which means nothing for a slice).

Truth, independent of tracediff: the script's own batch start per rank, printed by each
rank of both runs.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT, require_loopback, run_cli, script_env

import torch  # noqa: E402,F401  (the field suite has torch: never a skip)

SCRIPT = textwrap.dedent('''
    import sys

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data, target = torch.randn(64, 4), torch.randn(64, 1)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = 8
    for step in range(2):
        start = (step * world + rank) * batch
        if "--bug" in sys.argv and rank == 1:
            start += 1                      # the bug: one row off
        print(f"rank {rank} step {step} start {start}", flush=True)
        x, y = data[start:start + batch], target[start:start + batch]
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
''')


def _torchrun(folder, script, out, port, *args):
    require_loopback()
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port),
         "-m", "tracediff", "record", "-o", f"{out}{os.sep}", str(script), *args],
        env=script_env({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}), cwd=ROOT,
        capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp_offset")
    script = folder / "train_ddp.py"
    script.write_text(SCRIPT)
    port = 29600 + os.getpid() % 300
    out = {}
    for name, args in (("clean", ()), ("bad", ("--bug",))):
        proc = _torchrun(folder, script, folder / name, port + (name == "bad"), *args)
        assert proc.returncode == 0, proc.stderr[-4000:]
        out[name] = {(int(r), int(s)): int(v) for r, s, v in
                     re.findall(r"rank (\d) step (\d) start (\d+)", proc.stdout)}
    return folder, out


def test_the_slice_start_of_rank_1_is_shown(runs):
    folder, starts = runs
    # truth: the first (step, rank) whose batch start differs, and its two starts
    (rank, step), = [k for k in sorted(starts["clean"], key=lambda k: (k[1], k[0]))
                     if starts["clean"][k] != starts["bad"][k]][:1]
    a, b = starts["clean"][(rank, step)], starts["bad"][(rank, step)]
    assert (rank, step, a, b) == (1, 0, 8, 9)
    proc = run_cli("locate", "--json", folder / "clean", folder / "bad")
    doc = json.loads(proc.stdout)
    assert doc["first_rank"] == rank
    f = doc["first_beyond_tolerance"]
    assert f["a"]["op"] == "aten::slice.Tensor" and f["a"]["step"] == step
    assert f["a"]["source"].startswith("train_ddp.py:")
    assert {"name": "start", "a": str(a), "b": str(b)} in f["arguments_differ"]
    verdict = doc["explain"]["verdict"]
    assert "closer to the float64" not in verdict and "start 8 vs 9" in verdict
    text = run_cli("locate", folder / "clean", folder / "bad").stdout
    assert "arguments differ: start 8 vs 9" in text
