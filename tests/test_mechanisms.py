"""Mechanism hypotheses (diff/explain/mechanisms/) and exact references of fused expressions,
on real divergences: XLA's FMA contraction (compiled probe, default ISA vs SSE4.2), a
TF32-rounded addmm and MKL's reproducible (CBWR) code path (torch), division across JAX
versions (x / y vs x * (1/y)). Each side's mechanism is asserted by name. The recordings
are the session's (tests/conftest.recorded), shared with the other modules; the JAX 0.7.2
side of the division is bundled (fixtures/traces/, tests/record_other_jax.sh) unless
TRACEDIFF_OTHER_JAX_PYTHON names that JAX's Python.

Also run by .ci/run under the oldest supported JAX (torch is not installed there: the
torch cases are skipped), so explain and replay are tested on every supported JAX.
"""

import importlib.util
import io
import json
import os
import subprocess
from fractions import Fraction

import numpy as np
import pytest

import tracediff
from tracediff.diff.explain.mechanisms import dispatch, numerics, problems
from tracediff.diff.explain.mechanisms.precision import fix_for, ran_as_bf16_pass

from .conftest import (BF16_PASS, MKL_SSE, OTHER_JAX, PERTURB, TF32_ADDMM, TORCH_GRU_STEPS,
                       XLA_SSE4)
from .helpers import FIXTURES, ROOT

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (the oldest-JAX CI environment)")
PROBE = ("--probe", "^schedule$")


def explain(a, b, *extra):
    """What `tracediff explain A B [EVENT] --json` prints, and the same analysis as the
    terminal shows it (`print_analysis`): one `Analysis`, computed once in this process."""
    from rich.console import Console

    from tracediff.diff.locate import locate_with_analysis
    from tracediff.report.explain_terminal import print_analysis
    from tracediff.report.json_report import analysis_json

    _, analysis = locate_with_analysis(str(a), str(b), event=int(extra[0]) if extra else None)
    an = json.loads(json.dumps(analysis_json(analysis)))
    out = io.StringIO()
    print_analysis(analysis, Console(file=out, width=400, no_color=True, highlight=False,
                                     soft_wrap=True, emoji=False))
    return an, out.getvalue()


def best(an, side):
    """The first (best) mechanism of one side."""
    mine = [m for m in an["mechanisms"] if m["side"] == side]
    assert mine, an["replay"]
    return mine[0]


def named(an, side, name):
    return next(m for m in an["mechanisms"] if m["side"] == side and m["name"] == name)


# -- exact arithmetic -----------------------------------------------------------------------

def test_fused_multiply_add_is_rounded_once():
    # 1 + 2^-11 + 2^-24 + 2^-80: rounding to float64 first lands on a float32 midpoint, and
    # rounding that to float32 goes the wrong way; the emulated FMA does not
    a, c = np.float32(1 + 2 ** -12), np.float32(2.0 ** -80)
    assert numerics.fma32(a, a, c) == np.float32(1 + 2 ** -11 + 2 ** -23)
    assert np.float32(np.float64(a) * np.float64(a) + np.float64(c)) == np.float32(1 + 2 ** -11)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(300), rng.standard_normal(300)
    z = -(x * y) * (1 + 2.0 ** -50)   # near-total cancellation: the hard case
    got = numerics.fma64(x, y, z)
    assert all(got[i] == float(Fraction(x[i]) * Fraction(y[i]) + Fraction(z[i]))
               for i in range(300))


def test_tf32_rounding_keeps_ten_mantissa_bits():
    x = np.array([1 + 2 ** -10 + 2 ** -11, 1 + 2 ** -11, 1 + 2 ** -11 + 2 ** -20], np.float32)
    assert numerics._round_mantissa(x, 10, truncate=True).tolist() == \
        [1 + 2 ** -10, 1.0, 1.0]
    assert numerics._round_mantissa(x, 10, truncate=False).tolist() == \
        [1 + 2 ** -9, 1.0, 1 + 2 ** -10]   # ties to even, above the tie rounds up


# -- XLA's FMA contraction, seen through the compiled probe ------------------------------

@pytest.fixture(scope="module")
def fma(recorded):
    """jax_fused_fma.py with its compiled probe, default ISA and SSE4.2 (shared with
    tests/test_jax_locate.py)."""
    t = recorded.many({"a": ("jax_fused_fma.py", (), None, PROBE),
                       "b": ("jax_fused_fma.py", (), XLA_SSE4, PROBE)})
    return t["a"], t["b"]


