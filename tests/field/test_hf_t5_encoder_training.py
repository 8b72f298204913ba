"""HF transformers' T5 encoder trained 2 AdamW steps in both frameworks in one process
(tests/field/programs/hf_t5_encoder_train.py: hf_t5_encoder.py's tiny config, converted
weights and `jnp.clip` shim; optax.adamw with the HF Flax examples' decay mask against
torch.optim.AdamW with HF Trainer's no-decay group), recorded as a user records it and located
in the one trace.

Truth, independently of tracediff: both sides' parameters after every step, mapped and
compared with numpy per tensor (test_hf_bert_training.truth). The correct port was DIVERGED
three ways before: Flax's `sqrt(v) ** 2` (its jvp of the RMSNorm's `x / sqrt(v)`) paired with
torch's RsqrtBackward0 `rsqrt(v) ** 3` (0.349 apart, the RMSNorm's input gradient within
4.8e-7); the tanh GELU's `x ** 3` paired with the `x ** 2` JAX's jvp computes beside it
(34.3); then the last RMSNorm of step 1 (1.73e-6 in 0.2 % of its elements, inherited from
the rounding of step 0's parameters) where the two formulas meet.
"""

import os

import pytest

from ..helpers import run_cli
from .test_hf_bert_training import _first_beyond, assert_decay_mask_named, located_runs, truth

pytestmark = pytest.mark.field

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "hf_t5_encoder_train.py")
CASES = {"ok": (), "mask": ("--bug", "decay_mask")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{case: (trace, dump, locate's result)}, the recordings at once."""
    return located_runs(PROGRAM, CASES, tmp_path_factory.mktemp("t5_train"))


def test_correct_port_matches_with_the_backward_compared(runs):
    trace, dump, r = runs["ok"]
    assert _first_beyond(truth(dump)) == (None, None)   # right (truth)
    assert r.first_beyond_tolerance is None, r.first_beyond_tolerance
    assert r.first_parameter is None
    # measured: 98 % of the JAX and 100 % of the torch computing units paired (was 85 % and
    # 80-81 %, at the bar, a run in some INCONCLUSIVE: Flax's RMSNorm transposes and torch's
    # MulBackward0 terms were left, and the parameters' gradient sums not counted as compared)
    c = r.coverage
    assert (r.verdict, r.exit_code) == ("match", 0), c
    assert c.a.paired >= 0.9 * c.a.events and c.b.paired >= 0.9 * c.b.events, c
    assert any(m["phase"] == "backward" for m in r.mapping)
    assert [s.step for s in r.optimizer_steps] == [0, 1]
    assert all(s.beyond == 0 for s in r.optimizer_steps)
    assert run_cli("locate", trace).returncode == r.exit_code


def test_decay_mask_names_the_parameter_and_the_step(runs):
    _, dump, r = runs["mask"]
    assert_decay_mask_named(r, dump, "encoder.block.0.layer.0.layer_norm.weight")
