"""Every source of a difference, ranked (diff/explain/sources.py), on real recordings whose
truth is computed without tracediff: counterfactual runs of the plain scripts (the same
program re-run with one source removed), and the identical runs' empty list."""

import os

import numpy as np
import pytest

from .helpers import FIXTURES, locate_json, rel_l2, run_cli, run_plain

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

GPT = "torch_gpt_adamw.py"
KERNELS = {"ATEN_CPU_CAPABILITY": "default"}
CNN = "flax_cnn_adam.py"


def _torch_params(path):
    import torch

    return {k: v.numpy() for k, v in torch.load(path).items()}


@pytest.fixture(scope="module")
def gpt(recorded, tmp_path_factory):
    """The GPT trained 3 AdamW steps with the CPU's vector kernels (a) and without them
    (b), recorded; and the truth from plain runs: the final parameters' difference as
    written, and with b started from a's initial parameters (the initialiser removed)."""
    tmp = tmp_path_factory.mktemp("gpt_truth")
    init, fa, fb, fc = (str(tmp / n) for n in ("init.pt", "a.pt", "b.pt", "c.pt"))
    run_plain(GPT, "--save-init", init, "--save-final", fa)
    run_plain(GPT, "--save-final", fb, env=KERNELS)
    run_plain(GPT, "--init-from", init, "--save-final", fc, env=KERNELS)
    pa, pb, pc = _torch_params(fa), _torch_params(fb), _torch_params(fc)
    as_written, same_init = rel_l2(pa, pb), rel_l2(pa, pc)
    if as_written == 0:
        pytest.skip("ATEN_CPU_CAPABILITY=default computes this GPT bitwise like this CPU's "
                    "vector kernels: no difference to explain here")
    paths = recorded.many({"a": (GPT, (), None), "b": (GPT, (), KERNELS)})
    return paths["a"], paths["b"], {"as_written": as_written, "same_init": same_init}


@pytest.mark.deep
def test_sources_rank_the_kernels_above_the_initialiser_as_the_counterfactual_run_does(gpt):
    a, b, truth = gpt
    doc = locate_json(a, b)
    sources = doc["sources"]["sources"]
    assert sources, doc["sources"]
    init = [s for s in sources if s["mechanism"] == "initialiser"]
    kernels = [s for s in sources if s["mechanism"] != "initialiser"]
    assert init and kernels, [(s["mechanism"], s["share"]) for s in sources]
    # the truth: starting b from a's initial parameters leaves most of the difference
    init_truth = 1.0 - truth["same_init"] / truth["as_written"]
    assert init_truth < 0.1, truth
    assert sources[0]["mechanism"] != "initialiser"
    assert sum(s["share"] for s in init) < 0.1
    assert abs(sum(s["share"] for s in init) - init_truth) < 0.05, (init, truth)
    # the kernels are b's (the side whose kernels this machine does not run)
    assert all(s["side"] in ("a", "b") and s["how"] == "adds" for s in kernels)
    ops = {op for s in kernels for op, _ in s["ops"]}
    assert any("addcmul" in op or "lerp" in op for op in ops), ops   # AdamW's vector kernels
    # the initialiser: RNG ops at step 0, with its fix
    assert {op for s in init for op, _ in s["ops"]} <= {"aten::normal_", "aten::uniform_"}
    assert init[0]["steps"] == [0, 0] and "load them" in init[0]["fix"]
    # each kernel source says what would remove it: the variable the runs set differently
    assert any("ATEN_CPU_CAPABILITY" in line for line in sources[0]["counterfactual"])
    assert "initial values" in doc["sources"]["estimator"]


@pytest.mark.deep
def test_locate_prints_the_top_sources_and_explain_all_of_them(gpt):
    a, b, _ = gpt
    out = run_cli("locate", a, b).stdout
    block = out[out.index("sources of the difference"):].splitlines()
    ranked = [line for line in block[1:] if line.startswith("  ") and line.strip()[:2]
              in {f"{i}." for i in range(1, 10)}]
    assert 2 <= len(ranked) <= 5, block[:8]
    assert "initialiser" in out[out.index("sources of the difference"):]
    explained = run_cli("explain", a, b).stdout
    assert "sources of the difference" in explained and "mechanism:" in explained
    assert "fix:" in explained


def test_identical_runs_have_no_sources(jax_gru):
    a, _ = jax_gru["a"]
    a2, _ = jax_gru["a2"]
    doc = locate_json(a, a2)
    assert doc["verdict"] == "match"
    assert not (doc.get("sources") or {}).get("sources")


