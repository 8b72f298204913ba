"""HF transformers' ViT trained 2 AdamW steps in both frameworks in one process
(tests/field/programs/hf_vit_train.py, adamw_both.py: optax.adamw with the HF Flax examples'
decay mask against torch.optim.AdamW with a no-decay parameter group), a port bug in the
optimizer's settings on the Flax side: `b2=0.95` (torch 0.999), `eps=1e-6` (torch 1e-8), or
the decay mask forgotten (optax decays the biases and LayerNorm scales that torch's param
group 1 leaves at weight_decay 0.0).

Truth, independently of tracediff: the script dumps both sides' gradients, Adam moments
(optax `mu`/`nu`, torch `exp_avg`/`exp_avg_sq`) and parameters after every step; here they
are mapped (Flax path <-> torch name, kernels transposed) and compared with numpy per tensor
(test_hf_bert_training.truth's criterion), in the order a step computes them.

Before: "the exp_avg_sq differ before the optimizer updates anything: the divergence is
upstream (the forward or backward pass)" for b2, whose grads tracediff had just compared
equal; no setting named for eps or the mask; the step's worst parameter of the mask case a
key projection's bias, whose gradient is rounding noise.
"""

import json
import os

import numpy as np
import pytest

from ..helpers import run_cli
from .test_hf_bert_training import (ATOL, RTOL, _first_beyond, _noise, _side,
                                    assert_decay_mask_named, located_runs, truth)

pytestmark = pytest.mark.field

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "hf_vit_train.py")
CASES = {"ok": (), "b2": ("--bug", "b2"), "eps": ("--bug", "eps"),
         "mask": ("--bug", "decay_mask")}
ROLES = (("grads", "flax_grad", "torch_grad"), ("exp_avg", "flax_mu", "torch_mu"),
         ("exp_avg_sq", "flax_nu", "torch_nu"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{case: (trace, dump, locate's result)}, the recordings at once."""
    return located_runs(PROGRAM, CASES, tmp_path_factory.mktemp("vit_optsettings"))


def _beyond(f, t):
    diff = np.linalg.norm(f - t)
    return bool(diff > RTOL * np.linalg.norm(f) + ATOL * np.sqrt(f.size))


def first_by_role(dump):
    """(step, role, torch name) of the first value beyond tolerance in the order a step
    computes them: grads, exp_avg, exp_avg_sq (numpy on the dumps), then the parameters after
    the step (`truth`); torch's parameter order."""
    z = np.load(dump)
    params = truth(dump)
    names = [k.split("/", 2)[2] for k in z.files if k.startswith("torch/init/")]
    for s in sorted(params):
        keys = {k.split("/", 2)[2] for k in z.files if k.startswith(f"flax_grad/{s}/")}
        for role, fa, tb in ROLES:
            for n in names:
                if _beyond(_side(z, fa, s, n, keys), z[f"{tb}/{s}/{n}"].astype(np.float64)):
                    return s, role, n
        for row in params[s]:
            if row[2]:
                return s, "params", row[0]
    return None


def _grads_match(dump, step, name):
    z = np.load(dump)
    keys = {k.split("/", 2)[2] for k in z.files if k.startswith(f"flax_grad/{step}/")}
    return not _beyond(_side(z, "flax_grad", step, name, keys),
                       z[f"torch_grad/{step}/{name}"].astype(np.float64))


def test_correct_port_still_matches(runs):
    trace, dump, r = runs["ok"]
    assert first_by_role(dump) is None                      # the port is right (truth)
    assert r.first_parameter is None and r.verdict == "match" and r.exit_code == 0


def test_b2_named_with_both_values_where_the_grads_agree(runs):
    trace, dump, r = runs["b2"]
    step, role, name = first_by_role(dump)
    assert (step, role) == (0, "exp_avg_sq") and _grads_match(dump, step, name)
    p = r.first_parameter
    assert r.verdict == "diverged" and r.exit_code == 1
    assert (p.step, p.role, p.parameter) == (step, role, name)
    assert p.settings == [{"setting": "b2", "a": "0.95", "b": "0.999"}]
    assert "its grads match" in p.note and "b2 0.95 vs 0.999" in p.note
    assert "upstream" not in p.note
    out = run_cli("locate", trace)
    assert out.returncode == 1 and "b2 0.95 vs 0.999" in out.stdout
    assert "the divergence is upstream" not in out.stdout
    js = json.loads(run_cli("locate", "--json", trace).stdout)
    assert js["first_parameter"]["settings"] == p.settings


def test_eps_named_where_grads_and_state_agree(runs):
    trace, dump, r = runs["eps"]
    step, role, name = first_by_role(dump)
    assert (step, role) == (0, "params")
    p = r.first_parameter
    assert (p.step, p.role, p.parameter) == (step, role, name) and r.exit_code == 1
    assert p.upstream_match is True and p.weight_decay is False
    assert p.settings == [{"setting": "eps", "a": "1e-06", "b": "1e-08"}]
    assert "eps 1e-06 vs 1e-08" in p.note and "upstream" not in p.note


def test_decay_mask_names_the_parameter_group_setting(runs):
    """The mask forgotten on the Flax side: the first parameter it changes, decayed there
    with weight_decay 0.1 where torch's param group 1 has 0.0."""
    trace, dump, r = runs["mask"]
    tr = truth(dump)
    step, (name, *_) = _first_beyond(tr)
    assert first_by_role(dump) == (step, "params", name)
    assert_decay_mask_named(r, dump, name)
    p = r.first_parameter
    assert p.settings == [{"setting": "weight_decay", "a": "0.1", "b": "0.0"}]
    assert "weight_decay 0.1 vs 0.0 (b: param group 1)" in p.note


@pytest.mark.parametrize("case", ["mask", "eps"])
def test_worst_parameter_is_never_one_whose_gradient_is_noise(runs, case):
    """Each step's worst parameter: the largest relative L2 among parameters whose gradient
    is not rounding noise throughout, as the truth has it; it was the key projection's bias
    of layer 0 at step 0 of the mask case (a gradient of 1e-9 on each side)."""
    trace, dump, r = runs[case]
    z = np.load(dump)
    tr = truth(dump, determined=False)
    for s in r.optimizer_steps:
        real = [(rel, n) for n, rel, _, _, _ in tr[s.step] if not _noise(z, s.step, n).all()]
        worst = s.worst.rsplit(" <-> params/", 1)[-1]
        assert not _noise(z, s.step, worst).all(), (s.step, worst)
        assert worst == max(real)[1], (s.step, worst, sorted(real)[-3:])
