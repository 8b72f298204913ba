"""`tracediff repro`: standalone scripts that re-run one recorded op with numpy + the framework."""

import os

import numpy as np
import pytest

from tracediff.trace.reader import Trace

from .conftest import BROKEN_DOT
from .helpers import run_cli, run_plain



def _run_script(folder):
    """Run the reproducer as `python FOLDER/repro.py` from another folder (a warm
    interpreter where the tests have one: tests/helpers.run_plain)."""
    return run_plain(os.path.join(folder, "repro.py"), cwd="/", check=False)


def _index(trace, op):
    with Trace(trace) as t:
        return next(i for i in range(len(t)) if t.event(i)["op"] == op)


@pytest.fixture(scope="module")
def dots(recorded):
    return recorded("torch_dot.py"), recorded("torch_dot.py", env=BROKEN_DOT)


def test_torch_dot_reproducer(dots, tmp_path):
    a, b = dots
    ev = _index(a, "aten::dot")
    for trace, folder, same in ((a, tmp_path / "ra", True), (b, tmp_path / "rb", False)):
        proc = run_cli("repro", trace, ev, "-o", folder)
        assert proc.returncode == 0, proc.stderr
        data = np.load(folder / "inputs.npz", allow_pickle=False)
        assert data["in0"].tolist() == [0, 1, 2, 3] and "recorded0" in data.files
        run = _run_script(folder)
        assert "output 0: float32[] sha256" in run.stdout, run.stderr
        assert "14." in run.stdout   # this machine computes the right dot
        assert ("identical" if same else "DIFFERENT") in run.stdout
        assert run.returncode == (0 if same else 1)
        assert "tracediff" not in open(folder / "repro.py").read().split('"""', 2)[2]


def test_jax_primitive_reproducer(recorded, tmp_path):
    t = recorded("flax_dense.py", "--mlp", "--jit")
    ev = _index(t, "tanh")
    proc = run_cli("repro", t, ev, "-o", tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    run = _run_script(tmp_path / "r")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "identical" in run.stdout and "sha256" in run.stdout
    # relu is `max x 0.0`: the literal 0.0 is stored with the equation, so it replays too
    ev = _index(t, "max")
    with Trace(t) as tr:
        assert any(int(r["producer"]) == -2 for r in tr.input_rows(ev))
    proc = run_cli("repro", t, ev, "-o", tmp_path / "relu")
    assert proc.returncode == 0, proc.stderr
    data = np.load(tmp_path / "relu" / "inputs.npz", allow_pickle=False)
    assert data["in1"].shape == () and float(data["in1"]) == 0.0
    run = _run_script(tmp_path / "relu")
    assert run.returncode == 0 and "identical" in run.stdout, run.stdout + run.stderr


def test_not_an_op_or_not_replayable_is_one_line(dots, tmp_path):
    a, _ = dots
    proc = run_cli("repro", a, 999, "-o", tmp_path / "x")
    assert proc.returncode == 2 and "no event 999" in proc.stderr
    ev = _index(a, "aten::arange")
    proc = run_cli("repro", a, ev, "-o", tmp_path / "x")
    assert proc.returncode == 2 and "cannot write a reproducer" in proc.stderr
