"""Root cause (`tracediff explain`, locate's `explain`/`chain`): params parsing and the
allow-list, --ulp and --noise on synthetic traces, and real divergences: the broken dot
kernel, MKL's reproducible (CBWR) code path, XLA limited to SSE4.2, a one-ULP tanh, Dense vs a TF32 Linear."""


import numpy as np
import pytest

import tracediff
from tracediff.diff.compare import values as compare
from tracediff.diff.explain.replay.calls import build_call
from tracediff.diff.explain.replay.params import CannotReplay, _py, parse_params
from tracediff.trace import schema

from . import synth
from .conftest import BROKEN_DOT, GRU_STEPS, MKL_SSE, TANH_ULP, TF32_ADDMM, TORCH_GRU_STEPS
from .helpers import explain_json, run_cli

F32 = np.float32


# -- parsing and safety -------------------------------------------------------------------------

def test_params_parse_literals_and_named_constants_only():
    p = parse_params("dimension_numbers=(((1,), (0,)), ((), ())), out_sharding=None, "
                     "precision=None, preferred_element_type=dtype('float32')")
    assert p["dimension_numbers"] == (((1,), (0,)), ((), ()))
    assert p["preferred_element_type"] == ("np_dtype", "float32")
    assert parse_params("other=2, memory_format=torch.preserve_format, 3=-1.5") == {
        "other": 2, "memory_format": ("torch_memfmt", "preserve_format"), "_pos3": -1.5}
    for bad in ("x=__import__('os').system('true')", "x=open('f')", "x=torch.load",
                "x=(lambda: 1)", "x=[1, 2, ...", "name='averyveryverylongname..."):
        with pytest.raises(CannotReplay):
            parse_params(bad)


def test_conv_dimension_numbers_are_an_allow_listed_constant_of_permutations():
    """A recorded `ConvDimensionNumbers(...)` is rebuilt as `lax.ConvDimensionNumbers` from
    three int permutations of one rank, never called by name. Before: "not a plain
    literal" for all of them."""
    specs = "lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1), out_spec=(0, 3, 1, 2)"
    p = parse_params(f"dimension_numbers=ConvDimensionNumbers({specs})")
    assert p["dimension_numbers"] == ("conv_dims", ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)))
    assert _py(p["dimension_numbers"], "jax") == f"lax.ConvDimensionNumbers({specs})"
    for bad in ("lhs_spec=(0, 0, 1, 2), rhs_spec=(3, 2, 0, 1), out_spec=(0, 3, 1, 2)",
                "lhs_spec=(0, 1, 2), rhs_spec=(3, 2, 0, 1), out_spec=(0, 3, 1, 2)",
                "lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1)",
                "lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1), out_spec=(0, 3, 1, 2), x=1",
                "lhs_spec=__import__('os'), rhs_spec=(3, 2, 0, 1), out_spec=(0, 3, 1, 2)",
                "(0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)"):
        with pytest.raises(CannotReplay):
            parse_params(f"dimension_numbers=ConvDimensionNumbers({bad})")
    with pytest.raises(CannotReplay):
        _py(p["dimension_numbers"], "torch")


def test_only_allow_listed_ops_are_rebuilt():
    with pytest.raises(CannotReplay, match="not on the list"):
        build_call("torch", "aten::uniform_", "", 1)
    with pytest.raises(CannotReplay, match="not on the list"):
        build_call("jax", "random_bits", "bit_width=32, shape=(2,)", 1)
    with pytest.raises(CannotReplay, match="not on the list"):
        build_call("torch", "os.system", "", 0)
    call = build_call("torch", "aten::addmm", "beta=0.5", 3)
    x = [np.ones(2, F32), np.ones((2, 3), F32), np.ones((3, 2), F32)]
    assert call.run(x)[0].tolist() == [[3.5, 3.5], [3.5, 3.5]]
    assert call.run(x, upcast=True)[0].dtype == np.float64


# -- tolerances -------------------------------------------------------------------------------