def test_fma_contraction_is_named_and_judged_against_the_whole_expression(fma):
    an, text = explain(*fma)
    o = an["origin"]["a"]
    assert o["op"] == "add" and o["origin"] == "probe" and an["origin"]["inputs_match"] is True
    # a (default ISA): t * rate + offset rounded once; b (SSE4.2): the product rounded first
    assert best(an, "a")["name"] == "fma" and best(an, "a")["bitwise"] is True
    assert best(an, "b")["name"] == "separate_multiply_add" and best(an, "b")["bitwise"] is True
    assert named(an, "a", "separate_multiply_add")["bitwise"] is False
    assert named(an, "b", "fma")["bitwise"] is False and named(an, "b", "fma")["max_ulp"] >= 1
    # the reference is the exact t * rate + offset, not the add of the rounded product
    rv = an["replay"]
    assert rv["oracle"]["expression"] is True and rv["oracle"]["op"].startswith("add(mul(")
    assert rv["closer"] == "a"
    fa, fb = rv["a"]["from_oracle"], rv["b"]["from_oracle"]
    assert fa["max_ulp_exact"] <= 0.5 < fb["max_ulp_exact"]   # a is correctly rounded
    assert "a is closer to the exact value of add(mul(" in rv["verdict"]
    assert "a's add is reproduced bitwise by fused multiply-add" in text
    assert "b's add is reproduced bitwise by separate multiply and add" in text


# -- torch: a TF32 addmm, MKL's reproducible code path ---------------------------------------

@pytest.fixture(scope="module")
def linear(recorded):
    """torch_linear.py plain and with TF32-rounded addmm inputs, and the addmm's event."""
    t = recorded.many({"plain": ("torch_linear.py", (), None),
                       "tf32": ("torch_linear.py", (), TF32_ADDMM)})
    with tracediff.load(t["plain"]) as tr:
        addmm = next(i for i in range(len(tr)) if tr.event(i)["op"] == "aten::addmm")
    return t["plain"], t["tf32"], addmm


@needs_torch
def test_tf32_inputs_reproduce_the_tf32_addmm(linear):
    plain, tf32, addmm = linear
    an, text = explain(plain, tf32, addmm)
    assert an["origin"]["a"]["op"] == "aten::addmm" and an["origin"]["inputs_match"] is True
    m = best(an, "b")
    assert m["name"] == "tf32_inputs" and m["bitwise"] is True and "TF32" in m["note"]
    assert named(an, "a", "tf32_inputs")["bitwise"] is False
    assert best(an, "a")["bitwise"] is True and best(an, "a")["name"] != "tf32_inputs"
    assert "b's aten::addmm is reproduced bitwise by TF32-rounded inputs (an Ampere" in text


@needs_torch
def test_mkl_compatible_path_is_named_as_products_rounded_before_the_sum(recorded):
    args = ("--steps", TORCH_GRU_STEPS)   # shared with test_explain, test_levels
    a, b = recorded("torch_gru_adam.py", *args), recorded("torch_gru_adam.py", *args, env=MKL_SSE)
    an, text = explain(a, b)
    assert an["origin"]["a"]["op"] in ("aten::addmm", "aten::mm")
    assert an["origin"]["inputs_match"] is True
    # MKL_CBWR=COMPATIBLE runs MKL's SSE code path on every x86 CPU: no FMA (for this
    # GRU's shapes: k summed in order, each product rounded before it is added)
    m = best(an, "b")
    assert m["bitwise"] is True and m["name"] in ("separate_multiply_add", "summation_order")
    assert "FMA" not in m["note"]
    assert named(an, "b", "fma")["bitwise"] is False
    a = best(an, "a")
    assert a["bitwise"] is True and a != m
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        if " fma " in fh.read():   # MKL's own kernel on an FMA CPU fuses the products
            assert a["name"] == "fma" or "FMA" in a["note"]
    assert "b's aten::" in text and "is reproduced bitwise by" in text


# -- division across JAX versions ----------------------------------------------------------

# jax_divide.py recorded under the oldest supported JAX (0.7.2) with
# `tests/record_other_jax.sh`; recorded fresh when TRACEDIFF_OTHER_JAX_PYTHON names that
# JAX's Python (CI does), as tests/conftest.two_jax_versions does for the GRU example
OLD_JAX_DIVIDE = os.path.join(FIXTURES, "traces", "jax_divide.jax-0.7.2.h5")


