"""HF transformers' LlamaModel against its FlaxLlamaModel port (tests/field/programs/
hf_llama.py): rotary position embeddings, grouped-query attention, a gated SiLU MLP and
RMSNorm, random weights converted by transformers' own converter, the same token ids, in
torch's eager and SDPA attention.

The truth is computed here, independently of tracediff (torch forward hooks and Flax
`capture_intermediates`, paired by module path, hf_truth.py). Before, the pairing stopped at
layer 0's rotary embedding (Flax gathers rows of a sin/cos table built in numpy, an input
only Flax has; torch computes cos and sin from its `inv_freq` buffer, made from constants):
the correct port was INCONCLUSIVE at 16-18 % coverage and the bugs after it were not
located. Now values each side computes from what only it has pair when equal within
tolerance (`pairing/near.py`), and a matmul's residual add is no bias: the correct port
MATCHes with every unit paired, each bug is DIVERGED at the truth's module (the activation
for gelu) with the truth's magnitude.
"""

import os

import pytest

import tracediff

from ..helpers import ROOT
from .hf_truth import activation_difference, load_program, module_differences, record_cases

pytestmark = pytest.mark.field

PROGRAM = os.path.join(ROOT, "tests", "field", "programs", "hf_llama.py")
CASES = {"eager": ["--attn", "eager", "--bug", "none"], "sdpa": ["--attn", "sdpa", "--bug", "none"],
         "gelu": "gelu", "eps": "eps", "oproj": "oproj"}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return record_cases(PROGRAM, CASES, tmp_path_factory.mktemp("hf_llama"))


def truth(bug, attn="eager"):
    """(rows [(module, max abs, differs)], the first differing row or None)."""
    import torch
    prog = load_program(PROGRAM)
    ids = prog.batch()
    tmodel, state = prog.torch_model(attn)
    fmodel, params = prog.flax_model(state, bug)
    rows = module_differences(tmodel, lambda m: m(input_ids=torch.from_numpy(ids)), fmodel,
                              params, prog.flax_args(ids))
    return rows, next((r for r in rows if r[2]), None)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_correct_port_is_never_diverged_nor_a_thin_match(traces, attn):
    rows, first = truth("none", attn)
    assert first is None and len(rows) > 20, rows
    r = tracediff.locate(traces[attn], explain=False)
    assert r.verdict in ("match", "inconclusive"), r.first_beyond_tolerance
    assert (r.verdict == "match") == r.coverage.sufficient, r.coverage.reasons
    assert r.exit_code == (0 if r.verdict == "match" else 3)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_correct_port_matches_with_everything_compared(traces, attn):
    r = tracediff.locate(traces[attn], explain=False)
    assert r.verdict == "match" and r.coverage.sufficient, r.coverage.reasons
    for side in (r.coverage.a, r.coverage.b):
        assert side.paired >= 0.9 * side.events and side.compared >= 0.9 * side.events


# bug: the module the truth names (checked against it)
EXPECT = {
    "gelu": "layers.0.mlp.down_proj",         # silu -> gelu: the first module both sides have
    "eps": "layers.0.input_layernorm",        # RMSNorm eps 1e-2, max abs 0.033
    "oproj": "layers.1.self_attn.o_proj",     # kernel transposed, max abs 0.044
}
# where the finding lies: the truth's module, but for gelu the MLP whose activation differs
# (torch's `act_fn` is a module, Flax's activation a function inside `mlp`)
WHERE = dict(EXPECT, gelu="layers.0.mlp")


def _module_b(r):
    return r.first_beyond_tolerance.layer["module"]["b"].replace("/", ".")


