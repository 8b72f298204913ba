"""`tracediff locate`: unit tests of alignment and metrics on synthetic traces, and
end-to-end tests on traces recorded with the real CLI."""

import json
import random

import h5py
import numpy as np
import pytest

import tracediff
from tracediff.diff.align import sequence as align
from tracediff.diff.compare import values as compare
from tracediff.report.json_report import strict
from tracediff.diff.explain.env import env_diff
from tracediff.trace import schema

from . import synth
from .conftest import BROKEN_DOT, TANH_ULP
from .helpers import record, run_cli

F32 = np.float32


def _bump(a, i=0):
    a = np.array(a, copy=True)
    a.flat[i] = np.nextafter(a.flat[i], a.dtype.type(np.inf))
    return a


# -- metrics ---------------------------------------------------------------------------------

def test_nan_inf_rules():
    nan, inf = np.nan, np.inf
    m = compare.compare_arrays(np.array([1, nan, inf], F32), np.array([1, nan, inf], F32), "float32")
    assert m["within_tolerance"] and m["mismatch_fraction"] == 0 and m["max_abs"] == 0
    m = compare.compare_arrays(np.array([1, nan], F32), np.array([1, 2], F32), "float32")
    assert not m["within_tolerance"] and m["mismatch_fraction"] == 0.5 and m["max_abs"] == inf
    m = compare.compare_arrays(np.array([inf], F32), np.array([-inf], F32), "float32")
    assert not m["within_tolerance"] and m["max_rel"] == inf
    # real floats in the result, strict JSON at the edge
    assert json.loads(json.dumps(strict(m), allow_nan=False))["max_rel"] == "inf"


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_ulp_in_own_dtype(dtype):
    import ml_dtypes

    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.array([1.0, -2.5, 0.0, 3.0], dt)
    y = x.copy()
    ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize]
    y[0] = np.frombuffer((x[:1].view(ut) + 1).tobytes(), dt)[0]   # one ULP up
    m = compare.compare_arrays(x, y, dtype)
    assert m["max_ulp"] == 1.0
    m = compare.compare_arrays(np.array([0.0], dt), np.array([-0.0], dt), dtype)
    assert m["within_tolerance"] and m["max_ulp"] == 0.0
    # 3 ulp across signs: +1ulp vs -2ulp of the smallest subnormal
    tiny = np.array([1], np.uint64).astype({"float16": np.uint16, "bfloat16": np.uint16,
                                           "float32": np.uint32, "float64": np.uint64}[dtype])
    a = tiny.view(dt)
    b = (tiny * 2).view(dt) * -1
    assert compare.compare_arrays(a, b, dtype)["max_ulp"] == 3.0


def test_tolerance_defaults_and_overrides():
    assert compare.tolerance("float32") == (1e-5, 1e-6)
    assert compare.tolerance("float64") == (1e-12, 1e-14)
    assert compare.tolerance("int32") == (0.0, 0.0)
    assert compare.tolerance("float32", rtol=0.1) == (0.1, 1e-6)
    x = np.array([1.0], F32)
    assert compare.compare_arrays(x, x * F32(1 + 2e-6), "float32")["within_tolerance"]
    assert not compare.compare_arrays(x, x * F32(1 + 2e-5), "float32")["within_tolerance"]
    assert compare.compare_arrays(x, x * F32(1 + 2e-5), "float32", rtol=1e-3)["within_tolerance"]
    assert not compare.compare_arrays(np.array([1, 2]), np.array([1, 3]), "int64")["within_tolerance"]