def test_ulp_tolerance():
    x = np.linspace(1, 2, 5).astype(F32)
    y = x.copy()
    y[1] = np.nextafter(np.nextafter(y[1], F32(9)), F32(9))   # 2 ULP
    assert not compare.compare_arrays(x, y, "float32", ulp=1)["within_tolerance"]
    assert compare.compare_arrays(x, y, "float32", ulp=2)["within_tolerance"]
    # ulp alone replaces rtol/atol: 2 ULP is within the float32 default rtol but not 1 ULP
    assert compare.compare_arrays(x, y, "float32")["within_tolerance"]
    # judged at a float32 input's precision, a float64 value may be N float32-ULP off
    z = x.astype(np.float64)
    assert compare.compare_arrays(z, z * (1 + 5e-8), "float64", ulp=1, tol_dtype="float32")[
        "within_tolerance"]
    assert not compare.compare_arrays(z, z * (1 + 5e-8), "float64", ulp=1)["within_tolerance"]


def _chain_events(x, noisy=1.0, bad=1.0):
    t = np.tanh(x) * F32(noisy)
    e = np.exp(t) * F32(bad)
    return [dict(kind=schema.KIND_INPUT, op="input", outs=[x]),
            dict(op="aten::tanh", outs=[t], ins=[(0, 0, 0)]),
            dict(op="aten::exp", outs=[e], ins=[(0, 1, 0)]),
            dict(op="aten::mul.Tensor", params="other=1000.0", outs=[e * F32(1000)],
                 ins=[(0, 2, 0)])]


def test_noise_floor_and_chain(tmp_path):
    x = np.linspace(-1, 1, 8).astype(F32)
    a = synth.write(tmp_path / "a.h5", _chain_events(x))
    a2 = synth.write(tmp_path / "a2.h5", _chain_events(x, noisy=1 + 1e-7))
    b = synth.write(tmp_path / "b.h5", _chain_events(x, noisy=1 + 1e-7, bad=1 + 1e-3))
    r = tracediff.locate(a, b)
    assert r.first_difference.a["op"] == "aten::tanh"
    assert [lk["a"]["op"] for lk in r.chain] == ["aten::tanh", "aten::exp", "aten::mul.Tensor"]
    assert r.chain[0]["role"].startswith("origin") and "last" in r.chain[-1]["role"]
    amp = r.chain[1]["amplification"]
    assert amp > 100   # exp turned a 1e-7 difference into 1e-3
    # tanh is nondeterministic on a's machine: exp, whose input then differs, is not an origin
    # at the bitwise level, the first difference left is exp, inherited
    r = tracediff.locate(a, b, noise=(a, a2))
    assert r.noise["nondeterministic_events"] >= 1 and r.noise["skipped"][0]["op"] == "aten::tanh"
    assert r.first_difference.a["op"] == "aten::exp" and r.first_difference.inputs_match is False
    d = tracediff.to_json(r)
    assert d["noise"]["skipped_total"] >= 1 and "explain" in d
    # the replay rebuilds tanh from its recorded input and the mul from its params
    assert "this machine reproduces" in r.explain["verdict"]


# -- real divergences -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dot(recorded):
    return recorded("torch_dot.py"), recorded("torch_dot.py", env=BROKEN_DOT)


def test_dot_verdict_convicts_the_machine_that_returned_zero(dot):
    a, b = dot
    an = explain_json(a, b)
    o = an["origin"]
    assert o["a"]["op"] == "aten::dot" and o["inputs_match"] is True and o["level"] == "bitwise"
    rv = an["replay"]
    assert rv["replayed"] and rv["oracle"]["computed_by"] == "float64"
    assert rv["reproduces"] == "a" and rv["closer"] == "a"
    assert rv["a"]["from_oracle"]["max_ulp"] == 0 and rv["b"]["from_oracle"]["max_ulp"] > 1e8
    assert [lk["a"]["op"] for lk in an["chain"]][:2] == ["aten::dot", "aten::mul.Tensor"]
    assert an["steps"][0]["loss"]["a"] == 28.0 and an["steps"][0]["loss"]["b"] == 0.0
    d = tracediff.to_json(tracediff.locate(str(a), str(b)))    # the same as locate --json
    assert d["explain"]["reproduced_here"] == "a" and d["chain"][0]["a"]["op"] == "aten::dot"
    assert "b returned 0" in d["explain"]["verdict"]
    proc = run_cli("explain", a, b, env={"NO_COLOR": "1"})
    assert proc.returncode == 1
    assert "this machine reproduces a bitwise, not b" in proc.stdout and "chain" in proc.stdout