def test_the_seed_under_sse4_lists_its_sources_with_mechanisms(jax_gru):
    a, _ = jax_gru["a"]
    isa, _ = jax_gru["isa"]
    doc = locate_json(a, isa)
    before = doc["first_difference"]["a"]["op"]
    sources = doc["sources"]["sources"]
    assert sources and sources[0]["mechanism"] == "initialiser"
    assert before == "erf_inv"                        # the first difference is unchanged
    assert {op for op, _ in sources[0]["ops"]} == {"erf_inv"}
    for s in sources[1:]:   # each later one computes differently on one side: the ISA flag
        assert s["side"] in ("a", "b") and s["mechanism_text"]
        assert any("XLA_FLAGS" in line for line in s["counterfactual"]), s["counterfactual"]
    # b's kernels limited to SSE4.2: the compiled step's fusion differs, a's contracts FMAs
    assert any(s["mechanism"] == "fusion" and s["side"] == "a" for s in sources)
    # an op both sides compute alike from their inputs (this machine reproduces both) is
    # never a source: every source's ops are ones the ISA flag changes or RNG ops
    assert all(op not in ("add", "mul", "sub", "div") for s in sources for op, _ in s["ops"])


def test_stats_level_sources_are_bounds_from_hashes(recorded):
    jobs = {"a": ("jax_gru_expm_adam.py", ("--steps", "1"), None, ("--level", "stats")),
            "b": ("jax_gru_expm_adam.py", ("--steps", "1"), {"XLA_FLAGS":
                                                            "--xla_cpu_max_isa=SSE4_2"},
                  ("--level", "stats"))}
    paths = recorded.many(jobs)
    doc = locate_json(paths["a"], paths["b"])
    src = doc["sources"]
    assert src["bound"] is True and "bounds" in src["note"]
    assert all(s["how"] == "introduced" for s in src["sources"])
    assert src["sources"][0]["mechanism"] == "initialiser"


@pytest.fixture(scope="module")
def cnn_on_a_tpu(recorded, tmp_path_factory):
    """The Flax CNN on this CPU (a) and as on a TPU at default precision (b): its float32
    convolutions and matmuls run as one bf16 pass (tests/perturb/bf16_pass) and its XLA
    code limited to SSE4.2, so its initialiser differs too; and the truth from plain runs:
    the final parameters' difference as written, with b's matmul precision "highest", and
    with b started from a's initial parameters."""
    from .conftest import BF16_PASS, XLA_SSE4

    tpu = {**XLA_SSE4, **BF16_PASS}
    tmp = tmp_path_factory.mktemp("cnn_truth")
    init, fa, fb, fh, fi = (str(tmp / n) for n in ("init.npz", "a.npz", "b.npz", "h.npz",
                                                    "i.npz"))
    run_plain(CNN, "--save-init", init, "--save-final", fa)
    run_plain(CNN, "--save-final", fb, env=tpu)
    run_plain(CNN, "--save-final", fh, env={**tpu, "JAX_DEFAULT_MATMUL_PRECISION": "highest"})
    run_plain(CNN, "--init-from", init, "--save-final", fi, env=tpu)
    pa, pb, ph, pi = (dict(np.load(f)) for f in (fa, fb, fh, fi))
    truth = {"as_written": rel_l2(pa, pb), "highest": rel_l2(pa, ph),
             "same_init": rel_l2(pa, pi)}
    paths = recorded.many({"a": (CNN, (), None), "b": (CNN, (), tpu)})
    return paths["a"], paths["b"], truth


@pytest.mark.deep
def test_the_bf16_passes_come_first_with_their_fix_as_the_counterfactual_run_says(cnn_on_a_tpu):
    a, b, truth = cnn_on_a_tpu
    # the truth: at precision "highest" b keeps under 1 % of the difference; with a's
    # initial parameters it keeps nearly all of it
    bf16_truth = 1 - truth["highest"] / truth["as_written"]
    init_truth = 1 - truth["same_init"] / truth["as_written"]
    assert bf16_truth > 0.99 and init_truth < 0.01, truth
    doc = locate_json(a, b)
    sources = doc["sources"]["sources"]
    first = sources[0]
    assert first["mechanism"] == "bf16_inputs" and first["side"] == "b", first
    ops = {op for op, _ in first["ops"]}
    assert {"conv_general_dilated", "dot_general"} <= ops, ops
    assert first["share"] > 0.9
    assert "highest" in first["fix"]
    assert any(line.startswith("JAX_DEFAULT_MATMUL_PRECISION=highest tracediff record")
               for line in first["counterfactual"]), first["counterfactual"]
    rng = [s for s in sources if s["mechanism"] in ("initialiser", "random_data")]
    assert rng and all(s["rank"] > 1 and s["share"] < 0.1 for s in rng)
    assert {s["mechanism"] for s in rng} == {"initialiser", "random_data"}