def test_an_element_exactly_on_the_tolerance_bound_is_within_it(tmp_path):
    """|a - b| <= atol + rtol * max(|a|, |b|): equality is within (`<=`, not `<`), in
    compare_arrays and in the differ's vectorised scan; the next float past it is beyond."""
    from tracediff.diff.differ import Differ

    on = [(F32(1.0), F32(1.5), 0.0, 0.5),      # atol alone: |d| = 0.5 = atol
          (F32(1.5), F32(2.0), 0.25, 0.0)]     # rtol alone: |d| = 0.5 = 0.25 * 2.0
    for x, y, rtol, atol in on:
        m = compare.compare_arrays(np.array([x]), np.array([y]), "float32", rtol=rtol, atol=atol)
        assert m["within_tolerance"] and m["beyond_tolerance_fraction"] == 0.0, (x, y, m)
        past = np.nextafter(y, F32(9))
        m = compare.compare_arrays(np.array([x]), np.array([past]), "float32", rtol=rtol,
                                   atol=atol)
        assert not m["within_tolerance"] and m["beyond_tolerance_fraction"] == 1.0
    # --ulp N: exactly N ULP apart is within N
    x = np.array([1.0], F32)
    assert compare.compare_arrays(x, _bump(_bump(x)), "float32", ulp=2)["within_tolerance"]
    assert not compare.compare_arrays(x, _bump(_bump(x)), "float32", ulp=1)["within_tolerance"]
    # the differ's scan of single-output pairs applies the same bound
    for k, (x, y, rtol, atol) in enumerate(on):
        ev = lambda v: [dict(kind=schema.KIND_INPUT, op="input", outs=[np.array([1.0], F32)]),  # noqa: E731
                        dict(op="aten::mul.Tensor", outs=[np.array([v], F32)], ins=[(0, 0, 0)])]
        a = synth.write(str(tmp_path / f"a{k}.h5"), ev(x))
        b = synth.write(str(tmp_path / f"b{k}.h5"), ev(y))
        c = synth.write(str(tmp_path / f"c{k}.h5"), ev(np.nextafter(y, F32(9))))
        with tracediff.load(a) as ta, tracediff.load(b) as tb, tracediff.load(c) as tc:
            d = Differ(ta, tb, rtol, atol)
            done, _, beyond = d.scan_single_outputs(np.array([1]), np.array([1]), 1 << 20, 1 << 20)
            assert done.tolist() == [True] and beyond.tolist() == [False]
            d = Differ(ta, tc, rtol, atol)
            done, _, beyond = d.scan_single_outputs(np.array([1]), np.array([1]), 1 << 20, 1 << 20)
            assert done.tolist() == [True] and beyond.tolist() == [True]
        r = tracediff.locate(a, b, rtol=rtol, atol=atol, explain=False)
        assert r.verdict == "match" and r.first_difference.a.op == "aten::mul.Tensor"


# -- alignment -------------------------------------------------------------------------------

def _lcs(a, b):
    L = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            L[i][j] = L[i + 1][j + 1] + 1 if a[i] == b[j] else max(L[i + 1][j], L[i][j + 1])
    return L[0][0]


def test_myers_is_an_optimal_alignment():
    rng = random.Random(1)
    for _ in range(400):
        a = [rng.randrange(4) for _ in range(rng.randint(0, 25))]
        b = list(a)
        for _ in range(rng.randint(0, 5)):
            if rng.random() < 0.5 and b:
                del b[rng.randrange(len(b))]
            else:
                b.insert(rng.randrange(len(b) + 1), rng.randrange(6))
        A, B = np.array(a, np.uint64), np.array(b, np.uint64)
        pa, pb, fb = align.align_arrays(A, B)
        assert not fb
        assert np.all(A[pa] == B[pb]) and np.all(np.diff(pa) > 0) and np.all(np.diff(pb) > 0)
        assert len(pa) == _lcs(a, b)


def test_alignment_falls_back_when_too_different():
    a = np.arange(3000, dtype=np.uint64)
    b = a[::-1].copy()
    pa, pb, fb = align.align_arrays(a, b, max_edits=50)
    assert fb and np.all(a[pa] == b[pb])


def _xw():
    rng = np.random.default_rng(0)
    return rng.standard_normal((4, 8)).astype(F32), rng.standard_normal((8, 3)).astype(F32)


def test_identical_traces_match(tmp_path):
    x, w = _xw()
    a = synth.write(tmp_path / "a.h5", synth.mlp_events(x, w, steps=2))
    r = tracediff.locate(a, a)
    assert r.verdict == "match" and r.exit_code == 0
    assert r.first_difference is None and r.first_beyond_tolerance is None
    assert r.alignment["only_in_a"] == r.alignment["only_in_b"] == 0


