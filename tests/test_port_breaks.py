"""Port bugs that break the pairing itself (issue 52): a conv whose stride changes its
output's shape, a rotary table built with another base, position ids that forgot the
padding offset. Each is DIVERGED at the module the truth names, with the truth's magnitude;
the truth is computed by the fixture itself, without tracediff (numpy, torch forward hooks,
Flax `capture_intermediates`). The correct ports still MATCH with every unit paired.

Before: the conv was found at `head` (a composite of the pooling paired, "all inputs
match"), the rotary base was INCONCLUSIVE (3 of 8 units paired, every compared value
equal), the positions were found at the `out` Linear after them.
"""

import os
import runpy
import subprocess
import sys

import numpy as np
import pytest

import tracediff

from .helpers import FIXTURES, ROOT, script_env

# CI's 'deep' stage (pytest -m deep): several recordings, each against its truth
pytestmark = pytest.mark.deep

JOBS = {
    "conv_stride": ("port_conv.py", "--bug", "stride"),
    "rotary_base": ("port_rotary.py", "--bug", "base"),
    "rotary_gain": ("port_rotary.py", "--bug", "gain"),
    "rotary_base_product": ("port_rotary.py", "--bug", "base", "--rotate-product"),
    "pos_offset": ("port_positions.py", "--padding-offset"),
    "pos_offset_bug": ("port_positions.py", "--padding-offset", "--bug", "pos"),
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("breaks")
    env = script_env()
    env.pop("XLA_FLAGS", None)
    out = {}
    for name, (script, *args) in JOBS.items():
        path = str(d / f"{name}.h5")
        p = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", path,
                            os.path.join(FIXTURES, script), *args], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        out[name], out[name + ":stdout"] = path, p.stdout
    return out


def _fixture(name):
    return runpy.run_path(os.path.join(FIXTURES, name))


