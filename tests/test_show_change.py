"""A finding shows what changed, and rounding noise around zero is no headline.

Two small torch programs, each recorded twice in this process (real ops, real optimizer):

* a training loop that reads its batches by slicing one dataset tensor, where the second
  run reads step 1's batch one row off (the data bug of a rank that starts at row 9
  instead of 8): the finding is the slice, names its arguments (start 8 vs 9), and gives
  no "closer to float64" verdict for an op that rounds nothing;
* an AdamW step on a parameter whose gradient is mathematically zero (a per-feature
  shift removed again by subtracting the batch mean), where the second run scales the
  input by 1 + 2**-20: the gradient is rounding noise (~1e-9) in both runs, AdamW's
  `addcdiv_` divides it by something as small and lands ~4e-4 apart. Truth, by numpy: the
  gradient is zero to within the rounding of the values that produced it; the first
  op that differs is the scaling multiply. That is the headline; the addcdiv_ is shown as
  noise.
"""

import json

import numpy as np
import pytest

import tracediff
from tracediff.diff.locate import locate
from tracediff.report import html as html_report
from tracediff.report import markdown
from tracediff.report.context import report_context
from tracediff.report.json_report import build
from tracediff.report.terminal import print_locate

from .helpers import line_in, render_terminal

torch = pytest.importorskip("torch")

BATCH = 8


