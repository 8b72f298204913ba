"""HF transformers' CLIPTextModel against its FlaxCLIPTextModel port (tests/field/programs/
hf_clip_text.py), written as CLIP's documentation calls them: the Flax model given
`position_ids` of the batch's shape, torch reading its own [1, n] buffer.

Before coverage, `locate` said MATCH ("every compared value is bitwise identical", exit 0)
for the correct port and for every injected bug, having paired 3 of the torch side's ~50
computing units. The truth is computed here, independently of tracediff (torch forward
hooks and Flax `capture_intermediates`, paired by module path). Whatever the pairing
manages, tracediff must never say MATCH where the truth differs, never DIVERGED on the
correct port, and a MATCH must carry sufficient coverage.
"""

import os

import numpy as np
import pytest

import tracediff

from ..helpers import ROOT
from .hf_truth import first_differing, load_program, record_cases

pytestmark = pytest.mark.field

PROGRAM = os.path.join(ROOT, "tests", "field", "programs", "hf_clip_text.py")
CASES = {"correct": "none", "gelu": "gelu", "eps": "eps"}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return record_cases(PROGRAM, CASES, tmp_path_factory.mktemp("hf_clip"))


def truth(bug):
    """The first module whose output differs between the two models (hf_truth.py)."""
    import torch
    prog = load_program(PROGRAM)
    ids = prog.batch()
    tmodel, state = prog.torch_model("eager")
    fmodel, params = prog.flax_model(state, bug)
    pos = prog.flax_positions(ids, "batch", bug)
    return first_differing(tmodel, lambda m: m(input_ids=torch.from_numpy(ids)), fmodel,
                           params, (ids.astype(np.int32), np.ones_like(ids, np.int32), pos))


def test_correct_port_is_never_diverged_and_never_a_thin_match(traces):
    first, compared = truth("none")
    assert first is None and compared > 10          # the truth: every module agrees
    r = tracediff.locate(traces["correct"], explain=False)
    assert r.verdict in ("match", "inconclusive"), r.first_beyond_tolerance
    assert r.verdict != "match" or r.coverage.sufficient
    if r.verdict == "inconclusive":
        assert r.exit_code == 3 and r.coverage.reasons and r.coverage.next_step


@pytest.mark.parametrize("case", ["gelu", "eps"])
def test_a_port_bug_is_never_a_match(traces, case):
    first, _ = truth(CASES[case])
    assert first is not None                        # the truth: the port differs
    r = tracediff.locate(traces[case], explain=False)
    assert r.verdict != "match", (first, r.coverage)
    if r.verdict == "diverged":                     # then at the truth's module
        mod = r.first_beyond_tolerance.layer["module"]
        b = mod["b"].replace("/", ".")
        assert b.startswith(first) or first.startswith(b), (mod, first)
    else:
        assert r.verdict == "inconclusive" and not r.coverage.sufficient