def test_a_conv_stride_that_changes_the_shape_is_found_at_the_conv(traces):
    """Torch's conv1 has stride 2, Flax's 1: [2, 6, 6, 8] against [2, 8, 3, 3]. The two
    convs read the same image, kernel and bias: they pair, and the finding says what
    differs (the stride, the shapes) with the magnitude where the values meet again, the
    pooled features (truth: hook and capture_intermediates)."""
    shapes, pooled, _ = _fixture("port_conv.py")["truth"]("stride")
    r = tracediff.locate(traces["conv_stride"], explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    assert (f.layer["module"]["a"], f.layer["module"]["b"]) == ("CNN/conv1", "conv1"), f.layer
    sh = f.layer["shape"]
    assert [sh["a"], sh["b"]] == list(shapes), (sh, shapes)
    assert sh["text"] == "conv stride (1, 1) vs (2, 2); shape [2,6,6,8] vs [2,8,3,3]", sh
    assert f.inputs_match is True          # the same inputs: made here, not inherited
    assert pooled / 3 <= f.metrics.max_abs <= 3 * pooled, (f.metrics.max_abs, pooled)
    assert f.metrics.max_abs == pytest.approx(pooled, rel=1e-4)
    assert "where the values meet again" in f.note and sh["meet"]["b_op"] == "mean", f.note
    assert r.coverage.sufficient, r.coverage.reasons     # the whole of both sides compared
    # no rounding mechanism is sought between ops of other shapes (it compared 512 of 576
    # elements of two different convolutions and named the "closest" hypothesis)
    explained = tracediff.locate(traces["conv_stride"]).explain
    assert explained.verdict.startswith("not replayed: the two ops return other shapes"), \
        explained


def test_a_rotary_table_of_another_base_is_found_at_the_table(traces):
    """Flax's sin/cos table is built with base 500, torch's from `inv_freq` with 10000:
    each side computes it from what only it has, so nothing that reads it pairs. The tables
    pair by role (read by the same `q * cos`), and the finding is there, with the cos
    table's difference (numpy); the outputs' difference is said beside it."""
    fx = _fixture("port_rotary.py")
    bad, good = fx["sincos_table"](500.0)[:8], fx["sincos_table"]()[:8]
    cos = float(np.abs(bad[:, 8:] - good[:, 8:]).max())
    r = tracediff.locate(traces["rotary_base"], explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    assert f.layer["family"] == "table" and f.layer["module"]["a"] == "Rotary", f.layer
    assert "aten::cos" in f.layer["b"], f.layer
    assert cos / 3 <= f.metrics.max_abs <= 3 * cos, (f.metrics.max_abs, cos)
    assert f.metrics.max_abs == pytest.approx(cos, rel=1e-5)
    printed = float(traces["rotary_base:stdout"].split("max abs")[-1])    # the script's own
    assert f.layer["outputs"]["max_abs"] == pytest.approx(printed, rel=5e-3), f.layer
    assert not r.coverage.sufficient       # the divergence stands on what was compared


def test_of_two_tables_read_by_the_same_ops_the_closer_one_is_the_pair(traces):
    """Both sides rotate `q * sin` (--rotate-product): each side's cos and sin are read by
    a `mul` with q, so Flax's cos (base 500) has two candidates by role, torch's cos and
    sin. The closer one is its pair, and the finding is the cos table with the cos-to-cos
    difference (numpy), never the sin table with the difference of two other functions."""
    fx = _fixture("port_rotary.py")
    bad, good = fx["sincos_table"](500.0)[:8], fx["sincos_table"]()[:8]
    cos = float(np.abs(bad[:, 8:] - good[:, 8:]).max())
    sin = float(np.abs(bad[:, 8:] - good[:, :8]).max())
    assert sin > 1.5 * cos, (sin, cos)     # the premise: the distances tell them apart
    r = tracediff.locate(traces["rotary_base_product"], explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    assert f.layer["family"] == "table" and f.layer["module"]["a"] == "Rotary", f.layer
    assert "aten::cos" in f.layer["b"], f.layer
    assert f.metrics.max_abs == pytest.approx(cos, rel=1e-5), (f.metrics.max_abs, cos, sin)


def test_position_ids_that_forgot_the_padding_offset_are_found_at_the_lookup(traces):
    """HF RoBERTa's positions start after the padding index: torch computes them from the
    ids, Flax is given them. A port that forgot the offset looks up other rows of the same
    table: the two lookups pair by role, the finding is the position embedding with the
    truth's magnitude (numpy), and the indices are the input that differs."""
    truth = _fixture("port_positions.py")["truth"]("pos", padding_offset=True)
    r = tracediff.locate(traces["pos_offset_bug"], explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    assert (f.layer["module"]["a"], f.layer["module"]["b"]) == ("Embeddings/pos", "pos"), f.layer
    assert truth / 3 <= f.metrics.max_abs <= 3 * truth, (f.metrics.max_abs, truth)
    assert f.metrics.max_abs == pytest.approx(truth, rel=1e-5)
    assert f.inputs_match is False and "its indices differ" in f.inputs_reason, f.inputs_reason
    ok = tracediff.locate(traces["pos_offset"], explain=False)
    assert ok.verdict == "match", ok.first_beyond_tolerance
    assert ok.coverage.a.paired == ok.coverage.a.events and \
        ok.coverage.b.paired == ok.coverage.b.events, ok.coverage


def test_outputs_that_differ_where_the_pairing_stops_are_diverged(traces):
    """Flax multiplies q by a numpy gain, torch divides it by the reciprocal of another:
    values of one side only, read by ops of two families, so nothing after them pairs and
    every compared value agrees (before: INCONCLUSIVE). The outputs differ: DIVERGED, bounded
    to the first unpaired region (the gain's ops on each side), with the outputs' magnitude
    (numpy's truth)."""
    flax_out, torch_out = _fixture("port_rotary.py")["numpy_forward"]("gain")
    truth = float(np.abs(flax_out - torch_out).max())
    r = tracediff.locate(traces["rotary_gain"], explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    assert f.pair_by.startswith("outputs") and f.inputs_match is None, f.pair_by
    assert (f.layer["module"]["a"], f.layer["module"]["b"]) == ("Rotary", ""), f.layer
    assert (f.layer["a"], f.layer["b"]) == ("mul in Rotary", "div in (top level)"), f.layer
    assert f.metrics.max_abs == pytest.approx(truth, rel=1e-4), (f.metrics.max_abs, truth)
    assert not r.coverage.sufficient


def test_the_first_unpaired_region_is_named_first(traces):
    """The regions named (and the `--map` suggested) start with the one nearest the paired
    frontier on each side, not the largest (before: torch's 5 units from #86 first, then
    Flax's 4 from #27, Flax's first unpaired unit, #20, last)."""
    r = tracediff.locate(traces["rotary_base"], explain=False)
    regions = r.coverage.unpaired
    for side in ("a", "b"):
        mine = [u for u in regions if u.side == side]
        assert mine and mine[0].start == min(u.start for u in mine), regions
    assert [u.side for u in regions[:2]] == ["a", "b"], regions
