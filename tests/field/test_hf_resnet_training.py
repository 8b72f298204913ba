"""HF transformers' ResNet (bottleneck layers) trained 2 AdamW steps in both frameworks in one
process (tests/field/programs/hf_resnet_train.py: hf_resnet.py's tiny config, converted
weights and running statistics; optax.adamw with the HF Flax examples' decay mask against
torch.optim.AdamW with HF Trainer's no-decay group, the biases), recorded as a user records
it and located in the one trace.

BatchNorm in inference mode (`--bn eval`, the converted running statistics): the port MATCHes
and the forgotten mask is named at its first parameter. In training mode (`--bn train`, each
side normalising by the batch's statistics) the pairing does not hold: a strict xfail with
what was measured. Truth, independently of tracediff: both sides' parameters after every
step, per tensor, where their gradients are determined (test_hf_bert_training.truth).
"""

import os

import pytest

from ..helpers import run_cli
from .test_hf_bert_training import (_first_beyond, assert_decay_mask_named, located_runs, truth,
                                    undetermined)

pytestmark = pytest.mark.field

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "hf_resnet_train.py")
CASES = {"ok": (), "mask": ("--bug", "decay_mask"), "train": ("--bn", "train")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{case: (trace, dump, locate's result)}, the recordings at once."""
    return located_runs(PROGRAM, CASES, tmp_path_factory.mktemp("resnet_train"))


def test_correct_port_matches_with_the_backward_compared(runs):
    trace, dump, r = runs["ok"]
    assert _first_beyond(truth(dump)) == (None, None)        # the port is right (truth)
    assert r.first_beyond_tolerance is None, r.first_beyond_tolerance
    assert r.first_parameter is None
    # measured: 83-85 % of the JAX and 89-94 % of the torch computing units paired (every
    # forward unit; Flax's BatchNorm transposes are what is left), from run to run as the
    # backward's rounding lets values meet or not: near the bar (80 %), one run in four was
    # INCONCLUSIVE (exit 3). Never DIVERGED; MATCH exactly where the coverage suffices.
    c = r.coverage
    assert (r.verdict, r.exit_code) == (("match", 0) if c.sufficient else ("inconclusive", 3))
    assert c.a.paired >= 0.75 * c.a.events and c.b.paired >= 0.75 * c.b.events
    assert any(m["phase"] == "backward" and m["b_op"].startswith("convolution_backward")
               for m in r.mapping), {m["b_op"] for m in r.mapping}
    assert [s.step for s in r.optimizer_steps] == [0, 1]
    assert all(s.beyond == 0 for s in r.optimizer_steps)
    assert run_cli("locate", trace).returncode == r.exit_code


def test_decay_mask_names_the_parameter_and_the_step(runs):
    _, dump, r = runs["mask"]
    assert_decay_mask_named(r, dump, "embedder.embedder.normalization.bias")


def test_training_mode_batch_norm_truth(runs):
    """The truth of the training-mode run: a correct port; the embedder BatchNorm's bias
    has channels whose gradient is rounding noise (no element passes the ReLU after it)."""
    _, dump, _ = runs["train"]
    assert _first_beyond(truth(dump)) == (None, None)
    assert "embedder.embedder.normalization.bias" in undetermined(dump)[0]


@pytest.mark.xfail(strict=True, reason=(
    "measured: BatchNorm in training mode pairs 10 of 990 JAX and 5 of 130 torch computing "
    "units (Flax's batch mean and variance equations against torch's native_batch_norm, "
    "whose saved statistics are no output Flax has; the step 0 forward pairs nothing after "
    "the first conv), and names step 1's grads of embedder.embedder.convolution.weight "
    "(relative L2 2.8e-5) where the truth has a correct port"))
def test_training_mode_batch_norm_matches(runs):
    _, _, r = runs["train"]
    assert r.verdict == "match" and r.exit_code == 0 and r.coverage.sufficient
