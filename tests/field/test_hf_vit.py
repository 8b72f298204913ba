"""HF transformers' ViTModel against its FlaxViTModel port (tests/field/programs/hf_vit.py):
random weights converted by transformers' own converter, the same images.

The correct port MATCHes with every computing unit of both sides paired and compared, in
torch's eager and SDPA attention. With the position embeddings shifted by one patch in the
converted parameters, `locate` said MATCH (2 ops paired); the truth (hooks and
`capture_intermediates`, hf_truth.py) differs from the embeddings on. Each port bug is
DIVERGED at the truth's first differing module with the truth's magnitude (within 2x).
"""

import os

import numpy as np
import pytest

import tracediff

from ..helpers import ROOT
from .hf_truth import first_difference, load_program, record_cases

pytestmark = pytest.mark.field

PROGRAM = os.path.join(ROOT, "tests", "field", "programs", "hf_vit.py")
CASES = {"none": "none", "shift": "shift", "eps": "eps", "hw": "hw",
         "sdpa": ["--attn", "sdpa", "--bug", "none"]}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return record_cases(PROGRAM, CASES, tmp_path_factory.mktemp("hf_vit"))


def truth(bug, attn="eager"):
    """(first differing module, modules compared, its max abs) by hooks, not tracediff."""
    import torch
    prog = load_program(PROGRAM)
    x = prog.batch()
    tmodel, state = prog.torch_model(attn)
    fmodel, params = prog.flax_model(state, bug)
    return first_difference(tmodel, lambda m: m(pixel_values=torch.from_numpy(x)), fmodel,
                            params, (np.transpose(x, (0, 2, 3, 1)),))   # the module: NHWC


@pytest.mark.parametrize("case", ["none", "sdpa"])
def test_correct_port_matches_with_everything_compared(traces, case):
    first, compared, _ = truth("none", "sdpa" if case == "sdpa" else "eager")
    assert first is None and compared > 10
    r = tracediff.locate(traces[case], explain=False)
    assert r.verdict == "match" and r.exit_code == 0, (r.first_beyond_tolerance, r.coverage)
    c = r.coverage
    assert c.sufficient and c.b.paired == c.b.events > 20 and c.a.compared >= 0.9 * c.a.events


@pytest.mark.parametrize("bug", ["shift", "eps"])
def test_a_port_bug_is_named_at_the_truths_module_with_its_magnitude(traces, bug):
    first, _, magnitude = truth(bug)
    assert first is not None and magnitude > 1e-4
    r = tracediff.locate(traces[bug], explain=False)
    assert r.verdict == "diverged", (first, r.coverage)
    f = r.first_beyond_tolerance
    b = f.layer["module"]["b"].replace("/", ".")
    # the truth's module, or the one holding it where the truth's is an identity in eval
    # (the shifted sum is first seen as `embeddings.dropout`'s output)
    assert b == first or first.startswith(b + "."), (f.layer["module"], first)
    assert magnitude / 2 <= f.metrics.max_abs <= magnitude * 2, (f.metrics.max_abs, magnitude)


def test_a_kernel_with_h_and_w_swapped_is_a_difference_not_a_layout(traces):
    """The patch kernel converted with H and W swapped equals torch's weight only in an axis
    order no framework uses for one tensor (issue 35): before, its input was said to match
    "(axes permuted)" and the conv was "introduced here"."""
    first, _, magnitude = truth("hw")
    assert first == "embeddings.patch_embeddings.projection"
    r = tracediff.locate(traces["hw"], explain=False)
    f = r.first_beyond_tolerance
    assert r.verdict == "diverged" and f.layer["module"]["b"] == \
        "embeddings/patch_embeddings/projection", f.layer
    assert f.inputs_match is False and "not a layout either framework uses" in f.inputs_reason
    assert magnitude / 2 <= f.metrics.max_abs <= magnitude * 2, (f.metrics.max_abs, magnitude)