def test_inserted_event_is_aligned_and_first_difference_found(tmp_path):
    x, w = _xw()
    a = synth.write(tmp_path / "a.h5", synth.mlp_events(x, w, steps=3))
    b = synth.write(tmp_path / "b.h5", synth.mlp_events(x, w, steps=3, perturb=("mm", 1), extra_at=0))
    r = tracediff.locate(a, b)
    assert r.alignment["only_in_b"] == 1 and r.alignment["only_in_a"] == 0
    f = r.first_difference
    assert f.a["op"] == "aten::mm" and f.a["step"] == 1 and f.b["index"] == f.a["index"] + 1
    assert f.inputs_match is True and f.metrics["max_ulp"] == 1.0
    # one ulp is within float32 tolerance: no verdict change
    assert r.verdict == "match" and r.first_beyond_tolerance is None
    r2 = tracediff.locate(a, b, rtol=0.0, atol=0.0)
    assert r2.verdict == "diverged" and r2.first_beyond_tolerance.a["op"] == "aten::mm"
    # downstream ops differ too but are inherited
    d = tracediff.to_json(r)
    json.dumps(d, allow_nan=False)
    assert d["first_difference"]["a"]["index"] == f.a["index"]


def test_inherited_and_unknown_inputs(tmp_path):
    x, w = _xw()
    t = np.tanh(x @ w)
    ev_a = [dict(kind=schema.KIND_INPUT, op="input", outs=[x]),
            dict(op="aten::tanh", outs=[t], ins=[(0, 0, 0)]),
            dict(op="aten::exp", outs=[np.exp(t)], ins=[(0, -1, 0)])]
    ev_b = [dict(kind=schema.KIND_INPUT, op="input", outs=[x * 2]),
            dict(op="aten::tanh", outs=[t * 2], ins=[(0, 0, 0)]),
            dict(op="aten::exp", outs=[np.exp(t) * 2], ins=[(0, -1, 0)])]
    a = synth.write(tmp_path / "a.h5", ev_a)
    b = synth.write(tmp_path / "b.h5", ev_b)
    r = tracediff.locate(a, b)
    assert r.first_difference.a["op"] == "input"
    from tracediff.diff.differ import TOLERANCE, Differ
    from tracediff.trace.reader import Trace

    with Trace(a) as ta, Trace(b) as tb:
        d = Differ(ta, tb)
        ok, reason, bad = d.inputs_match(1, 1, TOLERANCE)
        assert ok is False and bad[0]["producer_a"] == 0
        ok, reason, _ = d.inputs_match(2, 2, TOLERANCE)
        assert ok is None and "unknown producer" in reason


def test_uninitialised_and_unstored_values_are_never_compared(tmp_path):
    x, _ = _xw()
    ev_a = [dict(op="aten::empty", outs=[x], uninit=(0,)), dict(op="aten::relu", outs=[x])]
    ev_b = [dict(op="aten::empty", outs=[x + 1], uninit=(0,)), dict(op="aten::relu", outs=[x])]
    r = tracediff.locate(synth.write(tmp_path / "a.h5", ev_a), synth.write(tmp_path / "b.h5", ev_b))
    assert r.verdict == "match" and r.first_difference is None


def _jax_call(inp, mid, out, compiled_out, step=0, base=0):
    """input, call(IN inp), eqn sin(inp)=mid, eqn cos(mid)=out ; call OUT = compiled_out."""
    return [dict(kind=schema.KIND_INPUT, op="input", outs=[inp], step=step),
            dict(kind=schema.KIND_CALL, op="jit:f", outs=[compiled_out], in_values=[(inp, "x")],
                 ins=[(0, base, 0)], step=step),
            dict(kind=schema.KIND_EQN, op="sin", outs=[mid], ins=[(0, base, 0)], call=base + 1,
                 parent=base + 1, name_stack="f", source="f.py:3", step=step),
            dict(kind=schema.KIND_EQN, op="pjit", outs=[out], ins=[(0, base + 2, 0)], call=base + 1,
                 parent=base + 1, step=step),
            dict(kind=schema.KIND_EQN, op="cos", outs=[out], ins=[(0, base + 2, 0)], call=base + 1,
                 parent=base + 3, name_stack="f/g", source="f.py:4", step=step)]