def test_mkl_cbwr_origin_is_a_blas_call_and_the_cause_is_named(recorded):
    args = ("--steps", TORCH_GRU_STEPS)
    a, b = recorded("torch_gru_adam.py", *args), recorded("torch_gru_adam.py", *args, env=MKL_SSE)
    an = explain_json(a, b)
    o = an["origin"]
    assert o["a"]["op"] in ("aten::addmm", "aten::mm") and o["inputs_match"] is True
    assert an["replay"]["reproduces"] == "a"
    assert an["environment"]["op_class"] == "matmul"
    assert an["environment"]["causes"][0]["key"] == "env.MKL_CBWR"
    assert an["chain"][0]["a"]["index"] == o["a"]["index"] and len(an["chain"]) > 2
    assert an["steps"] and an["steps"][0]["max_rel"] > 0


@pytest.fixture(scope="module")
def gru(jax_gru, recorded):
    """The GRU+expm+Adam example (x64), plain and with XLA limited to SSE4.2 (the session's
    recordings); the Flax MLP under jit, plain and with tanh one ULP larger."""
    mlp = ("--mlp", "--jit")
    return {"a": jax_gru["a"][0], "isa": jax_gru["isa"][0],
            **recorded.many({"mlp": ("flax_dense.py", mlp, None),
                             "tanh": ("flax_dense.py", mlp, TANH_ULP)})}


def test_xla_isa_switch(gru):
    a, isa = gru["a"], gru["isa"]
    an = explain_json(a, isa, "--noise", a, a)
    o = an["origin"]
    assert o["inputs_match"] is True and o["a"]["step"] == 0
    assert an["noise"]["nondeterministic_events"] == 0
    rv = an["replay"]
    if rv["replayed"]:   # the origin is an op this machine can re-run: it reproduces a
        assert rv["reproduces"] == "a"
    cause = an["environment"]["causes"][0]
    assert cause["key"] == "env.XLA_FLAGS" and cause["b"] == "--xla_cpu_max_isa=SSE4_2"
    assert cause["reason"].startswith("--xla_cpu_max_isa: instruction set")   # its own reason
    info = an["chain_info"]
    assert info["reaches_target"] in (True, None)
    roles = [lk["role"] for lk in an["chain"]]
    assert "origin" in roles[0]
    if info["reaches_target"]:
        assert any("first_beyond_tolerance" in r for r in roles)
    # divergence over time: one row per optimizer step, loss of both runs
    assert len([s for s in an["steps"] if "max_rel" in s]) == int(GRU_STEPS)
    assert all(s["loss"]["rel"] > 0 for s in an["steps"] if "loss" in s)


def test_one_ulp_tanh(gru):
    an = explain_json(gru["mlp"], gru["tanh"], "--ulp", "0")
    o = an["origin"]
    assert o["a"]["op"] == "tanh" and o["metrics"]["max_ulp"] == 1 and o["inputs_match"] is True
    assert o["call"]["op"] == "jit:apply" and an["verdict"] == "diverged"   # --ulp 0: exact
    rv = an["replay"]
    assert rv["replayed"] and rv["reproduces"] == "a" and rv["oracle"]["computed_by"] == "float64"
    fa, fb = rv["a"]["from_oracle"], rv["b"]["from_oracle"]
    assert abs(fb["max_ulp_exact"] - fa["max_ulp_exact"]) <= 1.0 + 1e-9   # XLA tanh: ~3 ULP
    assert an["environment"]["op_class"] == "transcendental"


def test_float64_op_is_judged_against_long_double(tmp_path):
    if np.finfo(np.longdouble).nmant <= 52:
        pytest.skip("long double is float64 here")
    x = np.linspace(-2, 2, 64)
    y = np.tanh(x.astype(np.longdouble)).astype(np.float64)     # correctly rounded
    up = np.nextafter(y, np.inf)                                   # one ULP up everywhere

    def evs(out):
        return [dict(kind=schema.KIND_INPUT, op="input", outs=[x], framework=schema.FW_JAX),
                dict(kind=schema.KIND_EAGER, op="tanh", params="accuracy=None", outs=[out],
                     ins=[(0, 0, 0)])]

    r = tracediff.locate(synth.write(tmp_path / "a.h5", evs(y)),
                         synth.write(tmp_path / "b.h5", evs(up)))
    assert r.explain["exact_by"] == "numpy long double"
    assert r.explain["a_ulp_from_exact"] == 0 and r.explain["b_ulp_from_exact"] == 1
    assert "a is closer" in r.explain["verdict"]


