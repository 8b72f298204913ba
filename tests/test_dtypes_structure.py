"""Structural and dtype differences (issue #27, items 1 and 3) on a small GPT-like model
(fixtures/torch_autocast.py): float32 against the same forward under
`torch.autocast("cpu", dtype=torch.bfloat16)`, a run with one extra op (the loss
scaled by 1 + 1e-6, or by exactly 1), and one whose embeddings make a float16 round trip
(`x.half().float()`: two inserted casts that change the values).

Truth, independent of tracediff: under autocast the first op whose output differs is the
attention's first linear (`c_attn`, an `addmm` with a bfloat16 output, after casts of its
input and weights that the float32 run does not have); the extra multiply sits on the
fixture's `loss * opts.loss_scale` line and changes every gradient after it.
"""


import pytest

from .helpers import fixture_line, locate_json, run_cli

SCRIPT = "torch_autocast.py"




C_ATTN_LINE = fixture_line(SCRIPT, "self.c_attn(self.ln_1(x))")
SCALE_LINE = fixture_line(SCRIPT, "loss = loss * opts.loss_scale")
LOSS_LINE = fixture_line(SCRIPT, "loss = F.cross_entropy")
ROUND_TRIP_LINE = fixture_line(SCRIPT, "x = x.half().float()")


@pytest.fixture(scope="module")
def runs(recorded):
    return recorded.many({"fp32": (SCRIPT, ()), "bf16": (SCRIPT, ("--autocast",)),
                          "scaled": (SCRIPT, ("--loss-scale", "1.000001")),
                          "identity": (SCRIPT, ("--loss-scale", "1")),
                          "round_trip": (SCRIPT, ("--half-round-trip",))})


def test_autocast_names_the_first_bfloat16_linear_and_says_why(runs):
    r = locate_json(runs["fp32"], runs["bf16"])
    f = r["first_beyond_tolerance"]
    assert r["verdict"] == "diverged"
    assert (f["a"]["op"], f["b"]["op"]) == ("aten::addmm", "aten::addmm")
    assert f["a"]["name_stack"] == "h.0.c_attn" and f["a"]["source"].endswith(C_ATTN_LINE)
    assert (f["a"]["dtypes"], f["b"]["dtypes"]) == (["float32"], ["bfloat16"])
    assert f["dtype_note"] == "float32 vs bfloat16: autocast on b (cpu bfloat16)"
    assert f["inputs_match"] is True and "match up to a dtype cast of input" in f["inputs_reason"]
    assert r["first_difference"]["a"]["index"] == f["a"]["index"]
    assert "structural" not in r   # the casts autocast inserts are not a structural difference
    assert "bfloat16" in r["explain"]["mechanism"] and "autocast" in r["explain"]["mechanism"]
    env = {e["key"]: (e["a"], e["b"]) for e in r["env_diff"]}
    assert env["frameworks.torch.autocast.used"] == ("never", "cpu bfloat16")
    # the attention block both runs computed is compared, not hidden in a gap
    assert r["alignment"]["only_in_b"] - r["alignment"]["only_in_a"] < 60
    out = run_cli("locate", runs["fp32"], runs["bf16"], "--no-explain",
                  env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert "dtype: float32 vs bfloat16: autocast on b (cpu bfloat16)" in out.stdout


def test_the_autocast_regions_are_in_the_manifest(runs):
    import tracediff

    with tracediff.load(runs["bf16"]) as t:
        ac = t.manifest["frameworks"]["torch"]["autocast"]
        assert ac["used"] == "cpu bfloat16"
        (first, end, dev, dtype), = ac["regions"]
        assert (dev, dtype) == ("cpu", "bfloat16")
        ops = [t.event(i)["op"] for i in range(first, end)]
        assert "aten::addmm" in ops and "aten::_to_copy" in ops
        # the region ends with the `with` block: the next op is the loss line's
        assert t.event(end)["source"] == LOSS_LINE
        assert t.event(first - 1)["op"] not in ("aten::addmm", "aten::_to_copy")
    with tracediff.load(runs["fp32"]) as t:
        assert t.manifest["frameworks"]["torch"]["autocast"] == {"used": "never", "regions": []}


def test_an_op_only_one_run_has_is_the_finding(runs):
    r = locate_json(runs["fp32"], runs["scaled"], "--no-explain")
    st = r["structural"]
    assert r["verdict"] == "diverged" and r["exit_code"] == 1
    assert st["first"] is True and st["side"] == "b"
    assert st["event"]["op"] == "aten::mul.Tensor" and st["event"]["source"] == SCALE_LINE
    assert st["text"] == f"only in b: aten::mul.Tensor at {SCALE_LINE}"
    assert st["consumers"] and st["gap"]["side"] == "b" and st["gap"]["length"] >= 1
    # every value difference comes after it (the backward of the scaled loss)
    assert r["first_difference"]["b"]["index"] > st["event"]["index"]
    out = run_cli("locate", runs["fp32"], runs["scaled"], "--no-explain",
                  env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert f"first difference: only in b: aten::mul.Tensor at {SCALE_LINE}" in out.stdout
    # the other way round: the op is only in a
    back = locate_json(runs["scaled"], runs["fp32"], "--no-explain")
    assert back["structural"]["side"] == "a" and back["structural"]["first"] is True


def test_an_extra_op_that_changes_no_value_is_not_a_difference(runs):
    r = locate_json(runs["fp32"], runs["identity"], "--no-explain")
    assert r["verdict"] == "match" and "structural" not in r



def test_inserted_casts_that_change_values_are_not_a_structural_difference(runs):
    """`x.half().float()`: two casts only b has, and what reads them differs. Casts are
    never a structural difference of their own (an inserted cast is what autocast
    does): the finding is the op that reads the rounded values, its input differing."""
    r = locate_json(runs["fp32"], runs["round_trip"], "--no-explain")
    assert r["verdict"] == "diverged" and "structural" not in r
    assert r["alignment"]["only_in_b"] == 4 and r["alignment"]["only_in_a"] == 0  # 2 casts, 2 steps
    gaps = r["alignment"]["gaps"]
    assert gaps and gaps[0]["side"] == "b" and gaps[0]["length"] == 2
    f = r["first_difference"]
    assert (f["a"]["op"], f["b"]["op"]) == ("aten::native_layer_norm",) * 2
    assert f["inputs_match"] is False and f["b"]["index"] == gaps[0]["start"] + 2


def test_a_dtype_only_gap_longer_than_the_edit_budget_is_still_paired(runs):
    """Autocast's region: b's ops compute in bfloat16 behind ~50 casts the float32 run
    does not have. The gap pass sets b's casts aside as well as a's, so the ops both runs
    computed pair even when the casts alone are more edits than the budget allows (kept
    in, the gap fell back to pairing by position and left ~150 ops unpaired)."""
    import numpy as np

    import tracediff
    from tracediff.diff.align import sequence as align

    with tracediff.load(runs["fp32"]) as ta, tracediff.load(runs["bf16"]) as tb:
        ids = align.StringIds()
        sa, sb = align.prepare(ta, ids), align.prepare(tb, ids)
        full = align.align(sa, sb)
        small = align.align(sa, sb, max_edits=10)
    assert int(sb.transparent.sum()) > 40 and small.fallback_regions >= 1
    left = [int(((al.b2a < 0) & ~sb.transparent).sum()) for al in (full, small)]
    assert left[1] <= left[0] < 30, left     # b's computing ops: as paired as with the full budget
    assert small.stats()["matched"] >= full.stats()["matched"]
