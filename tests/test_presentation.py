"""Findings a reader trusts at a glance (issue 14, item 5), asserted on what a reader sees:
the verdict names the metric that decided it and never contradicts a shown metric; abs and
rel come first and a ULP count only where it means something; the loss column only for a
value the trace says is the loss; parameter drift as relative L2 beside max abs."""

import importlib.util
import math

import numpy as np
import pytest

from tracediff.diff.explain import steps as _steps
from tracediff.diff.explain import verdict
from tracediff.diff.locate import locate_with_analysis, open_differ
from tracediff.diff.profile import event_profile
from tracediff.diff.result import FromOracle, Oracle, ReplayRun, SideReplay
from tracediff.report import html as html_report
from tracediff.report import markdown
from tracediff.report.context import report_context
from tracediff.report.explain_terminal import print_analysis
from tracediff.report.terminal import print_locate
from tracediff.trace import schema
from tracediff.trace.reader import Trace

from .conftest import BROKEN_DOT, MKL_SSE, TORCH_GRU_STEPS
from .helpers import render_terminal

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (the oldest-JAX CI environment)")



def _renderings(a, b):
    result, analysis = locate_with_analysis(a, b)
    with Trace(a) as ta, Trace(b) as tb:
        profile = event_profile(open_differ(ta, tb)[0])
    ctx = report_context(result)
    return result, analysis, {
        "locate": render_terminal(print_locate, result, width=240),
        "locate -v": render_terminal(print_locate, result, verbose=True, width=240),
        "explain": render_terminal(print_analysis, analysis, width=240),
        "markdown": markdown.render(result, ctx),
        "html": html_report.render(result, ctx, profile)}


@pytest.fixture(scope="module")
def dot(recorded):
    """torch_dot.py plain and with the faulty aten::dot (14.0 vs 0.0; the session's)."""
    a, b = recorded("torch_dot.py"), recorded("torch_dot.py", env=BROKEN_DOT)
    return (a, b, *_renderings(a, b))


@pytest.fixture(scope="module")
def gru(recorded):
    """torch_gru_adam.py plain and with MKL_CBWR=COMPATIBLE (the session's)."""
    args = ("--steps", TORCH_GRU_STEPS)
    a, b = recorded("torch_gru_adam.py", *args), recorded("torch_gru_adam.py", *args, env=MKL_SSE)
    return (a, b, *_renderings(a, b))


# -- the verdict names its metric ------------------------------------------------------------
@needs_torch
def test_verdict_states_the_metric_that_decided_it(gru):
    _, _, result, analysis, out = gru
    rv = analysis.replay
    fa, fb = rv.a.from_oracle, rv.b.from_oracle
    assert rv.closer == ("a" if fa.sum_abs < fb.sum_abs else "b") and rv.closer_by == \
        "total absolute error"
    win, lose = (fa, fb) if rv.closer == "a" else (fb, fa)
    head = (f"{rv.closer} is closer to the float64 result by total absolute error (sum of "
            f"|x - exact| over the elements: {rv.closer} {verdict.fmt(win.sum_abs)}, "
            f"{'b' if rv.closer == 'a' else 'a'} {verdict.fmt(lose.sum_abs)})")
    assert rv.verdict.startswith(head), rv.verdict
    assert head in out["explain"]
    assert head in result.explain.verdict


def _side(sum_abs, max_ulp, max_rel):
    f = FromOracle(max_ulp=max_ulp, max_ulp_exact=max_ulp, mean_ulp_exact=0.5,
                   max_rel=max_rel, sum_abs=sum_abs)
    return SideReplay(op="aten::addmm", replayed=True, reproduced_here=None, from_oracle=f)


def test_a_closer_side_with_the_larger_worst_element_is_worded_so():
    # a's total error is smaller, but its worst element is further off than b's: the
    # verdict must not read as if a were better by every shown metric
    res = ReplayRun(a_index=1, b_index=1, op="aten::addmm", op_b="aten::addmm", verdict="",
                    replayed=True, a=_side(1e-6, 9.0, 2e-6), b=_side(3e-6, 2.0, 5e-7),
                    oracle=Oracle(computed_by="float64", side="a", op="aten::addmm"),
                    closer="a", closer_by=verdict.CLOSER_BY)
    text = verdict._verdict_text(res)
    assert text.startswith("a is closer to the float64 result by total absolute error")
    assert "although a's worst element is further off than b's" in text
    res.a, res.b = _side(1e-6, 2.0, 5e-7), _side(3e-6, 9.0, 2e-6)
    assert "although" not in verdict._verdict_text(res)


