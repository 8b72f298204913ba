"""Issue 14 item 5: the per-step table names the worst parameter by its own relative L2
(||a-b|| / ||a|| of that tensor, not max rel, which near-zero elements decide), and an op
recorded inside library code carries both the library frame and the user's frame."""

import numpy as np
import pytest

import tracediff
from tracediff.trace import schema

from .conftest import MKL_SSE, TORCH_GRU_STEPS
from .helpers import render_terminal


@pytest.fixture(scope="module")
def gru_steps(recorded):
    args = ("--steps", TORCH_GRU_STEPS)
    a, b = recorded("torch_gru_adam.py", *args), recorded("torch_gru_adam.py", *args, env=MKL_SSE)
    return a, b, tracediff.locate(a, b, explain=False)


def _params(t, eid):
    """{name: array} of the parameters an optimizer snapshot stored."""
    out = {}
    for r in t.value_rows(eid, schema.ROLE_OUT):
        name = t.string(r["name"]) if r["name"] >= 0 else ""
        if name.startswith("params/"):
            out[name] = np.asarray(t.read_value(r), np.float64)
    return out


def test_worst_parameter_is_chosen_by_its_own_relative_l2(gru_steps):
    a, b, r = gru_steps
    diff = [s for s in r.optimizer_steps if not s.bitwise_equal]
    assert diff, "MKL_CBWR=COMPATIBLE changes the GRU's parameters"
    with tracediff.load(a) as ta, tracediff.load(b) as tb:
        for s in diff:
            pa, pb = _params(ta, s.a), _params(tb, s.b)
            rel = {k: np.linalg.norm(pa[k] - pb[k]) / np.linalg.norm(pa[k]) for k in pa}
            worst = max(rel, key=rel.get)
            assert s.worst == worst
            assert s.worst_rel_l2 == pytest.approx(rel[worst], rel=1e-9)
            assert s.worst_max_abs == pytest.approx(np.max(np.abs(pa[worst] - pb[worst])), rel=1e-9)
            # the step's figures over all parameters stay beside it
            assert s.max_abs == pytest.approx(max(np.max(np.abs(pa[k] - pb[k])) for k in pa))
            total = np.sqrt(sum(np.sum((pa[k] - pb[k]) ** 2) for k in pa) /
                            sum(np.sum(pa[k] ** 2) for k in pa))
            assert s.rel_l2 == pytest.approx(total, rel=1e-9)
    js = tracediff.to_json(r)["optimizer_steps"]
    s0 = diff[0]
    row = next(x for x in js if x["step"] == s0.step)
    assert row["worst"] == s0.worst and row["worst_rel_l2"] == s0.worst_rel_l2
    assert row["worst_max_abs"] == s0.worst_max_abs


def test_reports_show_the_worst_tensor_relative_l2(gru_steps):
    from tracediff.report import html, markdown, terminal

    _, _, r = gru_steps
    s0 = next(s for s in r.optimizer_steps if not s.bitwise_equal)
    from tracediff.report.common import fmt

    md = markdown.render(r)
    assert "worst parameter (relative L2)" in md
    assert f"`{s0.worst}` ({fmt(s0.worst_rel_l2)}, max abs {fmt(s0.worst_max_abs)})" in md
    page = html.render(r)
    assert "worst parameter (relative L2)" in page
    text = render_terminal(terminal.print_locate, r, verbose=True)
    assert f"{s0.worst} (relative L2 {terminal._fmt(s0.worst_rel_l2)}" in text
