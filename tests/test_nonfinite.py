"""Where a NaN came from (`tracediff info`, the head of `locate`): the first op that made a
non-finite value from finite inputs and whose values the run kept, how, and where Inf
turned into NaN; on real recordings of fixtures/torch_nonfinite.py and jax_nonfinite.py.

What each program's answer is, checked by a dispatch mode and by `jax_debug_nans` (the
truths of tests/nonfinite_truth.py), is the field suite's (tests/field/test_nonfinite_field.py):
here the answers are written out, so a test fails on the op, phase, step or words."""

import json

import pytest

from .helpers import fixture_line, run_cli

TORCH = "torch_nonfinite.py"
JAX = "jax_nonfinite.py"


@pytest.fixture(scope="module")
def traces(recorded):
    return {k: str(p) for k, p in recorded.many({
        "norm": (TORCH, ("--case", "norm"), None),
        "norm_stats": (TORCH, ("--case", "norm"), None, ["--level", "stats"]),
        "mask": (TORCH, ("--case", "mask"), None),
        "causal": (TORCH, ("--case", "causal"), None),
        "log_ok": (TORCH, ("--case", "log", "--lr", "0.05"), None),
        "log_nan": (TORCH, ("--case", "log"), None),
        "sqrt": (JAX, ("--case", "sqrt"), None),
        "rms": (JAX, ("--case", "rms"), None),
    }).items()}


def _info(path):
    proc = run_cli("info", "--json", path, check=True)
    return json.loads(proc.stdout)["first_nonfinite"]


def test_a_backward_only_inf_is_the_origin_and_the_nan_after_it_is_propagation(traces):
    nf = _info(traces["norm"])
    # sqrt's backward divides by 2*sqrt(0) in step 0: Inf from finite inputs
    assert (nf["op"], nf["phase"], nf["step"], nf["kind"]) == \
        ("aten::div.Tensor", "backward", 0, "Inf")
    assert nf["inputs_finite"] is True and nf["kept"] is True
    assert nf["source"] == fixture_line(TORCH, "norm = torch.sqrt(")   # a backward op's forward line
    assert nf["mechanism"] == "division by zero: the divisor holds 1 zero"
    assert nf["element"] == "at [2]: div(0.25, 0) = inf"
    # ...and the pow's backward multiplies that Inf by the zero row: NaN, not an origin
    assert nf["nan_at"]["op"] == "aten::mul.Tensor" and nf["nan_at"]["phase"] == "backward"
    assert nf["nan_mechanism"].startswith("0 × Inf")
    assert [c["made"] for c in nf["chain"]][0] == "Inf" and nf["chain"][-1]["made"] == "NaN"
    assert nf["chain"][0]["event"] == nf["event"] and nf["chain"][-1]["event"] == nf["nan_at"]["index"]
    assert nf["kept_at"]["phase"] == "optimizer"


def test_a_stats_trace_names_the_same_origin_from_its_counts(traces):
    full, stats = _info(traces["norm"]), _info(traces["norm_stats"])
    for key in ("event", "op", "phase", "step", "kind", "source", "inputs_finite"):
        assert stats[key] == full[key], key
    assert stats["level"] == "statistics" and stats["element"] == ""
    assert stats["mechanism"].startswith("division by zero: the divisor holds 0 (min 0, max ")
    assert stats["nan_at"]["index"] == full["nan_at"]["index"]
    text = run_cli("info", traces["norm_stats"], check=True).stdout
    assert "found from the statistics of a --level stats trace" in text


def test_one_inside_jit(traces):
    nf = _info(traces["sqrt"])
    assert (nf["op"], nf["event_kind"], nf["step"], nf["phase"], nf["kind"]) == \
        ("sqrt", "eqn", 1, "forward", "NaN")
    assert nf["source"] == fixture_line(JAX, "jnp.sqrt(")
    assert nf["mechanism"] == "square root of a negative number: input min -5.743"
    assert nf["element"] == "sqrt(-5.743) = nan"
    assert nf["inputs"][0]["source"] == "sub" and nf["inputs"][0]["nan"] == 0