# -- abs/rel first, ULP only where it means something ----------------------------------------
@needs_torch
def test_far_apart_values_show_abs_and_rel_not_a_ulp_count(dot):
    _, _, result, _, out = dot
    m = result.first_beyond_tolerance.metrics
    assert m.max_ulp > 1e8 and m.max_rel == 1.0      # 14.0 vs 0.0: a billion ULP, rel 1
    ulp = f"{m.max_ulp:.3g}"
    for name, text in out.items():
        assert ulp not in text and f"{m.max_ulp:,.0f}" not in text, name
    assert "max abs 14  max rel 1  max ulp - (values far apart; see rel)" in out["locate"]
    assert "outputs differ by max abs 14, max rel 1, max ULP - (values far apart; see rel)" \
        in out["explain"]
    assert "| max ULP distance | - (values far apart; see rel) |" in out["markdown"]
    assert "<td>max ULP distance</td><td>- (values far apart; see rel)</td>" in out["html"]


@needs_torch
def test_close_values_keep_their_ulp_count_after_abs_and_rel(gru):
    _, _, result, analysis, out = gru
    m = analysis.origin.metrics
    assert 0 < m.max_rel < 1e-2 and 0 < m.max_ulp < 1e4
    line = next(ln for ln in out["explain"].splitlines() if "outputs differ by" in ln)
    assert line.endswith(f"outputs differ by max abs {verdict.fmt(m.max_abs)}, max rel "
                         f"{verdict.fmt(m.max_rel)}, max ULP {verdict.fmt(m.max_ulp)}"), line


# -- the loss, only where the trace says which value it is -----------------------------------
@needs_torch
def test_torch_loss_is_the_value_passed_to_backward(gru):
    a, _, _, analysis, out = gru
    losses = [s.loss for s in analysis.steps]
    assert len(losses) == int(TORCH_GRU_STEPS) and all(x is not None for x in losses)
    for s in analysis.steps:
        assert s.loss.op == "aten::mse_loss" and s.loss.how == _steps.LOSS_TORCH
        assert s.loss.source.startswith("torch_gru_adam.py:")
    # it is the input of the backward seed of that step
    with Trace(a) as t:
        seed = [i for i in range(len(t.events)) if t.event(i)["op"] == "aten::ones_like"]
        assert [int(t.input_rows(i)["producer"][0]) for i in seed] == [x.event for x in losses]
    assert ("loss = the scalar passed to backward(), aten::mse_loss at torch_gru_adam.py:"
            in out["explain"])


@needs_torch
def test_dot_loss_is_y_passed_to_backward_not_a_column_of_zeros(dot):
    _, _, _, analysis, out = dot
    (row,) = analysis.steps
    assert row.optimizer is None and row.loss.how == _steps.LOSS_TORCH
    assert (row.loss.a, row.loss.b) == (28.0, 0.0)      # y = 2 * dot(x, x): 28 vs 2 * 0
    assert row.loss.op == "aten::mul.Tensor"


def test_jax_loss_is_the_differentiated_functions_value_not_the_last_scalar(jax_gru):
    # the train step computes more scalars after the loss (Adam's bias corrections
    # 1 - beta^t, cast to float32): the last scalar of the step is not the loss
    (a, _), (b, _) = jax_gru["a"], jax_gru["tanh"]
    found = None
    with Trace(a) as t:
        losses = _steps.loss_events(t)
        assert sorted(losses) == [0, 1, 2]
        for s, (ev, how) in losses.items():
            e = t.event(ev)
            assert how == _steps.LOSS_JAX and e["op"] == "real" and "jvp(" in e["name_stack"]
            later = [i for i in range(ev + 1, len(t.events)) if t.event(i)["step"] == s and
                     t.event(i)["kind"] == "eqn" and
                     any(t.string(r["shape"]) == "" for r in t.value_rows(i, schema.ROLE_OUT))]
            assert later     # scalars after it, which the old rule would have taken
            found = ev
        # the value is the loss train_step returned: the call's scalar float64 output
        call = int(t.events["call"][found])
        assert t.event(call)["op"] == "jit:train_step"
        (ret,) = [r for r in t.value_rows(call, schema.ROLE_OUT) if t.string(r["shape"]) == ""
                  and t.string(r["dtype"]) == "float64"]
        returned = float(t.read_value(ret))
    _, analysis = locate_with_analysis(a, b)
    row = analysis.steps[-1]
    assert row.loss is not None and row.loss.op == "real" and row.loss.event == found
    assert row.loss.a == returned


def test_no_loss_column_without_a_loss(recorded):
    # no backward, no value_and_grad: no loss, and no invented loss column
    a = recorded("jax_divide.py")
    with Trace(a) as t:
        assert _steps.loss_events(t) == {}


