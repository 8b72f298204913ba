"""Where a NaN came from (`tracediff info`), on programs whose truth is taken without
tracediff:

- fixtures/torch_nonfinite.py and fixtures/jax_nonfinite.py, four cases each (a forward
  NaN from a drifting log or sqrt, an Inf that appears only in backward, a float16
  overflow, Adam with eps = 0 on a zero gradient; JAX also a gradient transform of the
  program's own dividing by a zero gradient's norm), recorded at `--level full` and
  `--level stats` (JAX also with `--jax-values compiled`, the accelerators' default).
  Truth: tests/nonfinite_truth.py, a TorchDispatchMode checking every aten op, and
  `jax_debug_nans` + `jax_debug_infs`, which stop JAX at the first primitive that made one.
- programs/nan_devices.py: shard_map over 8 simulated devices, device 3's block of the
  batch negative under a log. Truth: the batch itself (numpy), saved by the program.
- programs/nan_ddp.py under torchrun (gloo, 2 ranks): rank 1's batch holds a negative
  value. Truth: each rank prints whether its own loss is finite before the all-reduce.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from ..helpers import FIXTURES, ROOT, require_loopback, run_cli, script_env

PROGRAMS = os.path.join(os.path.dirname(__file__), "programs")
CASES = [("torch_nonfinite.py", c) for c in ("log", "norm", "half", "adam")] + \
    [("jax_nonfinite.py", c) for c in ("sqrt", "norm", "half", "adam", "rms")]
LEVELS = {"full": [], "stats": ["--level", "stats"], "compiled": ["--jax-values", "compiled"]}
# what the words must say, per case: the mechanism a reader acts on
WORDS = {"log": "log of a negative number", "sqrt": "square root of a negative number",
         "norm": "division by zero", "half": "float16", "adam": "0 / 0", "rms": "rsqrt of zero"}


def _truth(folder, script, *args):
    out = folder / f"truth-{os.path.basename(script)}-{'-'.join(args)}.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "nonfinite_truth.py"),
                           str(out), script, *args], env=script_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def truths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nonfinite_truth")
    return {(s, c): _truth(folder, os.path.join(FIXTURES, s), "--case", c) for s, c in CASES}


def _info(path):
    return json.loads(run_cli("info", "--json", path, check=True).stdout)["first_nonfinite"]


@pytest.mark.parametrize("script,case,level", [
    (s, c, lv) for s, c in CASES for lv in sorted(LEVELS) if s.startswith("jax") or lv != "compiled"])
def test_the_origin_is_the_truths_op_step_and_phase(recorded, truths, script, case, level):
    nf = _info(str(recorded(script, "--case", case, options=LEVELS[level])))
    truth = truths[(script, case)]
    assert (nf["op"], nf["step"], nf["kind"]) == (truth["op"], truth["step"], truth["made"])
    if "phase" in truth:      # JAX's debug_nans names no phase
        assert nf["phase"] == truth["phase"]
    assert nf["inputs_finite"] is True and nf["kept"] is True
    assert WORDS[case] in nf["mechanism"] or WORDS[case] in nf["nan_mechanism"]
    assert nf["level"] == ("statistics" if level == "stats" else "values")
    if case == "adam":
        assert "eps is 0.0" in nf["mechanism"]


def test_the_device_whose_block_made_the_nan(tmp_path):
    batch = tmp_path / "batch.npy"
    trace = tmp_path / "devices.h5"
    run_cli("record", "-o", trace, os.path.join(PROGRAMS, "nan_devices.py"),
            env={"BATCH_OUT": str(batch)}, check=True)
    x = np.load(batch)                     # truth: the device whose rows are negative
    (device,) = set((np.flatnonzero((x < 0).any(axis=1)) // (len(x) // 8)).tolist())
    nf = _info(str(trace))
    assert (nf["op"], nf["device"], nf["step"]) == ("log", f"cpu:{device}", 0)
    assert nf["mechanism"] == f"log of a negative number: input min {x.min():.4g}"


def test_the_rank_it_started_on(tmp_path):
    require_loopback()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(29300 + os.getpid() % 300),
         "-m", "tracediff", "record", "-o", f"{tmp_path / 'run'}{os.sep}",
         os.path.join(PROGRAMS, "nan_ddp.py")],
        env=script_env({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}), cwd=ROOT,
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    finite = {int(r): v == "True" for r, v in
              re.findall(r"rank (\d) step 0 loss finite (\w+)", proc.stdout)}
    (first,) = [r for r, ok in finite.items() if not ok]      # truth: its own loss
    data = json.loads(run_cli("info", "--json", tmp_path / "run", check=True).stdout)
    assert data["first_rank"] == first
    mine = data["ranks"][str(first)]["first_nonfinite"]
    assert (mine["op"], mine["phase"], mine["step"], mine["received"]) == \
        ("aten::log", "forward", 0, False)
    other = data["ranks"][str(1 - first)]["first_nonfinite"]
    assert other["op"].startswith("c10d::allreduce") and other["received"] is True
    text = run_cli("info", tmp_path / "run", check=True).stdout
    assert f"non-finite values start on rank {first}" in text