def test_compiled_call_descends_to_origin_equation(tmp_path):
    x = np.linspace(0, 1, 5)
    mid, out = np.sin(x), np.cos(np.sin(x))
    a = synth.write(tmp_path / "a.h5", _jax_call(x, mid, out, out))
    # b: sin is off by a lot (beyond tolerance) -> cos inherits; the call outputs differ
    mid_b = mid * 1.01
    b = synth.write(tmp_path / "b.h5", _jax_call(x, mid_b, np.cos(mid_b), np.cos(mid_b)))
    r = tracediff.locate(a, b)
    f = r.first_beyond_tolerance
    assert r.verdict == "diverged"
    assert f.a["op"] == "sin" and f.inputs_match is True and f.call["op"] == "jit:f"
    assert f.origin == "replay"
    # nested jit: the origin inside the jit eqn is the inner cos
    out_b = _bump(out)
    b2 = synth.write(tmp_path / "b2.h5", _jax_call(x, mid, out_b, out_b))
    f2 = tracediff.locate(a, b2, rtol=0, atol=0).first_beyond_tolerance
    assert f2.a["op"] == "cos" and f2.a["name_stack"] == "f/g" and f2.inputs_match is True


def test_compiled_divergence_with_matching_replay(tmp_path):
    x = np.linspace(0, 1, 5)
    mid, out = np.sin(x), np.cos(np.sin(x))
    a = synth.write(tmp_path / "a.h5", _jax_call(x, mid, out, out))
    b = synth.write(tmp_path / "b.h5", _jax_call(x, mid, out, out * 1.1))
    r = tracediff.locate(a, b)
    f = r.first_beyond_tolerance
    assert f.a["kind"] == "call" and "inside the compiled program" in f.note
    assert f.inputs_match is True  # the call's role-IN values match


def test_replay_only_difference_does_not_decide_the_verdict(tmp_path):
    x = np.linspace(0, 1, 5)
    mid, out = np.sin(x), np.cos(np.sin(x))
    a = synth.write(tmp_path / "a.h5", _jax_call(x, mid, out, out))
    b = synth.write(tmp_path / "b.h5", _jax_call(x, mid * 1.1, out, out))
    r = tracediff.locate(a, b)
    assert r.verdict == "match" and r.exit_code == 0
    assert r.first_difference.a["op"] == "sin" and r.first_difference.origin == "replay"
    assert "did not see" in r.first_difference.note
    assert r.replay_only is not None and r.replay_only.a["op"] == "sin"


def test_optimizer_snapshots_compare_by_name(tmp_path):
    w1, w2 = np.ones(3, F32), np.zeros(2, F32)
    ev_a = [dict(kind=schema.KIND_OPTIM, op="optim", step=1, outs=[(w1, "params/a"), (w2, "params/b")])]
    ev_b = [dict(kind=schema.KIND_OPTIM, op="optim", step=1, outs=[(w2, "params/b"), (w1 * 2, "params/a")])]
    r = tracediff.locate(synth.write(tmp_path / "a.h5", ev_a), synth.write(tmp_path / "b.h5", ev_b))
    assert r.optimizer_steps[0]["worst"] == "params/a" and r.optimizer_steps[0]["max_rel"] == 0.5
    assert r.first_beyond_tolerance.values[0]["key"] == "params/a"
    import io

    from rich.console import Console

    from tracediff.report.terminal import print_locate

    buf = io.StringIO()
    print_locate(r, Console(file=buf, width=200, no_color=True))
    text = buf.getvalue()
    assert "DIVERGED" in text and "optimizer steps: 1 compared" in text and "params/a" in text