def test_dense_vs_tf32_linear_says_which_framework_is_closer_to_exact(recorded):
    a, b = recorded("flax_dense.py"), recorded("torch_linear.py", env=TF32_ADDMM)
    an = explain_json(a, b)
    rv = an["replay"]
    assert rv["oracle"]["op"].startswith("aten::addmm") and rv["oracle"]["from"] == "b"
    assert rv["closer"] == "a" and rv["b"]["from_oracle"]["max_ulp"] > 100 * max(
        1, rv["a"]["from_oracle"]["max_ulp"])
    assert rv["b"]["reproduced_here"] is False
    assert an["environment"]["op_class"] == "matmul"


def test_version_difference_is_related_to_the_origin(two_jax_versions):
    old, new = two_jax_versions
    an = explain_json(old, new)
    o = an["origin"]
    assert o["inputs_match"] is True and o["a"]["step"] == 0
    cause = an["environment"]["causes"][0]
    assert cause["key"] in ("packages.jax", "packages.jaxlib")
    assert "changed between" in cause["reason"] and o["a"]["op"] in cause["reason"]


def test_compiled_call_divergence_is_named(tmp_path):
    from .test_locate import _jax_call

    x = np.linspace(0, 1, 5)
    mid, out = np.sin(x), np.cos(np.sin(x))
    a = synth.write(tmp_path / "a.h5", _jax_call(x, mid, out, out))
    b = synth.write(tmp_path / "b.h5", _jax_call(x, mid, out, out * 1.1))
    an = explain_json(a, b)
    assert an["origin"]["a"]["kind"] == "call" and an["compiled_call"]["call"] == "jit:f"
    assert "compiled" in an["compiled_call"]["explanation"]
    assert an["replay"]["replayed"] is False and "compiled call" in an["replay"]["verdict"]
    r = tracediff.locate(a, b)
    assert "compiled_call" in r.explain and "compiled-call divergence" in r.explain["summary"]


def test_explain_event_argument_and_bad_event(dot):
    a, b = dot
    an = explain_json(a, b, "2")   # the mul after the dot: inherited, replayed from its inputs
    assert an["origin"]["a"]["op"] == "aten::mul.Tensor" and an["origin"]["inputs_match"] is False
    assert an["replay"]["reproduces"] == "both"   # each side's mul from its own inputs
    proc = run_cli("explain", a, b, "999")
    assert proc.returncode == 2 and "no event 999" in proc.stderr


def test_the_high_precision_reference_is_computed_in_float64(tmp_path):
    """1 + 2**-30 is 1 in float32 and exact in float64: the replay's `upcast=True` run
    (torch and JAX) returns the float64 sum, not a float32 result widened, and the replay
    verdict measures each side against it (a's correctly rounded 1.0 is 3/128 of a
    float32 ULP from the exact sum: 0 against a float32 reference)."""
    from tracediff.diff.differ import Differ
    from tracediff.diff.explain.verdict import replay_verdict
    from tracediff.trace import schema

    from . import synth

    x = np.array([1.0, 1.0], F32)
    y = np.array([2.0 ** -30, 3 * 2.0 ** -30], F32)
    exact = x.astype(np.float64) + y.astype(np.float64)
    assert (x + y).tolist() == [1.0, 1.0] and exact[1] != 1.0
    for framework, op in (("torch", "aten::add.Tensor"), ("jax", "add")):
        call = build_call(framework, op, "", 2)
        low, high = call.run([x, y])[0], call.run([x, y], upcast=True)[0]
        assert np.asarray(low).dtype == F32 and np.asarray(low).tolist() == [1.0, 1.0]
        assert np.asarray(high).dtype == np.float64 and np.asarray(high).tolist() == exact.tolist()

    def events(out):
        return [dict(kind=schema.KIND_INPUT, op="input", outs=[x]),
                dict(kind=schema.KIND_INPUT, op="input", outs=[y]),
                dict(op="aten::add.Tensor", outs=[out], ins=[(0, 0, 0), (1, 1, 0)])]

    a = synth.write(str(tmp_path / "a.h5"), events(x + y))
    b = synth.write(str(tmp_path / "b.h5"), events(np.nextafter(x + y, F32(2))))
    with tracediff.load(a) as ta, tracediff.load(b) as tb:
        res = replay_verdict(Differ(ta, tb), 2, 2)
    assert res.oracle.computed_by == "float64" and res.reproduces == "a"
    assert res.a.from_oracle.max_ulp == 0 and res.b.from_oracle.max_ulp == 1
    assert res.a.from_oracle.max_ulp_exact == pytest.approx(3 / 128)
    assert res.closer == "a"