def test_a_gradient_transform_of_the_programs_own_is_the_optimizer(traces):
    """Inside one jit call, what reads the gradient outside it is the update, optax's
    frames or not: rsqrt(mean(g^2)) of a zero gradient, then 0 x Inf."""
    nf = _info(traces["rms"])
    assert (nf["op"], nf["phase"], nf["step"], nf["kind"]) == ("rsqrt", "optimizer", 0, "Inf")
    assert nf["mechanism"] == "rsqrt of zero: input min 0, max 0"
    assert (nf["nan_at"]["op"], nf["nan_at"]["phase"]) == ("mul", "optimizer")


def test_a_mask_the_softmax_absorbs_is_never_the_origin(traces):
    nf = _info(traces["mask"])
    assert (nf["op"], nf["step"], nf["kind"]) == ("aten::log", 0, "NaN")
    assert nf["absorbed"] == 1 and nf["first_absorbed"]["op"] == "aten::full"
    causal = _info(traces["causal"])        # a correct program: only the absorbed mask
    assert causal["kept"] is False and causal["op"] == "aten::full"
    assert "writes -inf given as an argument" in causal["mechanism"]
    # the mask is the one op that made them: it is not also counted absorbed before itself
    assert causal["absorbed"] == 0 and causal["first_absorbed"] is None
    text = run_cli("info", traces["causal"], check=True).stdout
    assert "no NaN or Inf reaches the results: 1 op made non-finite values" in text
    assert "first non-finite" not in text


def test_locate_says_first_that_b_holds_a_nan_a_has_not(traces):
    proc = run_cli("locate", traces["log_ok"], traces["log_nan"])
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("b holds NaN or Inf that a has not; its first non-finite: "
                               "aten::log (forward) step 3")
    assert "log of a negative number" in lines[2]
    data = json.loads(run_cli("locate", "--json", traces["log_ok"], traces["log_nan"]).stdout)
    assert data["nonfinite"]["only_in"] == "b" and data["nonfinite"]["a"] is None
    assert data["nonfinite"]["b"]["op"] == "aten::log"
    same = run_cli("locate", traces["causal"], traces["causal"], check=True).stdout
    assert "NaN" not in same.splitlines()[1]


def test_a_finite_trace_says_so(traces):
    assert _info(traces["log_ok"]) is None
    assert "no NaN or Inf: every recorded value is finite" in \
        run_cli("info", traces["log_ok"], check=True).stdout


DTYPES_PROGRAM = '''
import torch
x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.5, 2.0, float("nan")])
for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64):
    y = x.to(dtype) * 2                   # NaN, Inf, -Inf survive the product
    flag = torch.ones(3, dtype=torch.bool) & torch.tensor([True, False, True])  # odd sizes
    z = (y + 1).sum()                     # NaN: one value
    print(dtype, z)
'''


def test_counts_match_numpy_for_every_float_layout_and_alignment(tmp_path):
    """The exponent masks over the stored words (counts.py) against numpy on each value:
    float16, bfloat16, float32, float64, complex64, between values of 3 bytes (offsets
    that are no multiple of the word)."""
    import numpy as np

    from tracediff.diff.nonfinite.counts import Counts
    from tracediff.trace.reader import Trace
    from tracediff.trace.values import as_float64

    script = tmp_path / "dtypes.py"
    script.write_text(DTYPES_PROGRAM)
    run_cli("record", "-o", tmp_path / "d.h5", script, check=True)
    with Trace(tmp_path / "d.h5") as t:
        c = Counts(t)
        seen, misaligned = set(), 0
        for i, row in enumerate(t.values):
            x = t.read_value(row)
            if x is None:
                continue
            f = as_float64(x)
            want = (int(np.isnan(f).sum()), int(np.isinf(f).sum())) if f is not None else (0, 0)
            if np.iscomplexobj(f):     # real and imaginary parts count as elements
                want = (int(np.isnan(f.real).sum() + np.isnan(f.imag).sum()),
                        int(np.isinf(f.real).sum() + np.isinf(f.imag).sum()))
            assert (c.nan[i], c.inf[i]) == want, (t.string(row["dtype"]), x)
            seen.add(t.string(row["dtype"]))
            misaligned += int(row["offset"]) % 2 == 1
    assert {"float16", "bfloat16", "float32", "float64", "complex64"} <= seen
    assert misaligned   # the premise: some float values start at an odd byte
