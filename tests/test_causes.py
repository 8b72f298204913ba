"""Environment causes that fit the op (issue 36.3, 36.5; issue 37.2): the reason table
(`diff/explain/reasons.py`) walked row by row, each XLA flag with its own reason, and real
divergences: a BatchNorm MLP with OMP_NUM_THREADS=1 vs 2 (thread count first) and a JAX
MLP with XLA fast math (its own reason)."""

import os
import re

import pytest

from tracediff.diff.explain import causes, reasons

from .helpers import ROOT, explain_json

BATCHNORM = ("torch_batchnorm.py", "--steps", "1")
THREADS_1, THREADS_2 = {"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2"}
SMALL_MLP = ("jax_mlp.py", "--sizes", "8,32,4", "--batch", "8", "--steps", "1")
FAST_MATH = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}


# -- the table --------------------------------------------------------------------------------

@pytest.mark.parametrize("table", [reasons.REASONS, reasons.XLA_FLAG_REASONS],
                         ids=["keys", "xla-flags"])
def test_every_row_of_the_reason_table_explains_its_example(table):
    """Each row is reached by its example key for every op class it names (no earlier row
    shadows it) and by none it does not name."""
    tags = [row.tag for row in table]
    assert len(tags) == len(set(tags))
    for row in table:
        assert row.example and row.classes <= reasons.ALL and row.text
        for cls in sorted(reasons.ALL):
            got = reasons.reason_for(row.example, cls, table)
            if cls in row.classes:
                assert got is row, (row.tag, cls, got and got.tag)
            else:
                assert got is not row, (row.tag, cls)


def test_the_reason_table_is_documented():
    with open(os.path.join(ROOT, "docs", "root-cause.md"), encoding="utf-8") as f:
        doc = f.read()
    for row in reasons.REASONS + reasons.XLA_FLAG_REASONS:
        assert f"`{row.tag}`" in doc and f"`{row.example}`" in doc, row.tag


def test_xla_flags_are_split_into_flags():
    assert reasons.xla_flags("--xla_cpu_max_isa=SSE4_2  --xla_dump_to=/tmp/d --a --a=2") == {
        "--xla_cpu_max_isa": "SSE4_2", "--xla_dump_to": "/tmp/d", "--a": "2"}
    assert reasons.xla_flags(None) == {} and reasons.xla_flags("'--x=a b") == {"'--x": "a", "b": ""}


@pytest.mark.parametrize("op,cls", [
    ("aten::native_batch_norm", "reduction"), ("aten::native_layer_norm", "reduction"),
    ("aten::native_group_norm.default", "reduction"), ("aten::_softmax", "reduction"),
    ("aten::_log_softmax.default", "reduction"), ("reduce_sum", "reduction"),
    ("reduce_precision", "elementwise"), ("aten::addmm", "matmul"),
    ("conv_general_dilated", "matmul"), ("aten::convolution", "matmul"),
    ("dot_general", "matmul"), ("aten::tanh", "transcendental"), ("aten::add.Tensor", "elementwise")])
def test_op_classes(op, cls):
    assert causes.op_class(op) == cls


def _xla(a, b):
    return [{"key": "env.XLA_FLAGS", "category": "env", "a": a, "b": b}]


def test_each_xla_flag_that_differs_gets_its_own_reason():
    env = _xla("--xla_cpu_enable_fast_math=true --xla_dump_to=/tmp/a",
               "--xla_force_host_platform_device_count=4 --xla_dump_to=/tmp/a")
    got = causes.environment(env, "reduce_sum", "jax", True).causes
    by_flag = {(c.a or c.b).split("=")[0]: c for c in got}
    assert set(by_flag) == {"--xla_cpu_enable_fast_math", "--xla_force_host_platform_device_count"}
    assert "fast math" in by_flag["--xla_cpu_enable_fast_math"].reason
    assert "device count" in by_flag["--xla_force_host_platform_device_count"].reason
    assert got[0].a is None and got[0].b == "--xla_force_host_platform_device_count=4"
    isa = causes.environment(_xla(None, "--xla_cpu_max_isa=SSE4_2"), "dot_general", "jax", True)
    assert "instruction set" in isa.causes[0].reason and isa.causes[0].rank == 0
    other = causes.environment(_xla("--xla_cpu_some_new_flag=1", None), "reduce_sum", "jax", True)
    assert re.search(r"--xla_cpu_some_new_flag: an XLA flag;", other.causes[0].reason)
    # XLA flags change no torch op
    assert not causes.environment(env, "aten::sum", "torch", True).causes