def test_env_diff_ranks_and_summarises():
    base = {"created": "x", "pid": 1, "hostname": "h1", "packages": {"jax": "0.4"},
            "cpu": {"isa_flags": ["sse2", "avx2", "fpu"] + [f"f{i}" for i in range(100)]},
            "env": {"XLA_FLAGS": "--a"}, "threads": {"cpu_count": 8}}
    other = {"created": "y", "pid": 2, "hostname": "h2", "packages": {"jax": "0.10"},
             "cpu": {"isa_flags": ["sse2", "avx512f", "fpu"] + [f"f{i}" for i in range(100)]},
             "env": {}, "threads": {"cpu_count": 2}}
    d = env_diff(base, other)
    keys = [e["key"] for e in d]
    assert keys[0] == "packages.jax" and keys[-1] == "hostname"
    assert "created" not in keys and "pid" not in keys
    isa = next(e for e in d if e["key"] == "cpu.isa_flags")
    assert isa["numeric_only_in_a"] == ["avx2"] and isa["numeric_only_in_b"] == ["avx512f"]
    assert keys.index("cpu.isa_flags") < keys.index("env.XLA_FLAGS") < keys.index("threads.cpu_count")


def test_truncated_and_different_script_warnings(tmp_path):
    x, w = _xw()
    a = synth.write(tmp_path / "a.h5", synth.mlp_events(x, w))
    m = synth.manifest(script={"name": "other.py", "sha256": "1" * 64})
    b = synth.write(tmp_path / "b.h5", synth.mlp_events(x, w), man=m, complete=False)
    r = tracediff.locate(a, b)
    assert any("different scripts" in w for w in r.warnings)
    assert any("truncated" in w for w in r.warnings)
    proc = run_cli("locate", a, b)
    assert "different scripts" in proc.stderr and "truncated" in proc.stderr


# -- CLI on bad input ------------------------------------------------------------------------