@pytest.mark.parametrize("bug", ["eps", "oproj"])
def test_port_bug_named_at_its_module_with_its_magnitude(traces, bug):
    _, first = truth(bug)
    r = tracediff.locate(traces[bug], explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, (first, r.coverage.reasons)
    f = r.first_beyond_tolerance
    assert _module_b(r).startswith(first[0]), (f.layer, first)
    assert first[1] / 2 <= f.metrics.max_abs <= 2 * first[1], (f.metrics.max_abs, first)


def test_gelu_for_silu_is_found_at_the_activation_with_its_magnitude(traces):
    """Flax's activation is a function inside `mlp`, so the module truth first sees
    `down_proj`; the finding names layer 0's MLP with the activation's own magnitude (torch's
    `act_fn` output against Flax's exact GELU of the same input, by a hook)."""
    import jax
    import torch
    _, first = truth("gelu")
    assert first[0] == EXPECT["gelu"], first
    prog = load_program(PROGRAM)
    ids = prog.batch()
    tmodel, _ = prog.torch_model("eager")
    act = activation_difference(tmodel.layers[0].mlp.act_fn,
                                lambda: tmodel(input_ids=torch.from_numpy(ids)),
                                lambda x: jax.nn.gelu(x, approximate=False))
    r = tracediff.locate(traces["gelu"], explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    assert _module_b(r).startswith(WHERE["gelu"]), f.layer
    assert act / 2 <= f.metrics.max_abs <= 2 * act, (f.metrics.max_abs, act)


@pytest.mark.parametrize("bug", sorted(EXPECT))
def test_a_port_bug_is_never_a_match(traces, bug):
    _, first = truth(bug)
    assert first is not None and first[0] == EXPECT[bug], first
    r = tracediff.locate(traces[bug], explain=False)
    assert r.verdict != "match", (first, r.coverage)
    if r.verdict == "diverged":
        assert _module_b(r).startswith(WHERE[bug]), (r.first_beyond_tolerance.layer, first)
    else:
        assert r.exit_code == 3 and not r.coverage.sufficient


# -- a rotary table of another base (issue 52): FlaxLlama ignores `rope_theta`

@pytest.fixture(scope="module")
def rope_trace(tmp_path_factory):
    return record_cases(PROGRAM, {"rope": "rope"}, tmp_path_factory.mktemp("hf_llama_rope"))["rope"]


def test_a_rotary_base_the_port_ignores_is_found_at_the_rotary_tables(rope_trace):
    """`rope_theta` 500000: torch's cos/sin honour it, FlaxLlama's table hard-codes 10000.
    Each side computes its table from what only it has and the two disagree, so nothing
    that reads them pairs (before: INCONCLUSIVE, 16-18 % paired). The tables pair by role
    and the finding is there, with the truth's magnitude: torch's `rotary_emb` cos (a
    forward hook) against the Flax module's own table (its `create_sinusoidal_positions`);
    the truth's first module both sides have differs too (o_proj)."""
    import numpy as np
    import torch
    from transformers.models.llama import modeling_flax_llama as flax_llama

    prog = load_program(PROGRAM)
    ids = prog.batch()
    tmodel, state = prog.torch_model("eager", "rope")
    seen = {}

    def keep(_m, _i, out):
        seen.setdefault("cos", out[0].detach().numpy())

    hook = tmodel.rotary_emb.register_forward_hook(keep)
    rows = module_differences(tmodel, lambda m: m(input_ids=torch.from_numpy(ids)),
                              *prog.flax_model(state, "none"), prog.flax_args(ids))
    hook.remove()
    dim = prog.HIDDEN // prog.HEADS
    table = np.asarray(flax_llama.create_sinusoidal_positions(16, dim))[:prog.LENGTH, 0]
    cos = float(np.abs(table[:, dim:] - seen["cos"][0]).max())
    first = next(r for r in rows if r[2])
    assert first[0].endswith("o_proj") and cos > 0.1, (first, cos)
    r = tracediff.locate(rope_trace, explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    assert f.layer["family"] == "table" and _module_b(r) == "rotary_emb", f.layer
    assert f.layer["module"]["a"].endswith("layers/0/self_attn/rotary_emb"), f.layer
    assert cos / 3 <= f.metrics.max_abs <= 3 * cos, (f.metrics.max_abs, cos)
