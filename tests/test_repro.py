"""`tracediff repro`: standalone scripts that re-run one recorded op with numpy + the framework."""

import os

import numpy as np
import pytest

from tracediff.trace.reader import Trace

from .conftest import BROKEN_DOT
from .helpers import FIXTURES, run_cli, run_plain



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


@pytest.mark.deep   # CI's 'deep' stage: its own recordings
def test_conv_reproducer(recorded, tmp_path):
    """A Flax conv's event: its parameters recorded whole (the dimension numbers in full),
    rebuilt as lax.ConvDimensionNumbers in a script that runs and matches the recording.
    Before: the params were cut ("rhs_spec=(3, 2, , ...") and conv_general_dilated was not
    replayable."""
    t = recorded("flax_cnn_adam.py")
    ev = _index(t, "conv_general_dilated")
    with Trace(t) as tr:
        params = tr.event(ev)["params"]
    assert params.startswith("batch_group_count=1, dimension_numbers=ConvDimensionNumbers("
                             "lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1), out_spec=(0, 3, 1, "
                             "2)), feature_group_count=1, lhs_dilation=(1, 1), ")
    assert params.endswith("rhs_dilation=(1, 1), window_strides=(1, 1)") and "..." not in params
    proc = run_cli("repro", t, ev, "-o", tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "r" / "repro.py").read_text()
    assert "dimension_numbers=lax.ConvDimensionNumbers(lhs_spec=(0, 3, 1, 2)" in script
    run = _run_script(tmp_path / "r")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "output 0: float32[8, 16, 16, 16] sha256" in run.stdout
    assert "recorded in the trace: sha256" in run.stdout and "identical" in run.stdout


# fixtures/port_conv.py --side flax recorded by tracediff before its conv parameters were
# recorded whole (commit 1725247): each value cut at 60 characters, the whole at 240
OLD_CUT_PARAMS = os.path.join(FIXTURES, "traces", "port_conv.flax.cut-params.h5")


def test_an_older_trace_whose_conv_params_were_cut_says_shortened(tmp_path):
    """Before: "not on the list of primitives tracediff replays"."""
    ev = _index(OLD_CUT_PARAMS, "conv_general_dilated")
    with Trace(OLD_CUT_PARAMS) as tr:
        assert "rhs_spec=(3, 2, , feature_group_count" in tr.event(ev)["params"]
    proc = run_cli("explain", OLD_CUT_PARAMS, OLD_CUT_PARAMS, ev, env={"NO_COLOR": "1"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "replay verdict: cannot replay conv_general_dilated: parameters were shortened " \
           "when recorded" in proc.stdout
    proc = run_cli("repro", OLD_CUT_PARAMS, ev, "-o", tmp_path / "x")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "shortened" in proc.stderr
