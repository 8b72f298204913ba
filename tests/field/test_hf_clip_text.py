"""HF transformers' CLIPTextModel against its FlaxCLIPTextModel port (tests/field/programs/
hf_clip_text.py), written as CLIP's documentation calls them: the Flax model given
`position_ids` of the batch's shape [2, 8], torch reading its own [1, 8] buffer.

Before coverage, `locate` said MATCH for the correct port and for every injected bug,
having paired 3 of the torch side's ~50 computing units; then INCONCLUSIVE (6 of 122 and 3
of 43 units paired): the position embeddings looked up for [2, 8] positions never paired
with torch's for [1, 8], and torch's position buffer paired Flax's causal-mask iota by equal
integers. Now equal float values pair through broadcasting and integer constants both sides
build are no atoms: the correct port MATCHes with coverage (eager and SDPA), each bug is
DIVERGED at the truth's module with the truth's magnitude in the headline (within 2x). The
truth is computed here, independently of tracediff (torch forward hooks and Flax
`capture_intermediates`, paired by module path).
"""

import os

import numpy as np
import pytest

import tracediff

from ..helpers import ROOT
from .hf_truth import activation_difference, first_difference, load_program, record_cases

pytestmark = pytest.mark.field

PROGRAM = os.path.join(ROOT, "tests", "field", "programs", "hf_clip_text.py")
CASES = {"correct": "none", "gelu": "gelu", "eps": "eps", "pos": "pos"}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_clip")
    out = record_cases(PROGRAM, CASES, folder)
    out.update(record_cases(PROGRAM, {"sdpa": "none"}, folder, ("--attn", "sdpa")))
    return out


def _models(bug):
    prog = load_program(PROGRAM)
    ids = prog.batch()
    tmodel, state = prog.torch_model("eager")
    fmodel, params = prog.flax_model(state, bug)
    return prog, ids, tmodel, fmodel, params


def truth(bug):
    """(first differing module path or None, modules compared, its max abs) (hf_truth.py)."""
    import torch
    prog, ids, tmodel, fmodel, params = _models(bug)
    pos = prog.flax_positions(ids, "batch", bug)
    return first_difference(tmodel, lambda m: m(input_ids=torch.from_numpy(ids)), fmodel,
                            params, (ids.astype(np.int32), np.ones_like(ids, np.int32), pos))


def activation_truth():
    """Layer 0's activation, which Flax computes inside `mlp` (no module of its own, so
    `capture_intermediates` has no output for it): torch's `activation_fn` output against
    the Flax port's activation (exact GELU) of the same input (`fc1`'s output)."""
    import jax
    import torch
    _, ids, tmodel, _, _ = _models("gelu")
    return activation_difference(tmodel.text_model.encoder.layers[0].mlp.activation_fn,
                                 lambda: tmodel(input_ids=torch.from_numpy(ids)),
                                 lambda x: jax.nn.gelu(x, approximate=False))


@pytest.mark.parametrize("case", ["correct", "sdpa"])
def test_correct_port_matches_with_coverage(traces, case):
    first, compared, _ = truth("none")
    assert first is None and compared > 10          # the truth: every module agrees
    r = tracediff.locate(traces[case], explain=False)
    assert r.verdict == "match" and r.exit_code == 0, (r.first_beyond_tolerance, r.coverage)
    c = r.coverage
    assert c.sufficient
    for side in (c.a, c.b):
        assert side.paired >= 0.9 * side.events and side.compared >= 0.9 * side.events, c


def _module_b(r):
    return r.first_beyond_tolerance.layer["module"]["b"].replace("/", ".")


def test_layer_norm_eps_is_found_at_layer_norm1_with_its_magnitude(traces):
    first, _, max_abs = truth("eps")
    assert first == "text_model.encoder.layers.0.layer_norm1"
    r = tracediff.locate(traces["eps"], explain=False)
    assert r.verdict == "diverged", r.coverage
    f = r.first_beyond_tolerance
    assert _module_b(r) == first, f.layer
    assert max_abs / 2 <= f.metrics.max_abs <= 2 * max_abs, (f.metrics, max_abs)


def test_gelu_for_quick_gelu_is_found_at_the_activation_with_its_magnitude(traces):
    """Flax's exact GELU starts `0.5 * x` where QuickGELU starts `1.702 * x`: those two muls
    differ by 2.49, but they are not where the port differs, the activation's output is
    (0.0196): the headline (was the muls' 2.49)."""
    first, _, _ = truth("gelu")
    assert first == "text_model.encoder.layers.0.mlp.fc2"   # the first module both have
    act = activation_truth()
    r = tracediff.locate(traces["gelu"], explain=False)
    assert r.verdict == "diverged", r.coverage
    f = r.first_beyond_tolerance
    assert _module_b(r).startswith("text_model.encoder.layers.0.mlp"), f.layer
    assert act / 2 <= f.metrics.max_abs <= 2 * act, (f.metrics, act)


def test_positions_off_by_one_are_found_at_the_position_embeddings(traces):
    """Flax given positions 1..8 where torch's buffer holds 0..7: the two index values are
    only tied by dataflow (each side's lookup into the same table), never by their values;
    the lookups pair ([2, 8, 32] with the [1, 8, 32] it should broadcast from) and differ
    by the truth's magnitude (hooks: the embeddings' output; the position lookups' outputs
    are of two sizes, which the hooks do not compare)."""
    first, _, max_abs = truth("pos")
    assert first == "text_model.embeddings"
    r = tracediff.locate(traces["pos"], explain=False)
    assert r.verdict == "diverged", r.coverage
    f = r.first_beyond_tolerance
    assert _module_b(r) == "text_model.embeddings.position_embedding", f.layer
    assert max_abs / 2 <= f.metrics.max_abs <= 2 * max_abs, (f.metrics, max_abs)
    assert r.coverage.sufficient