def _jax_version(python):
    out = subprocess.run([python, "-c", "import jax; print(jax.__version__)"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


def test_division_across_jax_versions_is_reciprocal_multiply_on_one_side(recorded,
                                                                          tmp_path):
    import jax

    new = recorded("jax_divide.py")
    if OTHER_JAX:
        old_version = _jax_version(OTHER_JAX)
        if old_version == jax.__version__:
            pytest.skip(f"TRACEDIFF_OTHER_JAX_PYTHON runs this JAX ({old_version})")
        old = tmp_path / "old.h5"
        env = dict(os.environ, PYTHONPATH=ROOT)
        env.pop("XLA_FLAGS", None)
        proc = subprocess.run([OTHER_JAX, "-m", "tracediff", "record", "-o", str(old),
                               os.path.join(FIXTURES, "jax_divide.py")], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        old, old_version = OLD_JAX_DIVIDE, "0.7.2"
        if jax.__version__ == old_version:
            pytest.skip("this is the JAX of the bundled trace")
    an, text = explain(old, new)
    assert an["origin"]["a"]["op"] == "div" and an["origin"]["inputs_match"] is True
    # JAX 0.7 divides (correctly rounded); JAX 0.10 multiplies by the reciprocal of a
    # scalar divisor
    assert {s: (best(an, s)["name"], best(an, s)["bitwise"]) for s in "ab"} == {
        "a": ("correctly_rounded", True), "b": ("reciprocal_multiply", True)}, \
        (old_version, jax.__version__)
    assert "b's div is reproduced bitwise by division as multiplication by the reciprocal" in text


# -- convolutions (issue 51): a Flax CNN, its convolutions run as one bf16 pass ---------------

FIX = 'jax.default_matmul_precision("highest")'


@pytest.fixture(scope="module")
def cnn(recorded):
    """fixtures/flax_cnn_adam.py plainly and with XLA:CPU's float32 convolutions (and
    matmuls) run as a TPU runs them at default precision, one bf16 pass
    (tests/perturb/bf16_pass: the trace still holds a float32 conv of float32 inputs); and
    the convolutions of step 0 (forward, and three of the backward pass: other dimension
    numbers, strides, lhs dilation)."""
    runs = recorded.many({"plain": ("flax_cnn_adam.py", (), None),
                          "bf16": ("flax_cnn_adam.py", (), BF16_PASS)})
    with tracediff.load(runs["plain"]) as t:
        convs = [i for i in range(len(t)) if t.event(i)["op"] == "conv_general_dilated"
                 and t.event(i)["step"] == 0]
    return runs["plain"], runs["bf16"], convs


def _replayed(path, ev):
    """(call, inputs, recorded output) of one event, as explain rebuilds them."""
    from tracediff.diff.align import sequence
    from tracediff.diff.explain.replay.calls import build_call, recorded_output_size
    from tracediff.diff.explain.verdict import trace_inputs
    from tracediff.trace import schema
    from tracediff.trace.blob import ValueReader

    with tracediff.load(path) as t:
        reader = ValueReader(t)
        inputs = trace_inputs(t, sequence.prepare(t, sequence.StringIds()), reader, ev)
        e = t.event(ev)
        call = build_call(e["framework"], e["op"], e["params"], len(inputs),
                          recorded_output_size(t, ev))
        out = reader.read(t.value_rows(ev, schema.ROLE_OUT)[0])
    return call, inputs, out


@pytest.mark.deep
def test_a_recorded_conv_replays_bitwise_and_its_float64_oracle_is_within_a_few_ulp(cnn):
    """Before: the params were cut at 60/240 characters and conv_general_dilated was not
    on the allow-list: "cannot replay"."""
    from tracediff.diff.compare import values as compare

    plain, _, convs = cnn
    assert len(convs) >= 5
    for ev in convs:
        call, inputs, recorded = _replayed(plain, ev)
        dims = call.params["dimension_numbers"]
        assert dims[0] == "conv_dims" and len(dims[1]) == 3 and "window_strides" in call.params
        out = call.run(inputs)[0]
        assert out.dtype == recorded.dtype and out.tobytes() == recorded.tobytes(), ev
        exact = call.run(inputs, upcast=True)[0]
        assert exact.dtype == np.float64 and exact.shape == recorded.shape
        # float32 sums of up to 2048 products: a few ULP of the output's largest value
        # (elements near zero, where terms cancel, are many of their own ULP off)
        top = np.abs(exact).max()
        assert np.abs(recorded - exact).max() <= 8 * np.spacing(np.float32(top)), ev
        assert np.median(compare.ulp_distance(exact.astype(np.float32), recorded,
                                              "float32")) <= 2


@pytest.mark.deep
def test_a_conv_run_as_one_bf16_pass_is_named_bf16_inputs_on_that_side_only(cnn):
    """Before: a conv had no mechanism family (no mechanisms at all) and could not be
    replayed."""
    from tracediff.diff.explain.verdict import replay_verdict
    from tracediff.diff.differ import Differ

    plain, bf16, convs = cnn
    an, text = explain(plain, bf16)
    o = an["origin"]
    assert o["a"]["op"] == "conv_general_dilated" and o["a"]["index"] == convs[0]
    assert o["inputs_match"] is True
    rv = an["replay"]
    assert rv["a"]["reproduced_here"] is True and rv["reproduces"] == "a"
    m = best(an, "b")
    assert m["name"] == "bf16_inputs" and m["bitwise"] is True and "bfloat16" in m["note"]
    assert named(an, "a", "bf16_inputs")["bitwise"] is False
    assert best(an, "a")["name"] != "bf16_inputs"
    assert {m["name"] for m in an["mechanisms"] if m["side"] == "a"} == {
        "tf32_inputs", "bf16_inputs", "fp16_inputs", "float64_accumulation"}
    assert "b's conv_general_dilated is reproduced bitwise by a bf16 pass" in text
    assert FIX in rv["mechanism"]
    with tracediff.load(plain) as ta, tracediff.load(bf16) as tb:
        res = replay_verdict(Differ(ta, tb), convs[0], convs[0])
    by = {(m.side, m.name): m for m in res.mechanisms}
    assert by["b", "bf16_inputs"].bitwise is True and by["a", "bf16_inputs"].bitwise is False
    # the other side is nearest its exact result rounded (XLA:CPU's float32 conv)
    assert res.mechanisms[0].side == "a" and res.mechanisms[0].name == "float64_accumulation"


@pytest.mark.deep
def test_a_float32_conv_on_a_tpu_at_default_precision_is_one_bf16_pass(cnn):
    """The recorded conv's own parameters (precision None, no preferred type): a TPU runs
    it as one bf16 pass unless the op or the process raises the precision. Before: only
    matmuls were."""
    from tracediff.diff.explain import causes
    from tracediff.diff.explain.replay.params import Named

    plain, _, convs = cnn
    params = _replayed(plain, convs[0])[0].params
    op = "conv_general_dilated"
    assert ran_as_bf16_pass("tpu", op, params, None) is True
    assert ran_as_bf16_pass("cpu", op, params, None) is False
    assert ran_as_bf16_pass("tpu", op, params, "highest") is False
    highest = Named("precision", "HIGHEST")
    default = Named("precision", "DEFAULT")
    for precision, pass_ in ((default, True), ((default, default), True), (highest, False),
                             ((highest, default), False)):
        assert ran_as_bf16_pass("tpu", op, {**params, "precision": precision},
                                None) is pass_
    bf16_out = {**params, "preferred_element_type": Named("np_dtype", "bfloat16")}
    f32_out = {**params, "preferred_element_type": Named("np_dtype", "float32")}
    assert ran_as_bf16_pass("tpu", op, bf16_out, None) is False
    assert ran_as_bf16_pass("tpu", op, f32_out, None) is True
    cause = causes.bf16_pass_cause({"a": ("jax", "tpu", op, params, None),
                                    "b": ("torch", "", "aten::convolution", {}, None)})
    assert "computes a float32 convolution as one bfloat16 pass" in cause.reason
    assert FIX in cause.reason and fix_for("bf16_inputs", "jax").startswith(FIX)
    assert causes.op_class("conv_general_dilated") == "matmul"
    assert causes.op_class("convert_element_type") == "elementwise"   # not a conv


@needs_torch
def test_a_torch_conv_replays_and_its_float64_accumulation_is_nearest(recorded):
    """fixtures/port_conv.py's torch side: aten::convolution with its bias (a third input),
    replayed bitwise; rewritten as dot products, the float64 accumulation is its nearest
    hypothesis. Before: aten::convolution was not on the allow-list."""
    t = recorded("port_conv.py", "--side", "torch")
    with tracediff.load(t) as tr:
        ev = next(i for i in range(len(tr)) if tr.event(i)["op"] == "aten::convolution")
    call, inputs, recorded_out = _replayed(t, ev)
    assert len(inputs) == 3 and call.run(inputs)[0].tobytes() == recorded_out.tobytes()
    case = problems.Case(side="a", framework="torch", op="aten::convolution",
                         params=call.params, inputs=inputs, outputs=[recorded_out],
                         kernel=call.run, wide=lambda xs: call.run(xs, upcast=True))
    found = dispatch.side_mechanisms(case)
    assert found[0].name == "float64_accumulation" and found[0].max_ulp < 1e4
    assert dispatch.family(case)[0] == "convolution"