@pytest.fixture(scope="module")
def cnn_under_sse4(recorded, tmp_path_factory):
    """The Flax CNN on this CPU (a) and with its XLA code limited to SSE4.2 (b): the
    initialiser (erf_inv compiled without FMA) and the kernels both differ; and the truth
    from plain runs: the final parameters' difference as written and with b started from
    a's initial parameters."""
    from .conftest import XLA_SSE4

    tmp = tmp_path_factory.mktemp("cnn_sse4_truth")
    init, fa, fb, fi = (str(tmp / n) for n in ("init.npz", "a.npz", "b.npz", "i.npz"))
    run_plain(CNN, "--save-init", init, "--save-final", fa)
    run_plain(CNN, "--save-final", fb, env=XLA_SSE4)
    run_plain(CNN, "--init-from", init, "--save-final", fi, env=XLA_SSE4)
    pa, pb, pi = (dict(np.load(f)) for f in (fa, fb, fi))
    truth = {"as_written": rel_l2(pa, pb), "same_init": rel_l2(pa, pi)}
    if truth["as_written"] == 0 or truth["same_init"] >= truth["as_written"] / 2:
        pytest.skip(f"XLA_FLAGS={XLA_SSE4['XLA_FLAGS']} does not make the initialiser the "
                    f"larger part of this CNN's difference on this CPU: {truth}")
    paths = recorded.many({"a": (CNN, (), None), "b": (CNN, (), XLA_SSE4)})
    return paths["a"], paths["b"], truth


@pytest.mark.deep
def test_the_initialiser_followed_to_the_final_parameters_ranks_first(cnn_under_sse4):
    """Where the same initial parameters remove most of the difference (measured here:
    70 %), the initialiser is source 1 and its counterfactual names about that part.
    Before: its 1-ULP initial difference weighed once against every kernel event's, summed
    where they act, and it ranked second with 30 %, behind XLA's fusion."""
    a, b, truth = cnn_under_sse4
    removed = 1 - truth["same_init"] / truth["as_written"]
    sources = locate_json(a, b)["sources"]
    first = sources["sources"][0]
    assert first["mechanism"] == "initialiser", [(s["mechanism"], s["share"])
                                                   for s in sources["sources"]]
    predicted = 1 - (1 - first["share"]) ** 0.5
    assert abs(predicted - removed) < 0.2, (predicted, truth)
    assert f"should remove ~{predicted:.0%}" in " ".join(first["counterfactual"])
    assert "followed to the final parameters" in sources["estimator"]


ARGUMENTS = """
import sys, torch
c1, c2 = float(sys.argv[1]), float(sys.argv[2])
x = torch.tensor([1.0, -2.0, 3.0])
a = x * c1                                 # other=c1: the program's own scalar
b = torch.tensor([4.0, 5.0, 6.0]) / c2     # c2 = 0 on one side: Inf
print((a.sum() + b.sum()).item())
"""


def _arguments_pair(tmp_path, a_args, b_args, options=()):
    script = tmp_path / "scaled.py"
    script.write_text(ARGUMENTS)
    paths = []
    for name, args in (("a", a_args), ("b", b_args)):
        out = tmp_path / f"{name}.h5"
        run_cli("record", *options, "-o", out, script, *args, check=True)
        paths.append(str(out))
    return locate_json(*paths)["sources"]


def test_an_op_whose_arguments_differ_is_the_program_never_the_hardware(tmp_path):
    """`x * 2.0` against `x * 3.0`: the trace records other=2.0 / 3.0; the source says so,
    with the fix in the program, not "hardware, or a library loaded at run time", and
    names the script's own arguments where the runs were given different ones."""
    srcs = _arguments_pair(tmp_path, ("2.0", "1.0"), ("3.0", "1.0"))
    (s,) = srcs["sources"]
    assert s["mechanism"] == "arguments" and s["arguments"] == "other=2.0 vs 3.0"
    assert s["share"] == 1.0 and s["ops"] == [["aten::mul.Tensor", 1]]
    assert "arguments differ (other=2.0 vs 3.0)" in s["text"]
    assert "hardware" not in s["fix"] and "other arguments" in s["fix"]
    # the runs' command lines differ too (2.0 against 3.0): the fix says so, with its key
    assert "(the script's own arguments differ too)" in s["fix"]
    assert s["causes"] == ["script.argv"]