def _train_sliced(offset):
    torch.manual_seed(0)
    data, target = torch.randn(32, 4), torch.randn(32, 1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        start = BATCH * step + (offset if step == 1 else 0)
        x = data[start:start + BATCH]   # SLICE_LINE
        y = target[start:start + BATCH]
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


class Centered(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.fc = torch.nn.Linear(8, 8)
        self.shift = torch.nn.Parameter(torch.zeros(8))

    def forward(self, x):
        h = self.fc(x * self.scale)   # SCALE_LINE
        h = h + self.shift
        h = h - h.mean(dim=0, keepdim=True)   # the shift cancels: its gradient is zero
        return (h ** 2).mean()


def _adamw_step(scale):
    torch.manual_seed(0)
    net = Centered(scale)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(16, 8)
    opt.zero_grad()
    net(x).backward()
    opt.step()
    return net



def _small_over_small(scale):
    """A small value off by 1e-4 of itself (within float32's tolerance only through atol,
    but far more digits agree than in rounding noise), divided by something as small."""
    torch.manual_seed(0)
    x = torch.rand(64) * 1e-3 + 1e-3
    h = x * scale
    return h / 1e-3   # QUOTIENT_LINE


def _line(marker):
    return line_in(__file__, marker)


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    folder = tmp_path_factory.mktemp("show_change")
    paths = []
    for name, offset in (("a", 0), ("b", 1)):
        path = str(folder / f"{name}.h5")
        with tracediff.record(path, frameworks=("torch",)):
            _train_sliced(offset)
        paths.append(path)
    return paths, locate(*paths)


@pytest.fixture(scope="module")
def zero_grad(tmp_path_factory):
    folder = tmp_path_factory.mktemp("near_zero")
    paths, grads = [], []
    for name, scale in (("a", 1.0), ("b", 1.0 + 2.0 ** -20)):
        path = str(folder / f"{name}.h5")
        with tracediff.record(path, frameworks=("torch",)):
            net = _adamw_step(scale)
        grads.append(net.shift.grad.numpy().copy())
        paths.append(path)
    return paths, grads, locate(*paths)


# -- show the change --------------------------------------------------------------------------

def test_the_slice_is_named_with_its_differing_start(sliced):
    _, r = sliced
    f = r.first_beyond_tolerance
    assert f.a.op == "aten::slice.Tensor" and f.a.step == 1
    assert f.a.source == f"test_show_change.py:{_line('SLICE_LINE')}"
    assert f.inputs_match is True
    args = {d.name: (d.a, d.b) for d in f.arguments}
    assert args["start"] == ("8", "9") and args["end"] == ("16", "17")
    assert "dim" not in args   # equal arguments are not listed


def test_no_float64_verdict_for_a_slice(sliced):
    _, r = sliced
    verdict = r.explain.verdict
    assert "closer to the float64" not in verdict and "off by" not in verdict
    assert "not judged against float64" in verdict
    assert "arguments differ: start 8 vs 9, end 16 vs 17" in verdict


def test_every_renderer_shows_the_differing_arguments(sliced):
    _, r = sliced
    ctx = report_context(r)
    for name, text in (("terminal", render_terminal(print_locate, r)),
                       ("markdown", markdown.render(r, ctx)),
                       ("html", html_report.render(r, ctx))):
        assert "arguments differ" in text and "start 8 vs 9" in text, name
    doc = json.loads(json.dumps(build(r)))["first_beyond_tolerance"]
    assert {"name": "start", "a": "8", "b": "9"} in doc["arguments_differ"]


def test_a_scalar_argument_is_named_and_equal_ones_are_not(zero_grad):
    _, _, r = zero_grad
    # the scale is the multiply's scalar: the change itself
    (d,) = r.first_difference.arguments
    assert d.name == "other" and float(d.a) == 1.0 and float(d.b) == 1.0 + 2.0 ** -20
    assert r.near_zero.arguments == []   # same value=, the same op on both sides
    assert "arguments_differ" not in build(r)["near_zero"]


# -- no headline on noise ---------------------------------------------------------------------

def test_truth_the_gradient_is_rounding_noise(zero_grad):
    _, grads, _ = zero_grad
    for g in grads:   # zero up to the rounding of the O(1) values it was summed from
        assert np.abs(g).max() < 1e-7
    assert not np.array_equal(grads[0], grads[1])


def test_noise_around_zero_is_not_the_headline(zero_grad):
    _, _, r = zero_grad
    # the only change is the scaling multiply: within tolerance, introduced there
    fd = r.first_difference
    assert fd.a.op == "aten::mul.Tensor" and fd.inputs_match is True
    assert fd.a.source == f"test_show_change.py:{_line('SCALE_LINE')}"
    assert r.first_beyond_tolerance is None and r.verdict == "match"
    nz = r.near_zero
    assert nz.a.op == "aten::addcdiv_" and "shift" in nz.optimizer
    assert nz.metrics.max_abs > 1e-4 and not nz.metrics.within_tolerance
    assert "rounding noise around zero" in nz.note and r.near_zero_total >= 2


def test_every_renderer_shows_the_noise_as_such(zero_grad):
    _, _, r = zero_grad
    ctx = report_context(r)
    term = render_terminal(print_locate, r)
    assert "rounding noise around zero" in term and "aten::addcdiv_" in term
    assert term.splitlines()[0].startswith("MATCH")
    for name, text in (("markdown", markdown.render(r, ctx)),
                       ("html", html_report.render(r, ctx))):
        assert "Rounding noise around zero" in text and "aten::addcdiv_" in text, name
    doc = build(r)
    assert doc["first_beyond_tolerance"] is None
    assert doc["near_zero"]["a"]["op"] == "aten::addcdiv_" and doc["near_zero_total"] >= 2



@pytest.fixture(scope="module")
def small_quotient(tmp_path_factory):
    folder = tmp_path_factory.mktemp("small_quotient")
    paths, outs = [], []
    for name, scale in (("a", 1.0), ("b", 1.0 + 1e-4)):
        path = str(folder / f"{name}.h5")
        with tracediff.record(path, frameworks=("torch",)):
            outs.append(_small_over_small(scale).numpy().copy())
        paths.append(path)
    return paths, outs, locate(*paths)


def test_a_small_difference_that_is_not_noise_is_the_headline(small_quotient):
    """Noise near zero is a relative difference beyond sqrt(rtol) (float32: 3.2e-3, half
    the digits gone), not beyond rtol: an input 1e-4 off keeps most of its digits, so the
    division that lifts it beyond tolerance is a real (inherited) difference, the headline,
    never "rounding noise around zero"."""
    _, outs, r = small_quotient
    rel = np.abs(outs[0].astype(np.float64) - outs[1]) / np.abs(outs[0])
    assert 1e-5 < rel.max() < 3e-4            # beyond float32's rtol, far within sqrt(rtol)
    assert r.first_difference.a.op == "aten::mul.Tensor"
    assert r.first_difference.metrics.within_tolerance   # ~1.5e-7 apart: within atol
    f = r.first_beyond_tolerance
    assert f is not None and r.verdict == "diverged", r.near_zero
    # its input is within tolerance, and says that it differs bitwise (never "introduced")
    assert f.a.op == "aten::div.Tensor" and "(within tolerance)" in f.inputs_reason
    assert "differs bitwise" in f.inputs_reason and f.inputs_bitwise is False
    assert f.a.source == f"test_show_change.py:{_line('QUOTIENT_LINE')}"
    assert r.near_zero is None