def test_jax_device_settings_change_no_torch_op():
    """JAX's backend and device kind rows are the accelerator's numerics of JAX ops: a
    torch op beside them is not explained by them (nor ranks them first)."""
    env = [{"key": "frameworks.jax.backend", "category": "device", "a": "cpu", "b": "tpu"},
           {"key": "frameworks.jax.device_kind", "category": "device", "a": "cpu",
            "b": "TPU v5 lite"}]
    assert not causes.environment(env, "aten::mm", "torch", True).causes
    got = causes.environment(env, "dot_general", "jax", True).causes
    assert [c.key for c in got] == ["frameworks.jax.backend", "frameworks.jax.device_kind"]


# -- real divergences -----------------------------------------------------------------------

# slow (10-15 s each here): CI's deep stage, which keeps README's test command within five minutes
@pytest.mark.deep
def test_thread_count_is_the_first_cause_of_a_batch_norm_difference(recorded):
    """OMP_NUM_THREADS=1 vs 2 on a BatchNorm MLP: native_batch_norm's per-channel sums are
    split across threads, so the values differ where torch runs it multi-threaded."""
    plain = [recorded.plain(*BATCHNORM, env=e).stdout for e in (THREADS_1, THREADS_2)]
    if plain[0] == plain[1]:
        pytest.skip("this machine's torch computes the BatchNorm MLP bitwise alike with 1 and "
                    "2 threads: no thread-count difference to explain")
    a, b = (recorded(*BATCHNORM, env=e) for e in (THREADS_1, THREADS_2))
    an = explain_json(a, b)
    assert an["origin"]["a"]["op"].startswith("aten::native_batch_norm")
    assert an["origin"]["inputs_match"] is True
    env = an["environment"]
    assert env["op_class"] == "reduction"
    first = env["causes"][0]
    assert first["key"] in ("env.OMP_NUM_THREADS", "frameworks.torch.num_threads")
    assert "thread count" in first["reason"]


# slow (10-15 s each here): CI's deep stage, which keeps README's test command within five minutes
@pytest.mark.deep
def test_xla_fast_math_has_its_own_reason(recorded):
    runs = recorded.many({"a": (SMALL_MLP[0], SMALL_MLP[1:], None),
                          "b": (SMALL_MLP[0], SMALL_MLP[1:], FAST_MATH)})
    an = explain_json(runs["a"], runs["b"])
    if an["origin"] is None:
        pytest.skip("XLA fast math changes nothing in this MLP on this machine")
    first = an["environment"]["causes"][0]
    assert first["key"] == "env.XLA_FLAGS" and first["a"] is None
    assert first["b"] == "--xla_cpu_enable_fast_math=true"
    assert first["reason"].startswith("--xla_cpu_enable_fast_math: XLA fast math")


# -- the accelerator's numerics (issue 37.2) ------------------------------------------------

BF16_PASS = {"PYTHONPATH": os.path.join(ROOT, "tests", "perturb", "bf16_pass")}
BF16_REVERSED = {**BF16_PASS, "TRACEDIFF_BF16_ORDER": "reverse"}
FIX = 'jax.default_matmul_precision("highest")'


@pytest.fixture(scope="module")
def bf16(recorded):
    """flax_dense.py (one Dense, x (4, 64) @ kernel (64, 32)) plainly, with XLA:CPU's
    float32 dot_general run as a TPU runs it at default precision (one bf16 pass:
    tests/perturb/bf16_pass), and that bf16 pass summed in reversed order."""
    runs = recorded.many({"plain": ("flax_dense.py", (), None),
                          "bf16": ("flax_dense.py", (), BF16_PASS),
                          "reversed": ("flax_dense.py", (), BF16_REVERSED)})
    if recorded.proc(runs["plain"]).stdout == recorded.proc(runs["bf16"]).stdout:
        pytest.skip("a bf16 pass changes nothing in this Dense layer here")
    return runs


def _side(an, side):
    return [m for m in an["mechanisms"] if m["side"] == side]


def test_a_bf16_pass_is_reproduced_bitwise_and_its_fix_named(bf16):
    an = explain_json(bf16["plain"], bf16["bf16"])
    assert an["origin"]["a"]["op"] == "dot_general" and an["origin"]["inputs_match"] is True
    best = _side(an, "b")[0]
    assert best["name"] == "bf16_inputs" and best["bitwise"] is True
    line = an["replay"]["mechanism"]
    assert "b's dot_general is reproduced bitwise by a bf16 pass" in line and FIX in line


def test_a_bf16_pass_summed_in_another_order_is_consistent_with_it(bf16):
    an = explain_json(bf16["plain"], bf16["reversed"])
    mine = _side(an, "b")
    assert not any(m["bitwise"] for m in mine)   # no variant sums in reversed order
    bf = next(m for m in mine if m["name"] == "bf16_inputs")
    assert bf is mine[0] and 0 < bf["max_ulp"] <= 64
    line = an["replay"]["mechanism"]
    assert "b's dot_general is consistent with a bf16 pass" in line and FIX in line
    assert "no hypothesis reproduces b's" not in line