def test_shares_are_finite_or_absent_with_the_reason(tmp_path):
    """One run divides by zero: its source's relative difference is Inf, which no finite
    share can hold beside the finite one ("nan%" before); so the sources carry no share,
    come in the order they first appear, and say why; each names its own arguments."""
    srcs = _arguments_pair(tmp_path, ("2.0", "1.0"), ("3.0", "0.0"))
    assert "not finite" in srcs["no_shares"]
    assert [s["share"] for s in srcs["sources"]] == [None, None]
    assert [s["arguments"] for s in srcs["sources"]] == ["other=2.0 vs 3.0", "other=1.0 vs 0.0"]
    inf = srcs["sources"][1]
    assert inf["mechanism_text"].startswith("b makes Inf where a makes finite numbers")
    assert "nan%" not in inf["text"] and "should remove its part" in inf["counterfactual"][0]


@pytest.mark.parametrize("level", ["full", "stats"])
def test_a_difference_in_the_sign_of_zero_alone_is_the_whole_difference(tmp_path, level):
    """Outputs that differ only in the sign of zero: one source, 100 % at every level (it
    was ranked 0.0 % at full level and 100 % at stats), in words of its own."""
    options = () if level == "full" else ("--level", "stats")
    srcs = _arguments_pair(tmp_path, ("0.0", "1.0"), ("-0.0", "1.0"), options)
    (s,) = srcs["sources"]
    assert s["share"] == 1.0 and s["arguments"] == "other=0.0 vs -0.0"
    if level == "full":
        assert s["mechanism_text"].startswith("the outputs differ only in the sign of zero")


MASKED = """
import sys, torch
torch.manual_seed(0)
x, w = torch.randn(4, 8), torch.randn(8, 8)
with torch.autocast("cpu", dtype=torch.bfloat16, enabled=sys.argv[1] == "on"):
    s = x @ w                                              # bfloat16 under autocast
    fill = torch.full([], torch.finfo(s.dtype).min, dtype=s.dtype)   # a mask's fill value
    s = torch.where(torch.ones(4, 8, dtype=torch.bool).tril(), s, fill)
print(s.float().sum().item())
"""


def test_arguments_that_only_follow_a_change_of_dtype_are_the_dtype(tmp_path):
    """Under autocast a mask's fill is `finfo(bfloat16).min` and its dtype bfloat16: the
    op's arguments differ only because its dtype does. Every source is the change of dtype
    on b, never "arguments differ" (GPT-2 under autocast, tests/field, ranked two such
    `full`/`scalar_tensor` sources as the program's arguments)."""
    script = tmp_path / "masked.py"
    script.write_text(MASKED)
    paths = []
    for name, arg in (("a", "off"), ("b", "on")):
        run_cli("record", "-o", tmp_path / f"{name}.h5", script, arg, check=True)
        paths.append(str(tmp_path / f"{name}.h5"))
    srcs = locate_json(*paths)["sources"]["sources"]
    ops = {op for s in srcs for op, _ in s["ops"]}
    assert "aten::full" in ops, srcs
    assert all(s["mechanism"] == "dtype" and s["side"] == "b" for s in srcs), \
        [(s["mechanism"], s["arguments"], s["ops"]) for s in srcs]


OWN_BF16 = """
import sys
import jax, jax.numpy as jnp
dt = jnp.bfloat16 if "--bf16" in sys.argv else jnp.float32
kx, kw = jax.random.split(jax.random.PRNGKey(0))
x, w = jax.random.normal(kx, (16, 32)), jax.random.normal(kw, (32, 8))

@jax.jit
def head(x, w):   # the program's own choice: bf16 operands, float32 products
    return jnp.tanh(jnp.dot(x.astype(dt), w.astype(dt), preferred_element_type=jnp.float32))

print(float(head(x, w).sum()))
"""


