"""HF transformers' CLIP text model trained 2 AdamW steps in both frameworks in one process
(tests/field/programs/hf_clip_text_train.py: hf_clip_text.py's tiny config and converted
weights, the Flax model given [2, 8] position_ids as CLIP's docs build them; optax.adamw with
the HF Flax examples' decay mask against torch.optim.AdamW with HF Trainer's no-decay group),
recorded as a user records it and located in the one trace.

Truth, independently of tracediff: both sides' parameters after every step, mapped and
compared with numpy per tensor (test_hf_bert_training.truth), and the gradients: each
layer's `k_proj.bias` has a gradient that is zero but for rounding (softmax ignores a shift
of every key's score), the two sides' 9e-10 apart with no digit in common (relative L2 1.2),
and Adam's m / (sqrt(v) + eps) turns that noise into steps of their own: the bias differs by
relative L2 3.3e-4 after step 0 in a correct port. Elements whose gradient is noise are not
judged (`truth`; a parameter beyond only there is `undetermined`); tracediff said "the
update rule differs" there, and DIVERGED at step 1's k_proj, which reads it.
"""

import os

import pytest

from ..helpers import run_cli
from .test_hf_bert_training import (_first_beyond, assert_decay_mask_named, located_runs, truth,
                                    undetermined)

pytestmark = pytest.mark.field

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "hf_clip_text_train.py")
CASES = {"ok": (), "mask": ("--bug", "decay_mask")}
K_BIASES = {f"text_model.encoder.layers.{i}.self_attn.k_proj.bias" for i in (0, 1)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{case: (trace, dump, locate's result)}, the recordings at once."""
    return located_runs(PROGRAM, CASES, tmp_path_factory.mktemp("clip_train"))


def test_correct_port_optimizer_steps_agree_but_for_the_noise_gradients(runs):
    _, dump, r = runs["ok"]
    tr, und = truth(dump), undetermined(dump)
    assert und == {0: K_BIASES, 1: K_BIASES}
    assert _first_beyond(tr) == (None, None)                  # the port is right
    every = truth(dump, determined=False)                     # every element judged
    assert {n for n, _, beyond, _, _ in every[0] if beyond} == K_BIASES
    assert r.first_parameter is None
    assert [s.step for s in r.optimizer_steps] == [0, 1]
    for s in r.optimizer_steps:
        assert s.beyond == 0 and set(s.undetermined) == und[s.step]
    c = r.coverage            # measured: a 83 %, b 88 % of the computing units paired
    assert c.a.paired >= 0.8 * c.a.events and c.b.paired >= 0.8 * c.b.events


def test_correct_port_matches(runs):
    """Step 1's forward reads the two undetermined biases: layer 0's k_proj output differed
    by max abs 6.6e-5 (DIVERGED), then layer 1's LayerNorm equations were paired with layer
    0's residual add (0.114) where the rounding after step 0 kept that add 2.4e-6 apart
    element-wise: what an undetermined parameter shifts is inherited from it, and values
    meet within tolerance as a whole."""
    trace, _, r = runs["ok"]
    assert r.first_beyond_tolerance is None, r.first_beyond_tolerance
    assert r.verdict == "match" and r.exit_code == 0 and r.coverage.sufficient
    assert run_cli("locate", trace).returncode == 0


def test_decay_mask_names_the_parameter_and_the_step(runs):
    """Layer 0's k_proj.bias is decayed on the Flax side too: beyond where its gradient is
    determined (the truth's first on an Intel Xeon); on an AMD EPYC with AVX-512 more of its
    gradient's elements are rounding noise, it is beyond nowhere else, and the truth's first
    is the next bias decayed, v_proj's. Layer 1's differs only where it is noise:
    undetermined."""
    _, dump, r = runs["mask"]
    attn = "text_model.encoder.layers.0.self_attn."
    assert_decay_mask_named(r, dump, (attn + "k_proj.bias", attn + "v_proj.bias"))
    assert set(r.optimizer_steps[0].undetermined or ()) == undetermined(dump)[0]
