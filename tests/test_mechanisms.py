"""Mechanism hypotheses (diff/mechanisms.py) and exact references of fused expressions,
on real divergences: XLA's FMA contraction (compiled probe, default ISA vs SSE4.2), a
TF32-rounded addmm and MKL's reproducible (CBWR) code path (torch), division across JAX
versions (x / y vs x * (1/y)). Each side's mechanism is asserted by name.

Also run by .ci/run under the oldest supported JAX (torch is not installed there: the
torch cases are skipped), so explain and replay are tested on every supported JAX.
"""

import importlib.util
import io
import json
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from click.testing import CliRunner

from tracediff.cli import main as cli_main
from tracediff.diff import mechanisms

from .helpers import FIXTURES, ROOT, record_many

PERTURB = os.path.join(ROOT, "tests", "perturb")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (the oldest-JAX CI environment)")


def explain(a, b, *extra):
    """`tracediff explain A B [EVENT] --json` in this process, and that analysis as the
    terminal shows it (`print_analysis`)."""
    from rich.console import Console

    from tracediff.diff.explain import print_analysis

    res = CliRunner().invoke(cli_main, ["explain", str(a), str(b), *map(str, extra), "--json"],
                             catch_exceptions=False)
    assert res.exit_code in (0, 1), res.output
    an = json.loads(res.stdout)
    out = io.StringIO()
    print_analysis(an, Console(file=out, width=400, no_color=True, highlight=False,
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
    assert mechanisms.fma32(a, a, c) == np.float32(1 + 2 ** -11 + 2 ** -23)
    assert np.float32(np.float64(a) * np.float64(a) + np.float64(c)) == np.float32(1 + 2 ** -11)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(300), rng.standard_normal(300)
    z = -(x * y) * (1 + 2.0 ** -50)   # near-total cancellation: the hard case
    got = mechanisms.fma64(x, y, z)
    assert all(got[i] == float(Fraction(x[i]) * Fraction(y[i]) + Fraction(z[i]))
               for i in range(300))


def test_tf32_rounding_keeps_ten_mantissa_bits():
    x = np.array([1 + 2 ** -10 + 2 ** -11, 1 + 2 ** -11, 1 + 2 ** -11 + 2 ** -20], np.float32)
    assert mechanisms._round_mantissa(x, 10, truncate=True).tolist() == \
        [1 + 2 ** -10, 1.0, 1.0]
    assert mechanisms._round_mantissa(x, 10, truncate=False).tolist() == \
        [1 + 2 ** -9, 1.0, 1 + 2 ** -10]   # ties to even, above the tie rounds up


# -- XLA's FMA contraction, seen through the compiled probe ------------------------------

@pytest.fixture(scope="module")
def fma(tmp_path_factory):
    d = tmp_path_factory.mktemp("fma")
    probe = (["--probe", "^schedule$"],)
    jobs = {"avx": ("jax_fused_fma.py", d / "a.h5", (), None, *probe),
            "sse": ("jax_fused_fma.py", d / "b.h5", (), {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"},
                    *probe)}
    record_many(jobs)
    return d / "a.h5", d / "b.h5"


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
def linear(tmp_path_factory):
    d = tmp_path_factory.mktemp("linear")
    jobs = {"plain": ("torch_linear.py", d / "plain.h5", (), None),
            "tf32": ("torch_linear.py", d / "tf32.h5", (),
                     {"PYTHONPATH": os.path.join(PERTURB, "tf32_addmm")}),
            "cbwr": ("torch_linear.py", d / "cbwr.h5", (), {"MKL_CBWR": "COMPATIBLE"})}
    record_many(jobs)
    import tracediff

    with tracediff.load(d / "plain.h5") as t:
        addmm = next(i for i in range(len(t)) if t.event(i)["op"] == "aten::addmm")
    return d, addmm


@needs_torch
def test_tf32_inputs_reproduce_the_tf32_addmm(linear):
    d, addmm = linear
    an, text = explain(d / "plain.h5", d / "tf32.h5", addmm)
    assert an["origin"]["a"]["op"] == "aten::addmm" and an["origin"]["inputs_match"] is True
    m = best(an, "b")
    assert m["name"] == "tf32_inputs" and m["bitwise"] is True and "TF32" in m["note"]
    assert named(an, "a", "tf32_inputs")["bitwise"] is False
    assert best(an, "a")["bitwise"] is True and best(an, "a")["name"] != "tf32_inputs"
    assert "b's aten::addmm is reproduced bitwise by TF32-rounded inputs (an Ampere" in text


@needs_torch
def test_mkl_compatible_path_is_a_summation_order_without_fma(linear):
    d, addmm = linear
    an, _ = explain(d / "plain.h5", d / "cbwr.h5", addmm)
    assert an["origin"]["inputs_match"] is True
    # MKL_CBWR=COMPATIBLE runs the SSE kernel on every x86 CPU: 4 float lanes, no FMA
    m = best(an, "b")
    assert m["name"] == "summation_order" and m["bitwise"] is True
    assert "4 SIMD lanes" in m["note"] and "FMA" not in m["note"]
    a = best(an, "a")
    assert a["bitwise"] is True and a != m
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        if " fma " in fh.read():   # MKL's own kernel on an FMA CPU fuses the products
            assert a["name"] == "fma" or "FMA" in a["note"]


# -- division across JAX versions ----------------------------------------------------------

OTHER = os.environ.get("TRACEDIFF_OTHER_JAX_PYTHON")


def _jax_version(python):
    out = subprocess.run([python, "-c", "import jax; print(jax.__version__)"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


@pytest.mark.skipif(not OTHER, reason="TRACEDIFF_OTHER_JAX_PYTHON not set (.ci/run sets it)")
def test_division_across_jax_versions_is_reciprocal_multiply_on_one_side(tmp_path):
    import jax

    old_version = _jax_version(OTHER)
    if old_version == jax.__version__:
        pytest.skip(f"TRACEDIFF_OTHER_JAX_PYTHON runs this JAX ({old_version})")
    old, new = tmp_path / "old.h5", tmp_path / "new.h5"
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    script = os.path.join(FIXTURES, "jax_divide.py")
    procs = [subprocess.Popen([py, "-m", "tracediff", "record", "-o", str(out), script], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for py, out in ((OTHER, old), (sys.executable, new))]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    an, text = explain(old, new)
    assert an["origin"]["a"]["op"] == "div" and an["origin"]["inputs_match"] is True
    # JAX 0.7 divides (correctly rounded); JAX 0.10 multiplies by the reciprocal of a
    # scalar divisor
    assert {s: (best(an, s)["name"], best(an, s)["bitwise"]) for s in "ab"} == {
        "a": ("correctly_rounded", True), "b": ("reciprocal_multiply", True)}, \
        (old_version, jax.__version__)
    assert "b's div is reproduced bitwise by division as multiplication by the reciprocal" in text
