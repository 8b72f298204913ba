"""HF transformers' ResNetModel against its FlaxResNetModel port (tests/field/programs/
hf_resnet.py): convolutions NCHW against NHWC, BatchNorm in inference mode with its running
statistics converted into Flax's `batch_stats`, random weights converted by transformers'
own converter, the same images.

The truth is computed here, independently of tracediff (torch forward hooks and Flax
`capture_intermediates`, paired by module path, hf_truth.py): the correct port MATCHes with
the pairing covering both sides; each port bug is DIVERGED at the truth's module with the
truth's magnitude in the headline (within 2x), the pairing covering both sides. A parameter
converted wrong (the running variance as a standard deviation, a flipped kernel) used to be a
value of one side only: nothing after it paired and `locate` said INCONCLUSIVE (1 of 57 units;
75 %). ResNet has no attention: one mode.
"""

import os

import numpy as np
import pytest

import tracediff

from ..helpers import ROOT
from .hf_truth import first_array, load_program, module_differences, record_cases

pytestmark = pytest.mark.field

PROGRAM = os.path.join(ROOT, "tests", "field", "programs", "hf_resnet.py")
CASES = ("none", "std", "gelu", "flip", "affine")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return record_cases(PROGRAM, {b: b for b in CASES}, tmp_path_factory.mktemp("hf_resnet"))


def truth(bug):
    """(rows [(module, max abs, differs)], the first differing row or None)."""
    import torch
    prog = load_program(PROGRAM)
    x = prog.batch()
    tmodel, state = prog.torch_model()
    fmodel, variables = prog.flax_model(state, bug)
    rows = module_differences(tmodel, lambda m: m(pixel_values=torch.from_numpy(x)), fmodel,
                              variables, (np.transpose(x, (0, 2, 3, 1)), True))  # NHWC, inference
    return rows, next((r for r in rows if r[2]), None)


def test_correct_port_matches_with_everything_compared(traces):
    rows, first = truth("none")
    assert first is None and len(rows) > 30, rows
    r = tracediff.locate(traces["none"], explain=False)
    assert r.verdict == "match" and r.exit_code == 0, (r.first_beyond_tolerance, r.coverage)
    c = r.coverage
    assert c.sufficient, c.reasons
    for side in (c.a, c.b):
        assert side.paired >= 0.9 * side.events and side.compared >= 0.9 * side.events, c


# bug: the module the truth names (checked against it), tracediff's b module under it
EXPECT = {
    "gelu": "embedder.embedder",                                   # relu -> gelu, 0.170
    "affine": "encoder.stages.0.layers.0.layer.0.normalization",   # scale <-> bias, 8.17
    "std": "embedder.embedder.normalization",                      # var as std, 0.214
    "flip": "encoder.stages.1.layers.0.layer.1.convolution",       # flipped kernel, 5.89
}


@pytest.mark.parametrize("bug", sorted(EXPECT))
def test_port_bug_named_at_its_module_with_its_magnitude(traces, bug):
    rows, first = truth(bug)
    assert first is not None and first[0] == EXPECT[bug], first
    r = tracediff.locate(traces[bug], explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, (first, r.coverage.reasons)
    f = r.first_beyond_tolerance
    b = f.layer["module"]["b"].replace("/", ".")
    assert b.startswith(first[0]), (f.layer, first)
    assert first[1] / 2 <= f.metrics.max_abs <= 2 * first[1], (f.metrics.max_abs, first)
    assert r.coverage.sufficient, r.coverage.reasons



# -- a conv stride that changes the shape of every feature map after it (issue 52)

@pytest.fixture(scope="module")
def stride_trace(tmp_path_factory):
    return record_cases(PROGRAM, {"stride": "stride"},
                        tmp_path_factory.mktemp("hf_resnet_stride"))["stride"]


def _stride_truth():
    """(embedder conv output shapes (Flax NHWC, torch NCHW), pooled output max abs): torch
    forward hooks and Flax `capture_intermediates`, no tracediff."""
    import torch
    prog = load_program(PROGRAM)
    x = prog.batch()
    tmodel, state = prog.torch_model("stride")
    fmodel, variables = prog.flax_model(state, "none")
    seen = {}

    def keep(name):
        def fn(_m, _i, out):
            seen.setdefault(name, first_array(out))
        return fn

    hooks = [tmodel.embedder.embedder.convolution.register_forward_hook(keep("conv")),
             tmodel.pooler.register_forward_hook(keep("pooler"))]
    with torch.no_grad():
        tmodel(pixel_values=torch.from_numpy(x))
    for h in hooks:
        h.remove()
    out, inter = fmodel.module.apply(variables, np.transpose(x, (0, 2, 3, 1)), True,
                                     capture_intermediates=True, mutable=["intermediates"])
    conv = inter["intermediates"]["embedder"]["embedder"]["convolution"]["__call__"][0]
    pooled = first_array(out.pooler_output)
    return (list(np.shape(conv)), list(seen["conv"].shape)), \
        float(np.abs(pooled.reshape(seen["pooler"].shape) - seen["pooler"]).max())


def test_a_conv_stride_that_changes_every_shape_after_it_is_found_at_the_conv(stride_trace):
    """Torch's embedder conv has stride 3, Flax's 2: every feature map after it has another
    shape, so no value pairs until the pooled output. The two convs read the same image and
    kernel: they pair, the finding names the stride and the shapes, and its magnitude is
    the pooled output's (where the values meet again; truth by hooks and
    capture_intermediates)."""
    shapes, pooled = _stride_truth()
    assert shapes == ([2, 10, 10, 12], [2, 12, 7, 7]), shapes
    r = tracediff.locate(stride_trace, explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    assert f.layer["module"]["b"].replace("/", ".") == "embedder.embedder.convolution", f.layer
    assert f.layer["shape"]["text"] == ("conv stride (2, 2) vs (3, 3); shape [2,10,10,12] vs "
                                        "[2,12,7,7]"), f.layer["shape"]
    assert pooled / 3 <= f.metrics.max_abs <= 3 * pooled, (f.metrics.max_abs, pooled)