def _bad_inputs(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    empty = tmp_path / "empty.h5"
    empty.write_bytes(b"")
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.arange(3)
    return {"missing": tmp_path / "nope.h5", "text": text, "empty": empty, "foreign": foreign}


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    x, w = _xw()
    good = synth.write(tmp_path / "good.h5", synth.mlp_events(x, w))
    for what, path in _bad_inputs(tmp_path).items():
        for args in ((good, path), (path, good)):
            proc = run_cli("locate", *args)
            assert proc.returncode == 2, (what, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("tracediff: error:"), (what, proc.stderr)
            assert "Traceback" not in proc.stderr and proc.stdout == ""
    proc = run_cli("locate", good, good, "--rtol", "-1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


# -- real recorded traces (torch) ------------------------------------------------------------



@pytest.fixture(scope="module")
def dot_traces(recorded):
    r = recorded.many({"a": ("torch_dot.py", (), None), "a2": ("torch_dot.py", (), None, (), "again"),
                       "b": ("torch_dot.py", (), BROKEN_DOT)})
    return r["a"], r["a2"], r["b"]


def test_real_identical_runs_match(dot_traces):
    a, a2, _ = dot_traces
    proc = run_cli("locate", a, a2, "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["verdict"] == "match" and d["first_difference"] is None
    assert d["alignment"]["only_in_a"] == 0 and d["alignment"]["matched"] == d["alignment"]["events_a"]
    assert all(e["key"] not in ("created", "pid") for e in d["env_diff"])
    proc = run_cli("locate", a, a2)
    assert proc.returncode == 0 and "MATCH" in proc.stdout


def test_real_broken_dot_is_located(dot_traces):
    a, _, b = dot_traces
    proc = run_cli("locate", a, b, "--json")
    assert proc.returncode == 1, proc.stderr
    d = json.loads(proc.stdout)
    assert d["verdict"] == "diverged"
    for key in ("first_difference", "first_beyond_tolerance"):
        f = d[key]
        assert f["a"]["op"] == "aten::dot" and f["b"]["op"] == "aten::dot"
        assert f["a"]["phase"] == "forward" and f["a"]["step"] == 0
        assert f["inputs_match"] is True
        assert f["metrics"]["max_abs"] == 14.0 and f["metrics"]["mismatch_fraction"] == 1.0
        assert f["a"]["source"].endswith("torch_dot.py:6")
    # the Python API gives the same object as the CLI, and reports its progress
    seen = []
    assert tracediff.to_json(tracediff.locate(str(a), str(b), progress=lambda *p: seen.append(p))) == d
    phases = [p[0] for p in seen]
    assert phases.index("aligning the event sequences") < \
        phases.index("comparing differing events (bitwise)") < phases.index(
            "comparing differing events (tolerance)") < phases.index(
            "explaining: replaying the origin op")
    proc = run_cli("locate", a, b, env={"NO_COLOR": "1"})
    assert proc.returncode == 1
    assert "DIVERGED" in proc.stdout and "aten::dot" in proc.stdout and "introduced here" in proc.stdout
    assert "\x1b[" not in proc.stdout
    assert f"tracediff show {a}" in proc.stdout


def test_equation_of_a_call_without_counterpart_still_decides(tmp_path):
    x = np.linspace(0, 1, 5)
    mid, out = np.sin(x), np.cos(np.sin(x))
    ev_a = _jax_call(x, mid, out, out)
    ev_b = _jax_call(x, mid * 1.1, out, out)
    ev_b[1]["op"] = "jit:g"          # the calls do not pair; the equations do
    r = tracediff.locate(synth.write(tmp_path / "a.h5", ev_a), synth.write(tmp_path / "b.h5", ev_b))
    assert r.verdict == "diverged" and r.first_beyond_tolerance.a["op"] == "sin"
    assert "no counterpart" in r.first_beyond_tolerance.note


# -- real recorded traces (JAX) --------------------------------------------------------------



@pytest.fixture(scope="module")
def jax_traces(recorded):
    args = ("--mlp", "--jit")
    r = recorded.many({"a": ("flax_dense.py", args, None),
                       "a2": ("flax_dense.py", args, None, (), "again"),
                       "b": ("flax_dense.py", args, TANH_ULP)})
    return r["a"], r["a2"], r["b"]


def test_real_jax_identical_runs_match(jax_traces):
    a, a2, _ = jax_traces
    proc = run_cli("locate", a, a2, "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["verdict"] == "match" and d["first_difference"] is None
    assert d["alignment"]["only_in_a"] == d["alignment"]["only_in_b"] == 0


def test_real_jax_tanh_ulp_descends_into_compiled_call(jax_traces):
    a, _, b = jax_traces
    proc = run_cli("locate", a, b, "--json")
    # one float32 ulp is within the default tolerance: exit 0, but located bitwise
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    f = d["first_difference"]
    assert d["verdict"] == "match" and d["first_beyond_tolerance"] is None
    assert f["a"]["op"] == "tanh" and f["a"]["kind"] == "eqn" and f["origin"] == "replay"
    assert f["call"]["op"] == "jit:apply" and f["inputs_match"] is True
    assert f["metrics"]["max_ulp"] == 1.0 and f["a"]["source"].endswith("flax_dense.py:45")
    proc = run_cli("locate", a, b, "--rtol", "0", "--atol", "0", "--json")
    assert proc.returncode == 1
    g = json.loads(proc.stdout)["first_beyond_tolerance"]
    assert g["a"]["op"] == "tanh" and g["call"]["op"] == "jit:apply" and g["inputs_match"] is True


def _bump_one_ulp(f, row):
    """Move the first element of value row `row` (float32) one ULP up, its hash with it."""
    import xxhash

    v = f["values"][row]
    off, n = int(v["offset"]), int(v["nbytes"])
    x = np.frombuffer(f["blob"][off:off + n].tobytes(), np.float32).copy()
    x[0] = np.nextafter(x[0], np.float32(np.inf))
    f["blob"][off:off + n] = np.frombuffer(x.tobytes(), np.uint8)
    v["hash"] = xxhash.xxh3_64_intdigest(x.tobytes())
    f["values"][row] = v


@pytest.mark.parametrize("moved", ["equation", "probe-outputs"])
def test_a_difference_inside_a_call_whose_outputs_match_is_compared_never_skipped(
        recorded, tmp_path, moved):
    """`--jax-values compiled`: a jit call's equation values come from its values program
    (origin probe). One of them moved one ULP in a copy (its hash updated) while the call's
    outputs stay equal: locate said "MATCH, every compared value is bitwise identical"
    with every event counted as compared. It is the first bitwise difference, probe-only.
    So too where the probe program's own outputs moved with its last equation (the extra
    outputs change its fusion: manifest `probe.differing_calls`): an equation is judged by
    the real call it probes, whose outputs match, never by the probe's."""
    import shutil

    import h5py

    from tracediff.trace import schema
    from tracediff.trace.reader import Trace

    a = str(recorded("flax_dense.py", "--mlp", "--jit", options=["--jax-values", "compiled"]))
    b = str(tmp_path / "b.h5")
    shutil.copy(a, b)
    with Trace(b) as t:
        ev = t.events
        v = t.values
        out = [r for r in range(len(v)) if v["role"][r] == schema.ROLE_OUT and
               ev["origin"][v["event"][r]] == schema.ORIGIN_PROBE and
               t.string(v["dtype"][r]) == "float32" and v["nbytes"][r] >= 16 and
               v["offset"][r] >= 0]
        eqns = [r for r in out if ev["kind"][v["event"][r]] == schema.KIND_EQN]
        if moved == "equation":
            rows = [eqns[0]]
        else:   # the probe call's output, and the equation of the probe that made it
            (call,) = [r for r in out if ev["kind"][v["event"][r]] == schema.KIND_CALL]
            rows = [[r for r in eqns if v["hash"][r] == v["hash"][call]][-1], call]
        eid = int(v["event"][rows[0]])
        assert t.manifest["recording"]["hash"] == "xxh3_64"
    with h5py.File(b, "r+") as f:
        for row in rows:
            _bump_one_ulp(f, row)
    d = json.loads(run_cli("locate", a, b, "--rtol", "0", "--atol", "0", "--json").stdout)
    f = d["first_difference"]
    assert f is not None and f["a"]["index"] == eid and f["origin"] == "probe"
    assert "probe-only" in f["note"] and d["verdict"] == "match"
    text = run_cli("locate", a, b, "--rtol", "0", "--atol", "0").stdout
    assert "every compared value is bitwise identical" not in text


def test_real_foreach_vs_per_parameter_adam_aligns(tmp_path):
    """Different optimizer implementations: only optimizer-phase ops are left unmatched,
    every forward/backward op and every optimizer snapshot is paired."""
    from tracediff.diff.differ import Differ
    from tracediff.trace.reader import Trace

    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    record("torch_adam_foreach.py", a)
    record("torch_adam_foreach.py", b, "--foreach")
    with Trace(a) as ta, Trace(b) as tb:
        d = Differ(ta, tb)
        for t, m in ((ta, d.al.a2b), (tb, d.al.b2a)):
            unmatched = t.events[m < 0]
            assert len(unmatched) > 0
            assert set(unmatched["phase"].tolist()) == {schema.PHASE_OPTIM}
            assert (t.events["kind"][m < 0] != schema.KIND_OPTIM).all()
        r = tracediff.locate(ta, tb)
    assert len(r.optimizer_steps) == 3 and r.alignment["anchors_matched"] == 3
    # step 0's forward and backward read the same initial parameters: all bitwise equal;
    # only the two update formulas may round differently
    assert r.first_difference is None or r.first_difference.a["phase"] == "optimizer" or \
        r.first_difference.a["step"] >= 1
    with Trace(a) as ta, Trace(b) as tb:
        d = Differ(ta, tb)
        ia, ib = d.pairs()
        step0 = [(x, y) for x, y in zip(ia.tolist(), ib.tolist())
                 if ta.events["step"][x] == 0 and ta.events["phase"][x] != schema.PHASE_OPTIM]
        assert len(step0) > 20
        assert all(d.compare_event(x, y)["bitwise_equal"] for x, y in step0)


def test_vectorised_tolerance_scan_agrees_with_exact_path(tmp_path, monkeypatch):
    from tracediff.diff.differ import Differ

    rng = np.random.default_rng(3)
    base = [rng.standard_normal(rng.integers(1, 40)).astype(rng.choice([np.float32, np.float64]))
            for _ in range(300)]
    ev_a = [dict(op=f"aten::op{i % 4}", outs=[v]) for i, v in enumerate(base)]
    noisy = [np.nextafter(v, v.dtype.type(np.inf)) if i > 20 else v for i, v in enumerate(base)]
    noisy[250] = noisy[250] * np.float32(1.001) if noisy[250].dtype == np.float32 else noisy[250] * 1.001
    noisy[120] = noisy[120].copy()
    noisy[120][0] = np.nan
    ev_b = [dict(op=f"aten::op{i % 4}", outs=[v]) for i, v in enumerate(noisy)]
    a, b = synth.write(tmp_path / "a.h5", ev_a), synth.write(tmp_path / "b.h5", ev_b)
    fast = tracediff.to_json(tracediff.locate(a, b))
    monkeypatch.setattr(Differ, "_fast_within_tolerance", lambda self, ia, ib: np.zeros(len(ia), bool))
    slow = tracediff.to_json(tracediff.locate(a, b))
    assert fast == slow
    assert fast["first_beyond_tolerance"]["a"]["index"] == 120
    assert fast["first_difference"]["a"]["index"] == 21


def test_upcast_is_judged_at_the_precision_of_its_input(tmp_path):
    x = np.linspace(1, 2, 6).astype(F32)
    xb = _bump(x, 2)

    def evs(v):
        return [dict(kind=schema.KIND_INPUT, op="input", outs=[v]),
                dict(op="aten::_to_copy", outs=[v.astype(np.float64)], ins=[(0, 0, 0)]),
                dict(op="aten::exp", outs=[np.exp(v.astype(np.float64))], ins=[(0, 1, 0)])]

    r = tracediff.locate(synth.write(tmp_path / "a.h5", evs(x)), synth.write(tmp_path / "b.h5", evs(xb)))
    assert r.first_difference.a["op"] == "input"
    f = r.first_beyond_tolerance
    assert f.a["op"] == "aten::exp" and f.inputs_match is False
    assert "beyond tolerance" in f.inputs_reason and "aten::_to_copy" in f.inputs_reason


@pytest.mark.parametrize("differs", [0, 1, 2])
def test_introduced_or_inherited_looks_at_every_input(tmp_path, differs):
    """An op of three inputs (dataflow edges) whose output differs: inherited when any one
    of them differs (the first, a middle or the last), each named; introduced when none
    does. The same for the values an event stores as its own inputs (a call's arguments)."""
    from tracediff.diff.differ import BITWISE, TOLERANCE, Differ

    xs = [np.array([1.0, 2.0], F32), np.array([3.0, 4.0], F32), np.array([5.0, 6.0], F32)]

    def events(changed):
        ins = [x * F32(1.5) if i == changed else x for i, x in enumerate(xs)]
        out = ins[0] * ins[1] + ins[2] + (F32(1) if changed == "out" else F32(0))
        evs = [dict(kind=schema.KIND_INPUT, op="input", outs=[x]) for x in ins]
        evs.append(dict(op="aten::addcmul", outs=[out], ins=[(0, 2, 0), (1, 0, 0), (2, 1, 0)]))
        evs.append(dict(kind=schema.KIND_CALL, op="jit:f", outs=[out], in_values=ins))
        return evs

    a = synth.write(str(tmp_path / "a.h5"), events(None))
    b = synth.write(str(tmp_path / "b.h5"), events(differs))
    c = synth.write(str(tmp_path / "c.h5"), events("out"))
    slot_of = {2: 0, 0: 1, 1: 2}      # input event -> the op's slot that reads it
    with tracediff.load(a) as ta, tracediff.load(b) as tb, tracediff.load(c) as tc:
        d = Differ(ta, tb)
        for level in (BITWISE, TOLERANCE):
            ok, why, bad = d.inputs_match(3, 3, level)
            assert ok is False and why.startswith("1 of its inputs differ"), (level, why)
            assert [x["input"] for x in bad] == [slot_of[differs]]
            assert bad[0]["producer_a"] == bad[0]["producer_b"] == differs
            ok, why, bad = d.inputs_match(4, 4, level)        # the call's own input values
            assert ok is False and [x["input"] for x in bad] == [str(differs)], (level, why)
        d = Differ(ta, tc)
        for e in (3, 4):
            assert d.inputs_match(e, e, BITWISE)[0] is True
