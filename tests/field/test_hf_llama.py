"""HF transformers' LlamaModel against its FlaxLlamaModel port (tests/field/programs/
hf_llama.py): rotary position embeddings, grouped-query attention, a gated SiLU MLP and
RMSNorm, random weights converted by transformers' own converter, the same token ids, in
torch's eager and SDPA attention.

The truth is computed here, independently of tracediff (torch forward hooks and Flax
`capture_intermediates`, paired by module path, hf_truth.py). What holds today: never a
MATCH where the truth differs or where too little was compared, never DIVERGED on the
correct port. What does not yet (strict xfails, measured): the pairing stops at the rotary
embedding of layer 0 (Flax gathers rows of a sin/cos table built in numpy, a constant;
torch computes cos and sin from its `inv_freq` buffer, a value only torch has, so nothing
that reads them pairs), so the correct port is INCONCLUSIVE at 16-18 % coverage and the
bugs after it are not located.
"""

import os

import pytest

import tracediff

from ..helpers import ROOT
from .hf_truth import load_program, module_differences, record_cases

pytestmark = pytest.mark.field

PROGRAM = os.path.join(ROOT, "tests", "field", "programs", "hf_llama.py")
CASES = {"eager": ["--attn", "eager", "--bug", "none"], "sdpa": ["--attn", "sdpa", "--bug", "none"],
         "gelu": "gelu", "eps": "eps", "oproj": "oproj"}
ROTARY = ("the pairing stops at layer 0's rotary embedding (torch's cos/sin come from its "
          "inv_freq buffer, a value only torch has; Flax gathers a numpy-built table): ")


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


@pytest.mark.xfail(strict=True, reason=ROTARY + "INCONCLUSIVE, a 16 of 95 units paired (17%), "
                   "b 15 of 88 (17%) in eager; a 15/94, b 14/79 in SDPA")
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_correct_port_matches_with_everything_compared(traces, attn):
    r = tracediff.locate(traces[attn], explain=False)
    assert r.verdict == "match" and r.coverage.sufficient, r.coverage.reasons
    for side in (r.coverage.a, r.coverage.b):
        assert side.paired >= 0.9 * side.events and side.compared >= 0.9 * side.events


# bug: the module the truth names (checked against it)
EXPECT = {
    "gelu": "layers.0.mlp.down_proj",         # silu -> gelu; the activation is no module
    "eps": "layers.0.input_layernorm",        # RMSNorm eps 1e-2, max abs 0.033
    "oproj": "layers.1.self_attn.o_proj",     # kernel transposed, max abs 0.044
}
XFAIL = {
    "gelu": ROTARY + "INCONCLUSIVE (17%/17%), the MLP after it never paired",
    "oproj": ROTARY + "INCONCLUSIVE (17%/17%), layer 1 never paired",
}   # eps: its headline was Flax's sqrt against torch's rsqrt (0.796); now the module's output


@pytest.mark.parametrize("bug", [pytest.param(b, marks=pytest.mark.xfail(strict=True,
                                                                         reason=XFAIL[b]))
                                 if b in XFAIL else b for b in EXPECT])
def test_port_bug_named_at_its_module_with_its_magnitude(traces, bug):
    _, first = truth(bug)
    r = tracediff.locate(traces[bug], explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, (first, r.coverage.reasons)
    f = r.first_beyond_tolerance
    assert f.layer["module"]["b"].replace("/", ".").startswith(first[0]), (f.layer, first)
    assert first[1] / 2 <= f.metrics.max_abs <= 2 * first[1], (f.metrics.max_abs, first)


@pytest.mark.parametrize("bug", sorted(EXPECT))
def test_a_port_bug_is_never_a_match(traces, bug):
    _, first = truth(bug)
    assert first is not None and first[0] == EXPECT[bug], first
    r = tracediff.locate(traces[bug], explain=False)
    assert r.verdict != "match", (first, r.coverage)
    if r.verdict == "diverged":
        b = r.first_beyond_tolerance.layer["module"]["b"].replace("/", ".")
        assert b.startswith(first[0]), (r.first_beyond_tolerance.layer, first)
    else:
        assert r.exit_code == 3 and not r.coverage.sufficient