def test_a_jax_programs_own_bf16_operands_are_the_dtype_not_a_kernel(tmp_path):
    """`preferred_element_type=float32` on bf16 operands in b only: the dot's outputs are
    float32 on both sides, its inputs are not. The source is the change of dtype on b (it
    was "implementation, matmul": a kernel computing differently)."""
    pytest.importorskip("jax")
    script = tmp_path / "head.py"
    script.write_text(OWN_BF16)
    paths = []
    for name, args in (("a", ()), ("b", ("--bf16",))):
        run_cli("record", "-o", tmp_path / f"{name}.h5", script, *args, check=True)
        paths.append(str(tmp_path / f"{name}.h5"))
    first = locate_json(*paths)["sources"]["sources"][0]
    assert first["mechanism"] == "dtype" and first["side"] == "b", first
    assert dict(first["ops"]).get("dot_general"), first["ops"]
    assert "inputs float32 vs bfloat16" in first["mechanism_text"]


@pytest.mark.deep
def test_a_plain_jax_initialiser_is_the_initialiser_and_the_batch_random_data(tmp_path):
    """fixtures/jax_mlp_flags.py draws its parameters with `jax.nn.initializers` at top level
    (no module) and its batch with `jax.random.normal`; under `--xla_cpu_max_isa=SSE4_2`
    every draw differs. The draws that become the first optax step's parameters are the
    initialiser, the other random data (before, all three were "random data")."""
    pytest.importorskip("optax")
    paths = []
    for name, env in (("a", None), ("b", {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"})):
        run_cli("record", "-o", tmp_path / f"{name}.h5",
                os.path.join(FIXTURES, "jax_mlp_flags.py"), env=env, check=True)
        paths.append(str(tmp_path / f"{name}.h5"))
    sources = locate_json(*paths)["sources"]["sources"]
    draws = {s["mechanism"]: dict(s["ops"]).get("erf_inv") for s in sources
             if s["mechanism"] in ("initialiser", "random_data")}
    if not draws:
        pytest.skip("SSE4_2 draws the same numbers as this CPU's own ISA")
    assert draws == {"initialiser": 2, "random_data": 1}, sources


REDRAWN = """
import sys
import numpy as np
import torch

torch.manual_seed(0)
emb = torch.nn.Embedding(64, 64)            # normal_ on fresh memory
drawn = {"first": emb.weight.detach().clone()}
with torch.no_grad():
    emb.weight.normal_(0.0, 0.02)           # drawn again over it, as HF's _init_weights does
drawn["again"] = emb.weight.detach().clone()
opt = torch.optim.SGD(emb.parameters(), lr=0.1)
loss = (emb(torch.arange(8)) ** 2).mean()
loss.backward()
opt.step()
np.savez(sys.argv[1], **{k: v.numpy() for k, v in drawn.items()})
"""


def test_the_initialiser_is_every_draw_weighed_as_its_values_as_a_whole(tmp_path):
    """A weight drawn by its constructor and drawn again by `normal_` (HF's `_init_weights`):
    the redraw reads the first draw, which differs between the runs, yet it is part of the
    initialiser (it writes over what it reads); and the initialiser's weight is the
    relative difference of the draws' values as a whole, sqrt(sum |a-b|^2 / sum |a|^2)
    over the draws that differ, computed here from the draws the program saved."""
    script = tmp_path / "redrawn.py"
    script.write_text(REDRAWN)
    paths, draws = [], []
    for name, env in (("a", None), ("b", KERNELS)):
        out, saved = tmp_path / f"{name}.h5", tmp_path / f"{name}.npz"
        run_cli("record", "-o", out, script, saved, env=env, check=True)
        paths.append(str(out))
        draws.append(dict(np.load(saved)))
    a, b = draws
    if np.array_equal(a["first"], b["first"]):
        pytest.skip("ATEN_CPU_CAPABILITY=default draws the same numbers as this CPU's "
                    "vector kernels: no initialiser difference here")
    differ = [k for k in a if not np.array_equal(a[k], b[k])]
    truth = (sum(float(np.sum((a[k].astype(np.float64) - b[k]) ** 2)) for k in differ) /
             sum(float(np.sum(a[k].astype(np.float64) ** 2)) for k in differ)) ** 0.5
    sources = locate_json(*paths)["sources"]["sources"]
    (init,) = [s for s in sources if s["mechanism"] == "initialiser"]
    assert dict(init["ops"]).get("aten::normal_") == 2 and init["how"] == "introduced", init
    assert abs(init["weight"] - truth) <= 1e-9 * truth, (init["weight"], truth)