def _on_tpu(src, dst):
    """A copy of a real CPU trace whose manifest says its JAX ran on a TPU v5e: only
    frameworks.jax.backend and device_kind are rewritten. Why: CI has no TPU, and this is
    a unit test of how the backend ranks and what the replay may claim; the numerics of
    the bf16 pass itself are real (tests above)."""
    import json
    import shutil

    import h5py

    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        m = json.loads(f["manifest"][()])
        m["frameworks"]["jax"].update(backend="tpu", device_kind="TPU v5 lite")
        f["manifest"][()] = json.dumps(m, sort_keys=True)
    return dst


def test_the_backend_ranks_first_and_no_replay_claims_another_backend(bf16, tmp_path):
    from .helpers import locate_json, run_cli

    b = _on_tpu(bf16["reversed"], tmp_path / "tpu.h5")
    rep = locate_json(bf16["plain"], b)
    keys = [e["key"] for e in rep["env_diff"]]
    assert keys[:2] == ["frameworks.jax.backend", "frameworks.jax.device_kind"]
    assert {e["category"] for e in rep["env_diff"][:2]} == {"device"}
    out = run_cli("locate", bf16["plain"], b, "--no-explain", env={"NO_COLOR": "1"}).stdout
    env_lines = out.split("environment differences (a -> b):\n", 1)[1].splitlines()
    assert "frameworks.jax.backend: cpu -> tpu" in env_lines[0]   # the short view's first line
    an = explain_json(bf16["plain"], b)
    causes = an["environment"]["causes"]
    assert causes[0]["key"] == "frameworks.jax.backend" and causes[0]["device"] is True
    devices = [c for c in causes if c.get("device")]
    assert causes[:len(devices)] == devices and all(c["rank"] >= 1 for c in causes[len(devices):])
    rv = an["replay"]
    assert rv["b"]["reproduced_here"] is None and "computed on another backend (tpu)" in \
        rv["b"]["reason"]
    assert rv["reproduces"] == "a" and "reproduces b" not in rv["verdict"]
    assert "b ran it on a TPU at default matmul precision" in rv["mechanism"]


@pytest.fixture(scope="module")
def bf16_port(recorded, tmp_path_factory):
    """port_dense_linear.py (a Flax Dense and its torch Linear in one script, x (2, 24))
    with the JAX side's matmul run as one bf16 pass (tests/perturb/bf16_pass), as a TPU
    runs it; the copy's manifest says its JAX ran on a TPU (`_on_tpu`)."""
    runs = recorded.many({"plain": ("port_dense_linear.py", (), None),
                          "bf16": ("port_dense_linear.py", (), BF16_PASS)})
    if recorded.proc(runs["plain"]).stdout == recorded.proc(runs["bf16"]).stdout:
        pytest.skip("a bf16 pass changes nothing in this Dense layer here")
    return _on_tpu(runs["bf16"], tmp_path_factory.mktemp("bf16_port") / "tpu_port.h5")


def test_a_one_trace_port_on_a_tpu_replays_the_matmul_and_names_the_bf16_pass(bf16_port):
    """Flax's `dot_general + add` pairs with torch's `addmm`: the replay and the mechanisms
    take Flax's matmul, not the bias add (which says nothing of how the matmul rounded), and
    with both frameworks in one trace (no manifest difference) the TPU's bf16 pass is still
    named first, with its fix."""
    import json

    from .helpers import run_cli

    proc = run_cli("explain", str(bf16_port), "--json")
    assert proc.returncode == 1, proc.stderr
    an = json.loads(proc.stdout)
    assert an["origin"]["a"]["op"] == "add" and an["origin"]["b"]["op"] == "aten::addmm"
    rv = an["replay"]
    assert rv["event"]["op"] == "dot_general" and rv["event"]["a"] < an["origin"]["a"]["index"]
    best = _side(an, "a")[0]
    assert best["name"] == "bf16_inputs" and best["bitwise"] is True
    assert "a's dot_general is reproduced bitwise by a bf16 pass" in rv["mechanism"]
    assert "a ran it on a TPU at default matmul precision" in rv["mechanism"]
    assert FIX in rv["mechanism"]
    first = an["environment"]["causes"][0]
    assert first["key"] == "frameworks.jax.backend" and first["device"] is True
    assert first["a"] == "jax on tpu" and first["b"] == "torch on cpu"
    assert "one bfloat16 pass" in first["reason"] and FIX in first["reason"]
    assert rv["a"]["reproduced_here"] is None   # computed on the TPU: no claim from here
    text = run_cli("explain", str(bf16_port), env={"NO_COLOR": "1", "COLUMNS": "200"}).stdout
    origin = next(line for line in text.splitlines() if line.startswith("origin: "))
    assert "(dot_general + add)" in origin and "(addmm)" in origin, origin
