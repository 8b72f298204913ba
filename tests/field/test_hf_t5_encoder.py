"""HF transformers' T5EncoderModel against its FlaxT5EncoderModel port (tests/field/programs/
hf_t5_encoder.py): T5 v1.1's kind of config made tiny, random weights converted by
transformers' own converter, the same token ids; the Flax model run through the user's
`jnp.clip` shim for jax 0.10.

The truth is computed here, independently of tracediff (torch forward hooks and Flax
`capture_intermediates`, paired by module path): the first module whose output differs, and
by how much. The correct port MATCHes with (nearly) everything compared; each port bug is
DIVERGED at the truth's module with the truth's magnitude (within 2x) in the headline.

Before, the RMSNorm epsilon bug named the right module but its headline, 0.417, compared
Flax's `sqrt(var + eps)` with torch's `rsqrt(var + eps)` (reciprocals: two formulas whose
values never meet), while the module's output differs by 0.0018.
"""

import os

import numpy as np
import pytest

import tracediff

from ..helpers import ROOT
from .hf_truth import first_difference, load_program, record_cases

pytestmark = pytest.mark.field

PROGRAM = os.path.join(ROOT, "tests", "field", "programs", "hf_t5_encoder.py")
BUGS = ("eps", "buckets", "act")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return record_cases(PROGRAM, {b: b for b in ("none",) + BUGS},
                        tmp_path_factory.mktemp("hf_t5"))


def truth(bug):
    """(first differing module, its output's max abs difference, modules compared)."""
    import torch
    prog = load_program(PROGRAM)
    ids = prog.batch()
    tmodel, state = prog.torch_model()
    fmodel, params = prog.flax_model(state, bug)
    return first_difference(tmodel, lambda m: m(input_ids=torch.from_numpy(ids)), fmodel,
                            params, (ids.astype(np.int32), np.ones_like(ids, np.int32)))


def dotted(module):
    """A module path of either side as torch names it (Flax's root module dropped)."""
    parts = module.replace("/", ".").split(".")
    return ".".join(parts[1:] if parts and parts[0].startswith("Flax") else parts)


def test_correct_port_matches_with_everything_compared(traces):
    first, compared, _ = truth("none")
    assert first is None and compared > 30
    r = tracediff.locate(traces["none"], explain=False)
    assert r.verdict == "match" and r.exit_code == 0, (r.first_beyond_tolerance, r.coverage)
    c = r.coverage
    assert c.sufficient, c
    for side in (c.a, c.b):
        assert side.events > 50 and side.compared >= 0.9 * side.events, c


@pytest.mark.parametrize("bug", BUGS)
def test_a_port_bug_is_named_at_the_truths_module_with_its_magnitude(traces, bug):
    first, _, magnitude = truth(bug)
    assert first is not None and magnitude > 1e-4
    r = tracediff.locate(traces[bug], explain=False)
    assert r.verdict == "diverged", r.coverage
    f = r.first_beyond_tolerance
    mod = f.layer["module"]
    names = [dotted(mod["a"]), dotted(mod["b"])]
    # the truth's module or one it lies in (Flax's activation is a function, torch's a
    # module), never above the sub-layer (`encoder.block.0.layer.1`)
    assert any((first.startswith(m) or m.startswith(first)) and m.count(".") >= 4
               for m in names), (names, first)
    assert magnitude / 2 <= f.metrics.max_abs <= magnitude * 2, (f.metrics.max_abs, magnitude,
                                                                 f.note)
