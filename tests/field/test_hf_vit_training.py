"""HF transformers' ViT trained 2 AdamW steps in both frameworks in one process
(tests/field/programs/hf_vit_train.py: hf_vit.py's tiny config and converted weights,
optax.adamw with the HF Flax examples' decay mask against torch.optim.AdamW with a no-decay
parameter group), recorded as a user records it and located in the one trace.

Truth, independently of tracediff: both sides' parameters after every step, mapped and
compared with numpy per tensor (test_hf_bert_training.truth). The correct port was DIVERGED at
layer 1 `layernorm_after` backward (5.69e-5: one term of Flax's LayerNorm input gradient, the
`mul` before the summing `add_any`, against torch's whole `native_layer_norm_backward`).
"""

import os

import pytest

from ..helpers import run_cli
from .test_hf_bert_training import _first_beyond, assert_decay_mask_named, located_runs, truth

pytestmark = pytest.mark.field

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "hf_vit_train.py")
CASES = {"ok": (), "mask": ("--bug", "decay_mask"), "eager": ("--eager",)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{case: (trace, dump, locate's result)}, the recordings at once."""
    return located_runs(PROGRAM, CASES, tmp_path_factory.mktemp("vit_train"))


def test_correct_port_matches_with_the_backward_compared(runs):
    trace, dump, r = runs["ok"]
    assert _first_beyond(truth(dump)) == (None, None)        # the port is right (truth)
    assert r.first_beyond_tolerance is None, r.first_beyond_tolerance
    assert r.first_parameter is None
    assert r.verdict == "match" and r.exit_code == 0
    c = r.coverage
    assert c.sufficient and c.a.paired >= 0.9 * c.a.events and c.b.paired >= 0.9 * c.b.events
    # the LayerNorm backward is compared where both sides hold the same value: the sum with
    # the residual's gradient, never a term of Flax's sum against torch's whole gradient
    ln = [m for m in r.mapping if m["phase"] == "backward"
          and m["b_module"] == "encoder/layer/1/layernorm_after"]
    assert any(m["b_op"].endswith("add") and m["a_op"].endswith("add_any") for m in ln), ln
    assert not any(m["b_op"].endswith("native_layer_norm_backward") for m in ln), ln
    assert [s.step for s in r.optimizer_steps] == [0, 1]
    assert all(s.beyond == 0 for s in r.optimizer_steps)
    assert run_cli("locate", trace).returncode == 0


def test_correct_port_unjitted_has_no_forward_finding_in_step_1(runs):
    """The train step not jitted: step 1's forward reads parameters that differ by rounding
    (relative L2 1e-7), and a LayerNorm's equations against native_layer_norm under
    `jvp(...)` exceeded atol in 0.09 % of its elements (max abs 2.6e-6, 'max rel 8.3e-4'),
    within tolerance as a whole: DIVERGED where the forward passes agree. The LayerNorm read
    its input twice, and the second read, with no counterpart in torch's one op, made the
    rounding rule give up."""
    _, dump, r = runs["eager"]
    assert _first_beyond(truth(dump)) == (None, None)
    assert r.first_beyond_tolerance is None, r.first_beyond_tolerance
    assert r.verdict == "match" and r.exit_code == 0 and r.coverage.sufficient


def test_decay_mask_names_the_parameter_and_the_step(runs):
    _, dump, r = runs["mask"]
    assert_decay_mask_named(r, dump, "embeddings.patch_embeddings.projection.bias")