# -- drift as relative L2 beside max abs ------------------------------------------------------
def _params(path, ev):
    with Trace(path) as t:
        return {t.string(r["name"]): t.read_value(r) for r in t.value_rows(ev, schema.ROLE_OUT)
                if t.string(r["name"]).startswith("params/")}


@needs_torch
def test_parameter_drift_is_relative_l2_beside_max_abs(gru):
    a, b, result, analysis, out = gru
    steps = [s for s in result.optimizer_steps if not s.bitwise_equal]
    assert steps
    for s in steps:
        pa, pb = _params(a, s.a), _params(b, s.b)
        diff = math.sqrt(sum(float(np.sum((pa[k].astype(np.float64) - pb[k]) ** 2)) for k in pa))
        ref = math.sqrt(sum(float(np.sum(pa[k].astype(np.float64) ** 2)) for k in pa))
        assert s.rel_l2 == pytest.approx(diff / ref, rel=1e-9)
        assert s.rel_l2 < s.max_rel      # max rel is set by the near-zero elements
        assert f"relative L2 {verdict.fmt(s.rel_l2)}, max abs {verdict.fmt(s.max_abs)}" in \
            out["locate -v"]
    s0 = steps[0]
    row = next(ln for ln in out["explain"].splitlines() if ln.startswith(f"  {s0.step:>4}  "))
    assert row.split()[1:3] == [verdict.fmt(s0.rel_l2), verdict.fmt(s0.max_abs)], row
    assert "params rel L2   max abs" in out["explain"]
    assert ">relative L2 (parameters)</text>" in out["html"]
    assert f"relative L2 {verdict.fmt(s0.rel_l2)}, max abs {verdict.fmt(s0.max_abs)}</title>" \
        in out["html"]
    assert "| step | bitwise equal | relative L2 | max abs | max rel |" in out["markdown"]


# -- optimizer-internal ops: their optimizer, state and leaf ---------------------------------
@needs_torch
def test_torch_adam_op_is_labelled_with_its_parameter(gru):
    a, _, result, analysis, out = gru
    f = result.first_beyond_tolerance
    assert f.a.op == "aten::addcdiv_"          # Adam's parameter update
    with Trace(a) as t:
        snap = [i for i in range(len(t.events)) if t.event(i)["kind"] == "optim" and
                t.event(i)["step"] == f.a.step][0]
        (out_row,) = t.value_rows(f.a.index, schema.ROLE_OUT)
        (name,) = [t.string(r["name"]) for r in t.value_rows(snap, schema.ROLE_OUT)
                   if r["hash"] == out_row["hash"]]
    assert name.startswith("params/rnn.")
    label = f"torch Adam: {name[len('params/'):]} after the step"
    assert f.optimizer == label
    assert f"  optimizer: {label}" in out["locate"]
    assert f"| optimizer | {label.replace('_', chr(92) + '_')} |" in out["markdown"]
    assert f"(a #{f.a.index}, step {f.a.step}; {label})" in out["explain"]
    # the ops that compute it name the same parameter; the forward's do not
    with Trace(a) as t:
        from tracediff.diff.align import optroles
        (sqrt,) = [i for i in range(f.a.index - 4, f.a.index) if t.event(i)["op"] == "aten::sqrt"]
        assert optroles.op_label(t, sqrt) == (f"torch Adam: in the computation of "
                                              f"{name[len('params/'):]} after the step")
        assert optroles.op_label(t, analysis.origin.a.index) is None   # the GRU's addmm


def test_optax_op_is_labelled_with_its_state_and_leaf(jax_gru):
    from tracediff.diff.align import optroles

    a, _ = jax_gru["a"]
    with Trace(a) as t:
        ev = t.events
        snap = [i for i in range(len(ev)) if t.event(i)["kind"] == "optim"][0]
        (mu,) = [r for r in t.value_rows(snap, schema.ROLE_OUT)
                 if t.string(r["name"]) == "state/mu/Dense_0/kernel"]
        writers = [i for i in range(snap) if t.event(i)["op"] != "name" and
                   any(r["hash"] == mu["hash"] for r in t.value_rows(i, schema.ROLE_OUT))]
        assert writers
        assert optroles.op_label(t, writers[-1]) == "optax: mu of Dense_0/kernel"
        # the bias correction reads mu: named by it
        readers = [i for i in range(writers[-1] + 1, snap) if t.event(i)["op"] == "div" and
                   writers[-1] in t.input_rows(i)["producer"].tolist()]
        assert readers and optroles.op_label(t, readers[0]) == \
            "optax: computed from mu of Dense_0/kernel"
        # the loss, computed before the update, is no optimizer op
        loss, _ = _steps.loss_events(t)[int(t.event(snap)["step"])]
        assert optroles.op_label(t, loss) is None