# -- a divergence that is only structural (issue 38) -------------------------------------------

def test_explain_says_a_divergence_is_only_structural(recorded):
    """fixtures/torch_inserted_op.py with --insert has one extra multiply and no value that
    differs. Before: "DIVERGED (beyond tolerance: yes)", then "the traces match bitwise:
    nothing to explain"."""
    from .helpers import fixture_line

    runs = recorded.many({"a": ("torch_inserted_op.py", ()),
                          "b": ("torch_inserted_op.py", ("--insert",))})
    line = fixture_line("torch_inserted_op.py", "x = x * 1.000001")
    proc = run_cli("explain", runs["a"], runs["b"], env={"NO_COLOR": "1", "COLUMNS": "300"})
    assert proc.returncode == 1, proc.stderr
    head, summary = proc.stdout.splitlines()[:2]
    assert head == "DIVERGED (an op only one run has)"
    assert summary.startswith(f"the first difference is structural: only in b: "
                              f"aten::mul.Tensor at {line} (step 0, b #1)")
    assert "aten::sign (b #2)" in summary and "match bitwise" not in proc.stdout
    d = explain_json(runs["a"], runs["b"])
    assert d["origin"] is None and d["structural"]["side"] == "b"
    assert d["structural"]["event"]["op"] == "aten::mul.Tensor"
    assert d["structural"]["event"]["source"] == line


# -- explain's verdict is locate's ----------------------------------------------------------------

def _coverage_block(text):
    """The coverage lines of a terminal output, from "coverage:" to the next step."""
    lines = text.splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith("coverage: "))
    return [x for x in lines[i:] if x.startswith(("coverage: ", "          ", "not enough",
                                                    "below the bar", "unpaired: ", "next step: "))]


@pytest.mark.parametrize("case", ["metadata_only", "map_pairs_nothing"])
def test_explain_on_an_inconclusive_pair_says_what_locate_says(recorded, tmp_path, case):
    """Where locate says INCONCLUSIVE (a golden of metadata-only values: nothing compared;
    a map that pairs no computing unit of a training loop whose metric really differs),
    explain says it too: exit code 3, locate's headline and its coverage lines, never
    "MATCH" and "the traces match bitwise" (what it printed, exit 3 beside a MATCH)."""
    from .helpers import metadata_only_copy

    if case == "metadata_only":
        a = recorded("torch_dot.py")
        args = (str(metadata_only_copy(a, tmp_path / "golden.h5")), recorded("torch_dot.py", tag="again"))
    else:
        args = (recorded("torch_rng_train.py"), recorded("torch_rng_train.py", env=BROKEN_DOT),
                "--map", '{"*": "x"}')
    loc = run_cli("locate", *args, "--no-explain")
    assert loc.returncode == 3 and loc.stdout.startswith("INCONCLUSIVE"), loc.stdout
    ex = run_cli("explain", *args)
    assert ex.returncode == 3, ex.stdout + ex.stderr
    head = loc.stdout.splitlines()[0].split("   a=")[0]
    assert ex.stdout.splitlines()[0] == head
    assert "MATCH" not in ex.stdout and "the traces match bitwise" not in ex.stdout
    assert _coverage_block(ex.stdout) == _coverage_block(loc.stdout)
    js = run_cli("explain", *args, "--json")
    assert js.returncode == 3
    js = __import__("json").loads(js.stdout)
    assert js["verdict"] == "inconclusive" and js["coverage"]["sufficient"] is False
