"""Flax <-> PyTorch ports as users write them (fixtures/port_*.py: `init` + `apply`, weights
copied into the torch module, optax.adam vs torch.optim.Adam), recorded once per module,
located in one trace (both frameworks in one process) and in two (one script per side).

What a user relies on: the pair the tool makes (the apply-time layer, not the init-time
forward; every layer of a transformer), the finding (layer on both sides, module paths,
source lines, inputs_match, the values, checked against numpy), never a verdict from a
pair whose values are equal, and the optimizer state compared by role.
"""

import json
import os
import runpy
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import tracediff
from tracediff.cli import main as cli
from tracediff.diff.locate import open_differ
from tracediff.trace import schema

from .helpers import FIXTURES, ROOT, fixture_line, script_env

TF32 = os.path.join(ROOT, "tests", "perturb", "tf32_addmm")

# Recorded in one process with a shared XLA compilation cache (the one-process and the
# two-script recordings of a fixture compile the same initialisers): name, script,
# frameworks captured, script arguments, and last the transformer with torch's addmm
# multiplying in TF32 precision (the perturbation patches torch for the rest of the
# process: nothing is recorded after it).
JOBS = [
    ("rep", "port_dense_linear.py", "jax,torch", ()),
    ("rep_flax", "port_dense_linear.py", "jax", ("--side", "flax")),
    ("rep_torch", "port_dense_linear.py", "torch", ("--side", "torch")),
    ("rep_batch", "port_dense_linear.py", "jax,torch", ("--init-on-batch",)),
    ("mlp_flax", "port_mlp_adam.py", "jax", ("--side", "flax")),
    ("mlp_torch", "port_mlp_adam.py", "torch", ("--side", "torch")),
    ("mlpw_flax", "port_mlp_adam.py", "jax", ("--side", "flax", "--hidden", "12", "--adamw")),
    ("mlpwm_flax", "port_mlp_adam.py", "jax",
     ("--side", "flax", "--hidden", "12", "--adamw", "--decay-mask")),
    ("mlpw_torch", "port_mlp_adam.py", "torch", ("--side", "torch", "--hidden", "12", "--adamw")),
    # layers named in an order their names do not sort in (optax's pytree is sorted by name)
    ("mlpwmn_flax", "port_mlp_adam.py", "jax",
     ("--side", "flax", "--hidden", "12", "--adamw", "--decay-mask", "--names", "proj,head")),
    ("mlpwn_torch", "port_mlp_adam.py", "torch",
     ("--side", "torch", "--hidden", "12", "--adamw", "--names", "proj,head")),
    ("conv", "port_conv.py", "jax,torch", ()),
    ("nnx", "port_nnx.py", "jax,torch", ()),
    ("shared", "port_shared.py", "jax,torch", ()),
    ("tr_after", "port_transformer.py", "jax,torch", ("--torch-scale", "after")),
    ("tr_cache", "port_transformer.py", "jax,torch", ("--torch-cache",)),
    ("tr_pad", "port_transformer.py", "jax,torch", ("--pad-mask",)),
    ("positions", "port_positions.py", "jax,torch", ()),
    ("positions_bug", "port_positions.py", "jax,torch", ("--bug", "pos")),
    ("rms_eps", "port_rmsnorm.py", "jax,torch", ("--flax-eps", "1e-2")),
    ("rotary", "port_rotary.py", "jax,torch", ()),
    ("rotary_kernel", "port_rotary.py", "jax,torch", ("--bug", "kernel")),
    ("rotary_base", "port_rotary.py", "jax,torch", ("--bug", "base")),
    ("rms_train", "port_rmsnorm.py", "jax,torch", ("--train",)),
    ("mask_cast", "port_mask_cast.py", "jax,torch", ()),
    ("tr_grad", "port_transformer.py", "jax,torch", ("--grad",)),
    ("tr_pad_attn", "port_transformer.py", "jax,torch",
     ("--pad-attention", "--torch-scale", "after", "--grad")),
    ("tr_pad_qk", "port_transformer.py", "jax,torch", ("--pad-attention", "--swap-qk")),
    ("bn_train", "port_batchnorm.py", "jax,torch", ()),
    ("bn_train_eps", "port_batchnorm.py", "jax,torch", ("--bug", "eps")),
    ("tr32", "port_transformer.py", "jax,torch", (), TF32),
]
BATCH = r"""
import json, runpy, sys
from tracediff.runner.script import record_script
for job in json.loads(sys.argv[2]):
    if job["perturb"]:
        runpy.run_path(job["perturb"] + "/sitecustomize.py")
    rc = record_script(job["script"], job["args"], sys.argv[1] + "/" + job["name"] + ".h5",
                       frameworks=tuple(job["frameworks"].split(",")))
    if rc:
        sys.exit(job["name"] + ": the script exited " + str(rc))
"""


def _env(cache):
    """The recordings' environment: this checkout, and XLA's persistent compilation
    cache in `cache` (the same programs are compiled once, not once per recording; the
    compiled code, and so every recorded value, is the same)."""
    env = script_env()
    env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    return env


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("ports")
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or d / "xla-cache"   # conftest's
    jobs = [{"name": name, "script": os.path.join(FIXTURES, script), "frameworks": fws,
             "args": list(args), "perturb": perturb[0] if perturb else None}
            for name, script, fws, args, *perturb in JOBS]
    batch = subprocess.run([sys.executable, "-c", BATCH, str(d), json.dumps(jobs)],
                           env=_env(cache), cwd=ROOT, capture_output=True, text=True,
                           timeout=900)
    assert batch.returncode == 0, batch.stderr[-4000:]
    paths = {name: str(d / f"{name}.h5") for name, *_ in JOBS}
    paths["stdout"] = batch.stdout
    return paths


_RESULTS = {}


def _locate(a, b=None, **kw):
    """tracediff.locate, once per argument set (results are shared by the tests)."""
    key = (a, b, tuple(sorted(kw.items())))
    if key not in _RESULTS:
        _RESULTS[key] = tracediff.locate(a, b, **kw)
    return _RESULTS[key]


def _units(result):
    return [m for m in result.mapping if m["by"] not in ("value", "role")]


def _module_pairs(result):
    return {(m["a_module"], m["b_module"]) for m in _units(result)}


def _first_in(t, framework, op, after=-1):
    ev = t.events
    for e in range(after + 1, len(t)):
        if ev["framework"][e] == framework and t.string(ev["op"][e]) == op:
            return e
    return None


def _input(t, e, slot):
    r = next(r for r in t.input_rows(e) if int(r["slot"]) == slot)
    return t.outputs(int(r["producer"]))[int(r["producer_slot"])]


# -- the reporter's pattern: dense.init on ones, dense.apply on x, torch Linear with the weights

def test_reporter_one_process_names_the_apply_time_matmul(traces):
    r = _locate(traces["rep"], rtol=0, atol=0)
    with tracediff.load(traces["rep"]) as t:
        # the init-time forward reads jnp.ones; the apply-time one reads x (the numpy truth)
        dots = [e for e in range(len(t)) if t.events["framework"][e] == schema.FW_JAX and
                t.string(t.events["op"][e]) == "dot_general"]
        init, apply = sorted(dots, key=lambda e: not np.all(_input(t, e, 0) == 1))
        assert np.all(_input(t, init, 0) == 1) and not np.all(_input(t, apply, 0) == 1)
        x, kernel = _input(t, apply, 0), _input(t, apply, 1)
        add = _first_in(t, schema.FW_JAX, "add", apply)
        addmm = _first_in(t, schema.FW_TORCH, "aten::addmm")
        bias, x_b, w_t = (_input(t, addmm, i) for i in range(3))
        jax_out, torch_out = t.outputs(add)[0], t.outputs(addmm)[0]
    # inputs and weights are bitwise equal (torch reads weight.t(), the Flax kernel)
    assert x.tobytes() == x_b.tobytes() and kernel.tobytes() == w_t.tobytes()
    exact = x.astype(np.float64) @ kernel.astype(np.float64) + bias.astype(np.float64)
    # exactly one layer pair: the apply-time Dense with the Linear; the init-time one unpaired
    units = _units(r)
    assert [(m["a"], m["b"], m["family"]) for m in units] == [(add, addmm, "linear")]
    assert all(m["a"] != init for m in r.mapping)
    if np.array_equal(jax_out, torch_out):    # a CPU on which both BLAS agree bitwise
        assert r.first_difference is None and r.verdict == "match"
        return
    f = r.first_beyond_tolerance
    assert f is r.first_difference or f.a["index"] == r.first_difference.a["index"]
    assert (f.a["index"], f.b["index"]) == (add, addmm)
    assert f.layer["text"] == "Dense dense (dot_general + add) <-> Linear (top level) (addmm)"
    assert f.layer["a_module"] == "dense" and f.layer["b_module"] == ""
    assert f.a["source"] == f.layer["a_source"] == fixture_line("port_dense_linear.py", "dense.apply(params, x)")
    assert f.b["source"] == fixture_line("port_dense_linear.py", "torch_dense(torch_x)")
    assert f.inputs_match is True and f.inputs_reason.startswith("all 3 inputs and parameters match")
    assert f.metrics["max_abs"] == pytest.approx(float(np.abs(jax_out - torch_out).max()))
    assert 0 < f.metrics["max_abs"] < 1e-4           # ULPs, not the 4.18 of a wrong pairing
    err = {s: float(np.abs(o.astype(np.float64) - exact).sum()) for s, o in (("a", jax_out), ("b", torch_out))}
    closer = min(err, key=err.get)
    assert r.explain["verdict"].split(": ", 1)[1].startswith(f"{closer} is closer to the float64")


def test_reporter_two_scripts_give_the_same_finding(traces):
    one = _locate(traces["rep"], rtol=0, atol=0)
    two = _locate(traces["rep_flax"], traces["rep_torch"], rtol=0, atol=0)
    assert [(m["a_module"], m["b_module"], m["family"]) for m in _units(two)] == \
        [("dense", "", "linear")]
    if one.first_difference is None:
        assert two.first_difference is None
        return
    f1, f2 = one.first_beyond_tolerance, two.first_beyond_tolerance
    assert f2.layer["text"] == f1.layer["text"] and f2.inputs_match is True
    assert f2.a["source"] == f1.a["source"] and f2.b["source"] == f1.b["source"]
    # the same values in either form
    assert f2.metrics["max_abs"] == f1.metrics["max_abs"] and f2.metrics["max_ulp"] == f1.metrics["max_ulp"]
    j1, j2 = tracediff.to_json(one), tracediff.to_json(two)
    assert set(j1) == set(j2) and set(j1["first_beyond_tolerance"]) == set(j2["first_beyond_tolerance"])
    assert j1["traces"]["a"]["framework"] == "jax" and j1["traces"]["b"]["framework"] == "torch"



def test_an_init_time_forward_on_the_batch_itself_is_left_unpaired(traces):
    """`dense.init(key, x)` on the real batch: the init-time forward reads the same x and
    the same kernel as the apply-time one, so both have the same direct inputs as the torch
    Linear. Strict pairing matches such units from the end: the apply-time one pairs (the
    init-time one came first), as with an init on ones."""
    r = _locate(traces["rep_batch"], rtol=0, atol=0)
    with tracediff.load(traces["rep_batch"]) as t:
        dots = [e for e in range(len(t)) if t.events["framework"][e] == schema.FW_JAX and
                t.string(t.events["op"][e]) == "dot_general"]
        init, apply = dots
        for slot in (0, 1):       # the premise: the same inputs, bitwise
            assert _input(t, init, slot).tobytes() == _input(t, apply, slot).tobytes()
        add = _first_in(t, schema.FW_JAX, "add", apply)
        init_add = _first_in(t, schema.FW_JAX, "add", init)
        addmm = _first_in(t, schema.FW_TORCH, "aten::addmm")
    units = _units(r)
    assert [(m["a"], m["b"], m["family"]) for m in units] == [(add, addmm, "linear")]
    assert not [m for m in r.mapping if m["a"] in (init, init_add)]   # the init-time one: unpaired
    f = r.first_difference
    if f is not None:
        assert (f.a["index"], f.b["index"]) == (add, addmm)
        assert f.a["source"] == fixture_line("port_dense_linear.py", "dense.apply(params, x)")


def test_one_trace_in_the_cli(traces, tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["locate", traces["rep"], "--rtol", "0", "--atol", "0"],
                        env={"NO_COLOR": "1", "COLUMNS": "300"})
    api = _locate(traces["rep"], rtol=0, atol=0)
    assert res.exit_code == api.exit_code, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith(("DIVERGED", "MATCH")) and "(jax)" in lines[0] and "(torch)" in lines[0]
    if api.first_beyond_tolerance is not None:
        assert "Dense dense (dot_general + add) <-> Linear (top level) (addmm)" in lines[1]
        assert f"tracediff explain {traces['rep']} " in res.output   # one trace, one argument
    res = runner.invoke(cli, ["locate", traces["rep"], "--rtol", "0", "--atol", "0", "--json"])
    d = json.loads(res.output)
    assert d["exit_code"] == api.exit_code == res.exit_code
    assert d["alignment"]["counted"] == "computing units" and d["alignment"]["matched"] == 1
    if d["first_beyond_tolerance"]:
        assert d["first_beyond_tolerance"]["layer"]["family"] == "linear"
    res = runner.invoke(cli, ["explain", traces["rep"]])
    assert res.exit_code == _locate(traces["rep"]).exit_code and "origin:" in res.output
    report = tmp_path / "r.md"
    res = runner.invoke(cli, ["report", traces["rep"], "-o", str(report)])
    assert res.exit_code == 0 and "The jax and torch sides of `port_dense_linear.py`" in report.read_text()
    # one trace of one framework: nothing to compare, one line, exit 2
    res = runner.invoke(cli, ["locate", traces["rep_flax"]])
    assert res.exit_code == 2 and "JAX and PyTorch" in res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


# -- an MLP trained with optax.adam and its torch port with torch.optim.Adam, two scripts

def test_mlp_adam_first_difference_is_the_first_layer(traces):
    r = _locate(traces["mlp_flax"], traces["mlp_torch"], rtol=0, atol=0)
    pairs = [(m["a_module"], m["b_module"], m["family"], m["phase"]) for m in _units(r)]
    # both steps: fc1, relu, fc2 forward; the backward of both layers
    for step_pair in (("MLP/fc1", "fc1", "linear", "forward"), ("MLP/fc2", "fc2", "linear", "forward"),
                      ("MLP", "", "max", "forward"), ("MLP/fc1", "fc1", "matmul", "backward"),
                      ("MLP/fc2", "fc2", "sum", "backward")):
        assert pairs.count(step_pair) == 2, (step_pair, pairs)
    f = r.first_difference
    with tracediff.load(traces["mlp_flax"]) as ta, tracediff.load(traces["mlp_torch"]) as tb:
        fc1 = next(m for m in _units(r) if m["a_module"] == "MLP/fc1" and m["family"] == "linear")
        differs = not np.array_equal(ta.outputs(fc1["a"])[0], tb.outputs(fc1["b"])[0])
    if differs:     # this CPU: XLA's dot and MKL's sgemm round differently at batch 2
        assert (f.a["index"], f.b["index"]) == (fc1["a"], fc1["b"])
        assert f.layer["text"] == "Dense MLP/fc1 (dot_general + add) <-> Linear fc1 (addmm)"
        assert f.a["step"] == 0 and f.inputs_match is True and f.metrics["max_abs"] > 0
        assert f.a["source"] == fixture_line("port_mlp_adam.py", "nn.Dense(args.hidden, name=first)")
        assert f.b["source"] == fixture_line("port_mlp_adam.py", "return fc2(torch.relu(fc1(x)))")
        assert r.explain["verdict"].split(": ", 1)[1].startswith(("a is closer", "b is closer"))
    else:
        assert f is None or f.a["index"] > fc1["a"]


def test_mlp_adam_no_verdict_from_equal_values_and_optimizer_by_role(traces):
    r = _locate(traces["mlp_flax"], traces["mlp_torch"])
    for f in (r.first_difference, r.first_beyond_tolerance):
        if f is not None:
            assert f.metrics["max_abs"] > 0 and not f.metrics.get("bitwise_equal")
    # values paired by value: never an integer with a float
    with tracediff.load(traces["mlp_flax"]) as ta, tracediff.load(traces["mlp_torch"]) as tb:
        d, _ = open_differ(ta, tb)
        for ra, rb, _how in d.p.atom_rows.values():
            kinds = {ta.string(ra["dtype"])[:3] == "int", tb.string(rb["dtype"])[:3] == "int"}
            assert len(kinds) == 1
        # optax's int32 count and torch's float32 step compare by value: equal, not a difference
        m = d.compare_values(np.array(1, np.int32), np.array(1.0, np.float32), "int32", "float32")
        assert m["bitwise_equal"] and m["within_tolerance"] and m["dtype_mismatch"] == ["int32", "float32"]
        m = d.compare_values(np.array(0, np.int32), np.array(1.0, np.float32), "int32", "float32")
        assert not m["bitwise_equal"] and not m["within_tolerance"]
    roles = {(m["a_op"], m["b_op"]) for m in r.mapping if m["by"] == "role"}
    for pair in (("state/mu/params/fc1/kernel", "state/fc1.weight/exp_avg"),
                 ("state/nu/params/fc2/bias", "state/fc2.bias/exp_avg_sq"),
                 ("state/count", "state/fc1.weight/step"),
                 ("grads/params/fc1/kernel", "grads/fc1.weight"),
                 ("params/params/fc1/kernel + updates", "params/fc1.weight")):
        assert pair in roles, sorted(roles)
    assert [s["step"] for s in r.optimizer_steps] == [0, 1]
    for s in r.optimizer_steps:
        assert s["by"] == "role" and s["compared"] == 17     # 4 x (params, grads, mu, nu) + count
        assert s["bitwise_equal"] or " <-> params/" in s["worst"]
        assert s["max_rel"] < 1e-2     # the same training, to float32 rounding


def test_optimizer_roles_sgd_momentum_and_adamw():
    """The names the recorders write for optax.sgd(momentum) / optax.adamw and torch's SGD /
    AdamW (as recorded from those optimizers) pair by role."""
    from tracediff.diff.align import optroles

    jax_names = ["grads/params/fc1/bias", "grads/params/fc1/kernel", "params/params/fc1/bias",
                 "params/params/fc1/kernel", "updates/params/fc1/bias", "updates/params/fc1/kernel"]
    torch_names = ["params/fc1.weight", "grads/fc1.weight", "params/fc1.bias", "grads/fc1.bias"]
    sizes = {n: 2 if n.endswith("bias") else 6 for n in jax_names + torch_names}
    sgd = optroles.role_pairs(
        jax_names + ["state/trace/params/fc1/bias", "state/trace/params/fc1/kernel"], "jax",
        torch_names + ["state/fc1.weight/momentum_buffer", "state/fc1.bias/momentum_buffer"],
        "torch", {**sizes, "state/trace/params/fc1/kernel": 6}, sizes)
    got = {(role, optroles.after_step_name(a), b) for role, a, b, _ in sgd}
    assert ("state:momentum_buffer", "state/trace/params/fc1/kernel",
            "state/fc1.weight/momentum_buffer") in got
    assert ("params", "params/params/fc1/kernel + updates", "params/fc1.weight") in got
    assert ("grads", "grads/params/fc1/bias", "grads/fc1.bias") in got
    adamw = optroles.role_pairs(
        jax_names + ["state/count", "state/mu/params/fc1/kernel", "state/nu/params/fc1/kernel"],
        "jax", torch_names + ["state/fc1.weight/step", "state/fc1.weight/exp_avg",
                              "state/fc1.weight/exp_avg_sq"], "torch", sizes, sizes)
    got = {(role, optroles.after_step_name(a), b) for role, a, b, _ in adamw}
    assert {("state:exp_avg", "state/mu/params/fc1/kernel", "state/fc1.weight/exp_avg"),
            ("state:exp_avg_sq", "state/nu/params/fc1/kernel", "state/fc1.weight/exp_avg_sq"),
            ("count", "state/count", "state/fc1.weight/step")} <= got
    # torch's root module has no prefix ("weight"): paired by leaf and size
    root = optroles.role_pairs(jax_names, "jax", ["params/weight", "params/bias"], "torch",
                               sizes, {"params/weight": 6, "params/bias": 2})
    assert {(optroles.after_step_name(a), b) for _, a, b, _ in root} == {
        ("params/params/fc1/kernel + updates", "params/weight"),
        ("params/params/fc1/bias + updates", "params/bias")}


def test_a_parameter_whose_gradient_is_rounding_noise_is_undetermined():
    """CLIP's key-projection bias has a gradient that is zero but for rounding (the two
    sides 9e-10 apart, no digit in common); AdamW makes each side's noise a step of up to
    lr, and the bias differs after the step by relative L2 4e-4 in a correct port ('the
    update rule differs' before). Elements whose gradient is noise are not judged; the
    same difference where the gradient is determined is beyond tolerance, and so is a
    decay on the determined elements beside noisy ones."""
    from tracediff.diff.pairing.roles import beyond_where_determined, noise_elements

    rng = np.random.default_rng(0)
    ga = np.concatenate([rng.normal(0, 1e-9, 8), rng.normal(0, 1e-2, 8)]).astype(np.float32)
    gb = ga + np.concatenate([rng.normal(0, 1e-9, 8), ga[8:] * 1e-6]).astype(np.float32)
    noise = noise_elements(ga, gb)
    assert noise[:8].all() and not noise[8:].any()
    before = rng.uniform(-0.1, 0.1, 16)
    a = before - 1e-3 * np.sign(ga)
    b = before - 1e-3 * np.sign(gb)                        # Adam's steps of the noise
    assert (a != b).any()
    assert not beyond_where_determined(a, b, ~noise, 1e-5, 1e-6)
    assert beyond_where_determined(a, b, Ellipsis, 1e-5, 1e-6)   # judged on every element
    decayed = a - 1e-4 * before                            # decoupled decay on one side
    assert beyond_where_determined(decayed, b, ~noise, 1e-5, 1e-6)


def _adamw_truth(flax_trace, torch_trace):
    """[(step, torch name, beyond)]: the parameters after each step, read from the two
    snapshots by name (optax: params + updates; torch: params), the kernel transposed,
    judged per tensor against float32's rtol/atol, in torch's parameter order."""
    out = []
    with tracediff.load(flax_trace) as ta, tracediff.load(torch_trace) as tb:
        sa = [e for e in range(len(ta)) if ta.events["kind"][e] == schema.KIND_OPTIM]
        sb = [e for e in range(len(tb)) if tb.events["kind"][e] == schema.KIND_OPTIM]
        for ea, eb in zip(sa, sb):
            va = {ta.string(r["name"]): ta.read_value(r) for r in ta.value_rows(ea, schema.ROLE_OUT)}
            vb = [(tb.string(r["name"]), tb.read_value(r)) for r in tb.value_rows(eb, schema.ROLE_OUT)]
            for name, xb in vb:
                if not name.startswith("params/"):
                    continue
                mod, leaf = name[len("params/"):].split(".")
                key = "kernel" if leaf == "weight" else "bias"
                xa = va[f"params/params/{mod}/{key}"] + va[f"updates/params/{mod}/{key}"]
                xb = xb.T if key == "kernel" else xb
                diff = np.linalg.norm(xa - xb)
                out.append((int(ta.events["step"][ea]), name[len("params/"):],
                            diff > 1e-5 * np.linalg.norm(xa) + 1e-6 * np.sqrt(xa.size)))
    return out


def test_adamw_square_layer_and_decay_mask_by_role(traces):
    """optax.adamw vs torch.optim.AdamW with a square 12x12 fc1: its kernel is compared with
    the torch weight transposed by role (not left as is because the shapes agree); the HF
    examples' decay mask on the optax side is named at the first parameter it changes."""
    ok = _locate(traces["mlpw_flax"], traces["mlpw_torch"])
    assert not any(b for _, _, b in _adamw_truth(traces["mlpw_flax"], traces["mlpw_torch"]))
    assert ok.first_parameter is None
    for s in ok.optimizer_steps:
        # the square kernel transposed by role: rounding (was 1.34 compared as laid out)
        assert s.beyond == 0 and s.worst_rel_l2 is not None and s.worst_rel_l2 < 1e-4
    truth = _adamw_truth(traces["mlpwm_flax"], traces["mlpw_torch"])
    step, name, _ = next(t for t in truth if t[2])
    # fc1.weight decays on both sides; the biases start at 0 (Flax's init), so decay changes
    # them from the second step on
    assert (step, name) == (1, "fc1.bias")
    r = _locate(traces["mlpwm_flax"], traces["mlpw_torch"])
    p = r.first_parameter
    assert (p.step, p.parameter, p.role) == (step, name, "params") and r.exit_code == 1
    assert p.weight_decay and p.upstream_match and p.decay == pytest.approx(1e-2 * 0.1, rel=0.05)
    assert set(p.decay_parameters) == {n for s, n, b in truth if s == step and b}
    assert "a (jax) applies" in p.note and "its biases" in p.note
    from tracediff.report import html, markdown
    from tracediff.report.context import report_context

    ctx = report_context(r)
    for text in (markdown.render(r, ctx), html.render(r, ctx)):   # every renderer names it
        assert "First parameter beyond tolerance" in text and "fc1.bias" in text



def test_the_first_parameter_is_first_in_the_models_order_not_by_name(traces):
    """Layers named proj (first) and head (second): optax's pytree lists head before proj,
    torch's `named_parameters()` the model's order. The decay mask changes both biases in
    step 1; the first parameter named is proj's, and the parameters are listed in that order."""
    truth = _adamw_truth(traces["mlpwmn_flax"], traces["mlpwn_torch"])
    step = next(s for s, _, b in truth if b)
    beyond = [n for s, n, b in truth if s == step and b]   # in torch's parameter order
    assert beyond == ["proj.bias", "head.bias"]
    p = _locate(traces["mlpwmn_flax"], traces["mlpwn_torch"]).first_parameter
    assert (p.step, p.parameter, p.role) == (step, "proj.bias", "params")
    assert p.decay_parameters == beyond


def test_mlp_map_restricts_modules(traces, tmp_path):
    m = tmp_path / "map.json"
    m.write_text(json.dumps({"MLP/fc1": "fc1"}))
    r = _locate(traces["mlp_flax"], traces["mlp_torch"], map_file=str(m))
    mapped = [x for x in _units(r) if x["a_module"] == "MLP/fc1" or x["b_module"] == "fc1"]
    assert len(mapped) == 6        # forward linear and the backward matmul + sum, both steps
    for x in mapped:
        assert (x["a_module"], x["b_module"]) == ("MLP/fc1", "fc1") and x["by"] == "user map"
    for x in _units(r):             # never across op families (no random_wrap/sqrt/div <-> addmm)
        if x["b_op"] == "addmm":
            assert x["a_op"] == "dot_general + add"


def test_positions_of_the_batchs_shape_pair_with_a_buffer_they_broadcast_from(traces):
    """Flax given position_ids [2, 8], torch reading its [1, 8] buffer (HF CLIP's way): the
    lookups' outputs [2, 8, 32] and [1, 8, 32] are one value through broadcasting, and the
    two index values are tied by dataflow (lookups into the same table), not by equal
    integers; positions off by one are found at that lookup. Before, nothing after the
    lookups paired (INCONCLUSIVE both times: 1 of 4 torch units paired)."""
    r = _locate(traces["positions"])
    assert r.verdict == "match", (r.first_beyond_tolerance, r.coverage)
    assert r.coverage.a.paired == r.coverage.a.events and \
        r.coverage.b.paired == r.coverage.b.events == 4, r.coverage
    assert any("broadcasts to the other ([2, 8, 32] and [1, 8, 32])" in m["how"]
               for m in r.mapping), r.mapping
    r = _locate(traces["positions_bug"])
    f = r.first_beyond_tolerance
    assert r.verdict == "diverged" and f.layer["module"]["b"] == "pos", f.layer
    with tracediff.load(traces["positions_bug"]) as t:     # the truth: table rows i+1 vs i
        e = int(f.b.index)
        weight = t.input_rows(e)[0]       # aten::embedding(weight, indices)
        table = np.asarray(t.read_value(t.value_rows(int(weight["producer"]), schema.ROLE_OUT)[
            int(weight["producer_slot"])]))
    assert f.metrics.max_abs == pytest.approx(np.abs(table[1:9] - table[:8]).max(), rel=1e-6)


def test_rotary_tables_each_side_computes_from_its_own_values_pair_within_tolerance(traces):
    """Flax gathers sin/cos rows of a numpy table (an input only Flax has), torch computes
    cos and sin on every call from its `inv_freq` buffer (HF Llama's way): one value rounded
    two ways, [2, 8, 1, 8] against [1, 1, 8, 8]. Equal within tolerance, they are an atom,
    so the rotation, the projection and the residual add pair (before: INCONCLUSIVE, 3 of 7
    and 3 of 8 units paired). The projection has no bias: its matmul pairs with torch's mm
    and the residual add `x + o(q)` with torch's add, never as one `dot_general + add` layer
    (before: 7 of 8 torch units paired, torch's `o` mm left over)."""
    r = _locate(traces["rotary"])
    assert r.verdict == "match", (r.first_beyond_tolerance, r.coverage)
    c = r.coverage
    assert c.a.paired == c.a.events == 8 and c.b.paired == c.b.events == 8, c
    near = [m for m in r.mapping if m["by"] == "value" and "within tolerance" in m["how"]]
    assert len(near) == 2 and all("([2, 8, 1, 8] and [1, 1, 8, 8])" in m["how"] for m in near)
    assert ("Rotary/o", "o", "matmul") in {(m["a_module"], m["b_module"], m["family"])
                                           for m in _units(r)}, _units(r)
    with tracediff.load(traces["rotary"]) as t:     # the truth: torch's cos against numpy's
        cos = next(e for e in range(len(t)) if t.string(t.events["op"][e]) == "aten::cos")
        table = runpy.run_path(os.path.join(FIXTURES, "port_rotary.py"))["sincos_table"]()
        diff = np.abs(t.outputs(cos)[0][0] - table[:8, 8:]).max()
    assert 0 < diff < 1e-6, diff           # other bytes, the same values
    # a table built with another base is another value: never an atom, never a MATCH; the
    # tables pair by role and are the finding (tests/test_port_breaks.py)
    r = _locate(traces["rotary_base"])
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage
    assert r.first_beyond_tolerance.layer["family"] == "table"
    assert not any("within tolerance" in m["how"] for m in r.mapping if m["by"] == "value")


def test_a_kernel_left_untransposed_is_found_at_its_matmul(traces):
    """Torch's `o` weight is the Flax kernel untransposed: the Flax kernel then holds the
    weight's own bytes (an atom with it) while torch's mm reads `weight.t()`. The two
    matmuls read the same parameter, one moved: they pair, and the finding names the kernel
    as the input that differs, with the magnitude numpy gives (before: module outputs
    paired, "all inputs match")."""
    r = _locate(traces["rotary_kernel"])
    f = r.first_beyond_tolerance
    assert r.verdict == "diverged", r.coverage
    assert (f.layer["module"]["a"], f.layer["module"]["b"]) == ("Rotary/o", "o"), f.layer
    assert f.inputs_match is False and "[16,16]" in f.inputs_reason, f.inputs_reason
    flax_out, torch_out = runpy.run_path(os.path.join(FIXTURES, "port_rotary.py"))[
        "numpy_forward"]("kernel")
    truth = np.abs(flax_out - torch_out).max()     # the residual x is the same on both sides
    assert f.metrics.max_abs == pytest.approx(truth, rel=1e-4), (f.metrics.max_abs, truth)


def test_repeated_applies_shared_weights_layers_of_one_shape(traces):
    r = _locate(traces["shared"], rtol=0, atol=0)
    units = sorted(_units(r), key=lambda m: m["a"])
    one_apply = [("Net/shared", "shared", "linear"), ("Net", "", "tanh"),
                 ("Net/shared", "shared", "linear"), ("Net/a", "a", "linear"),
                 ("Net", "", "tanh"), ("Net/b", "b", "linear")]
    # three applies (twice on the same batch, once on another), each with its torch forward,
    # in order; the init-time forward on ones pairs with nothing
    assert [(m["a_module"], m["b_module"], m["family"]) for m in units] == one_apply * 3
    assert [m["b"] for m in units] == sorted(m["b"] for m in units)
    with tracediff.load(traces["shared"]) as t:
        dots = [e for e in range(len(t)) if t.string(t.events["op"][e]) == "dot_general"]
        assert np.all(_input(t, dots[0], 0) == 1)       # model.init(key, jnp.ones(...))
    assert len(dots) == 4 + 3 * 4 and units[0]["a"] > dots[3]   # after the 4 init-time dots
    f = r.first_difference
    if f is not None:
        assert f.inputs_match is True and f.layer["family"] in ("linear", "tanh")


# -- layouts: NHWC/HWIO vs NCHW/OIHW

@pytest.fixture(scope="module")
def conv_rounds_differently(traces):
    """Whether XLA's and oneDNN's conv1 outputs differ bitwise on this CPU (plain flax and
    torch, no tracediff): oneDNN's kernel, so its rounding, depends on the ISA."""
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") \
        or os.path.join(os.path.dirname(traces["conv"]), "xla-cache")
    p = subprocess.run([sys.executable, os.path.join(FIXTURES, "port_conv.py"), "--conv-bits"],
                       env=_env(cache), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stdout.strip().splitlines()[-1].endswith("False")


def test_conv_pairs_across_layouts(traces, conv_rounds_differently):
    r = _locate(traces["conv"], rtol=0, atol=0)
    got = {(m["a_module"], m["b_module"], m["family"]) for m in _units(r)}
    assert {("CNN/conv1", "conv1", "conv"), ("CNN/head", "head", "linear")} <= got
    values = [m for m in r.mapping if m["by"] == "value"]
    assert any("permuting axes" in m["how"] for m in values)     # the HWIO kernel = OIHW weight
    f = r.first_difference
    if conv_rounds_differently:
        assert f.layer["text"] == ("Conv CNN/conv1 (conv_general_dilated + add) <-> "
                                   "Conv2d conv1 (convolution)")
        assert f.inputs_match is True and f.inputs_reason.count("(axes permuted)") == 2
    elif f is not None:
        # the convolutions round alike here: compared in the right layout, conv1 matches
        # bitwise, and the first difference is a later layer (the mean), on equal inputs
        assert f.layer["family"] != "conv" and "conv1" not in f.layer["text"], f.layer["text"]
        assert f.inputs_match is True and "(axes permuted)" in f.inputs_reason
    if f is not None:
        # compared in the right layout: rounding, not the O(1) of mixed-up axes
        assert 0 < f.metrics["max_abs"] < 1e-4


# -- a transformer block, torch's addmm in TF32 precision

TRANSFORMER_LAYERS = {
    ("Model/embed", "embed", "gather"), ("Model/block/ln1", "block/ln1", "layer_norm"),
    ("Model/block/attn/query", "block/attn/query", "linear"),
    ("Model/block/attn/key", "block/attn/key", "linear"),
    ("Model/block/attn/value", "block/attn/value", "linear"),
    ("Model/block/attn", "block/attn", "softmax"),
    ("Model/block/attn/out", "block/attn/out", "linear"),
    ("Model/block", "block", "add"),
    ("Model/block/ln2", "block/ln2", "layer_norm"),
    ("Model/block/fc1", "block/fc1", "linear"), ("Model/block", "block", "gelu"),
    ("Model/block/fc2", "block/fc2", "linear"), ("Model/ln_f", "ln_f", "layer_norm"),
    ("Model/head", "head", "linear"),
}


def test_transformer_every_layer_paired_tf32_names_the_query_projection(traces):
    r = _locate(traces["tr32"])
    units = _units(r)
    got = {(m["a_module"], m["b_module"], m["family"]) for m in units}
    assert TRANSFORMER_LAYERS <= got, sorted(TRANSFORMER_LAYERS - got)
    assert sum(1 for m in units if (m["a_module"], m["family"]) == ("Model/block", "add")) == 2
    assert all(m["how"] for m in r.mapping)          # every pair says how it was made
    f = r.first_beyond_tolerance
    assert f.layer["text"] == ("Dense Model/block/attn/query (dot_general + add) <-> "
                               "Linear block/attn/query (addmm)")
    assert f.inputs_match is True and 1e-4 < f.metrics["max_rel"]
    assert f.b["source"] == fixture_line("port_transformer.py", "q, k, v = split(self.query(x))")
    # exact comparison: the first bitwise difference comes earlier, introduced there
    r0 = _locate(traces["tr32"], rtol=0, atol=0)
    f0 = r0.first_difference
    assert f0.inputs_match is True and f0.a["index"] <= f.a["index"]
    assert (f0.layer["a_module"], f0.layer["b_module"], f0.layer["family"]) in TRANSFORMER_LAYERS



def test_a_backward_never_compares_a_term_of_a_sum_with_the_whole_gradient(traces):
    """The pre-LN block's gradient, correct port: JAX sums each LayerNorm's input-gradient
    terms and the residual's gradient in one `add_any` chain, torch adds the residual's to
    `native_layer_norm_backward`'s whole. The `mul` before the last `add_any` (one term) was
    paired with torch's whole gradient: DIVERGED, max abs 0.15 at ln2's backward. In the
    block, the sums pair (Flax's terms and torch's LayerNorm gradient alone pair with
    nothing); the final LayerNorm, with no residual after it, pairs at its whole gradient."""
    r = _locate(traces["tr_grad"])
    assert r.verdict == "match" and r.first_beyond_tolerance is None, r.first_beyond_tolerance
    bwd = [m for m in _units(r) if m["phase"] == "backward"]
    assert len(bwd) > 20 and r.coverage.b.paired >= 0.9 * r.coverage.b.events
    for mod in ("Model/block/ln1", "Model/block/ln2", "Model/ln_f"):
        ends = [m["b_op"].rsplit(" + ", 1)[-1] for m in bwd if m["a_module"] == mod
                and m["a_op"].endswith("add_any")]
        assert ends == (["native_layer_norm_backward"] if mod == "Model/ln_f" else ["add"]), \
            (mod, bwd)


def test_a_composite_is_paired_by_the_unit_that_computes_its_result(traces):
    """Composites pair by their last units, the ones whose outputs are the composite's
    result: past the TF32 query projection, where the two sides' values no longer meet,
    a LayerNorm's equations against native_layer_norm (a softmax's, a gelu's); in the
    MLP's backward, relu's gradient (`gt` + `select_n` against threshold_backward, where
    the values meet: the backward looks for them before its composites). The paired
    outputs are one value (up to TF32's rounding); by their first units, `square` against
    the normalised output, or `gt`'s mask against the gradient, are not."""
    for key, pair in (("tr32", (traces["tr32"],)), ("mlp", (traces["mlp_flax"], traces["mlp_torch"]))):
        r = _locate(*pair)
        comps = [m for m in _units(r) if m["by"] == "dataflow (composite)" or
                 (m["by"] == "dataflow (values meet)" and m["phase"] == "backward")]
        got = {(m["a_module"], m["b_op"], m["phase"]) for m in comps}
        want = {"tr32": {("Model/block/ln2", "native_layer_norm", "forward"),
                         ("Model/ln_f", "native_layer_norm", "forward")},
                "mlp": {("MLP", "threshold_backward", "backward")}}[key]
        assert want <= got, (key, got)
        with tracediff.load(pair[0]) as ta, tracediff.load(pair[-1]) as tb:
            for m in comps:
                xa, xb = ta.outputs(m["a"])[0], tb.outputs(m["b"])[0]
                assert xa.shape == xb.shape and xa.dtype == xb.dtype, (key, m)
                scale = float(np.abs(xb).max())
                assert np.abs(xa.astype(np.float64) - xb).max() <= 1e-2 * scale, (key, m)


# -- Flax NNX: module paths from the NNX graph

def test_nnx_model_pairs_by_path(traces):
    with tracediff.load(traces["nnx"]) as t:
        stacks = {t.string(t.events["name_stack"][e]) for e in range(len(t))
                  if t.events["framework"][e] == schema.FW_JAX}
    assert {"linear1", "bn", "linear2"} <= stacks
    r = _locate(traces["nnx"])
    got = {(m["a_module"], m["b_module"], m["family"]) for m in _units(r)}
    assert {("linear1", "linear1", "linear"), ("bn", "bn", "batch_norm"),
            ("linear2", "linear2", "linear")} <= got
    # the recorded script printed what it prints unrecorded: paths are metadata
    flax_sum = [ln for ln in traces["stdout"].splitlines() if ln.startswith("flax output")]
    assert len(flax_sum) >= 1


def test_nnx_paths_leave_the_computation_unchanged():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tracediff.capture.jax.nnx_paths import NnxPaths

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.linear1 = nnx.Linear(3, 4, rngs=rngs)
            self.blocks = nnx.List([nnx.Linear(4, 4, rngs=rngs)])

        def __call__(self, x):
            return self.blocks[0](jax.nn.relu(self.linear1(x)))

    model = Model(nnx.Rngs(0))
    x = jnp.arange(6.0).reshape(2, 3)

    def stacks():
        jaxpr = jax.make_jaxpr(lambda v: model(v))(x)
        return {str(e.source_info.name_stack) for e in jaxpr.eqns}

    plain, before = np.asarray(model(x)), stacks()
    paths = NnxPaths()
    paths.install()
    try:
        assert {"linear1", "blocks/0"} <= stacks()
        assert np.asarray(model(x)).tobytes() == plain.tobytes()
    finally:
        paths.uninstall()
    assert stacks() == before and "linear1" not in before


def test_reordered_scale_pairs_where_values_meet(traces):
    """Flax scales the query before the score matmul, the port the scores after it (torch
    eager attention): the same value by other ops. A correct port: MATCH, and the scaled
    scores pair with torch's `div` (where the values meet), not with the unscaled `bmm`
    (the old pairing said "DIVERGED ... (sqrt + div + dot_general) <-> block/attn (bmm)")."""
    r = _locate(traces["tr_after"])
    assert r.verdict == "match" and r.first_beyond_tolerance is None, r.first_beyond_tolerance
    scores = [m for m in r.mapping if m["a_op"].endswith("dot_general") and "div" in m["a_op"]]
    assert len(scores) == 1, [(m["a_op"], m["b_op"]) for m in r.mapping]
    assert scores[0]["b_op"].endswith("div") and scores[0]["by"] == "dataflow (values meet)", scores


def test_an_empty_cache_is_seen_through(traces):
    """torch passes keys and values through an empty cache (`torch.cat([empty, k])`, as
    transformers' DynamicCache does on the first call); Flax has none. The `cat` only moves
    k's bytes: the attention pairs through it (it read a value only torch has: 6 of torch's
    20 units paired, INCONCLUSIVE; HF GPT-2 stalled there the same way)."""
    r = _locate(traces["tr_cache"])
    c = r.coverage
    assert r.verdict == "match" and c.sufficient, (r.first_beyond_tolerance, c.reasons)
    assert c.a.compared == c.a.events and c.b.compared == c.b.events, c
    assert "cat" not in {m["b_op"].rsplit(" + ", 1)[-1] for m in r.mapping}


def test_boolean_masks_pair_only_by_dataflow(traces):
    """The same padding mask by other boolean ops (Flax `tokens == 0`, torch `tokens.ne(0)`)
    beside Flax's `lt` bounds check of the embedding lookup: all three read the tokens. A
    boolean result pairs only with one computed by the same op from paired inputs, never
    because it ends a region or its bits agree; it was "DIVERGED Model/embed (lt) <->
    (top level) (ne)" on a correct port."""
    r = _locate(traces["tr_pad"])
    assert r.verdict == "match" and r.coverage.sufficient, r.first_beyond_tolerance
    ints = [(m["a_op"], m["b_op"]) for m in r.mapping
            if {"lt", "eq", "ne"} & {m["a_op"].rsplit(" + ", 1)[-1], m["b_op"].rsplit(" + ", 1)[-1]}]
    assert ints == [], ints


def test_two_formulas_that_do_not_meet_are_compared_at_the_module_output(traces):
    """Flax's RMSNorm divides by `sqrt(var + eps)`, the port multiplies by `rsqrt(var + eps)`;
    with the port's epsilon wrong (1e-2 against 1e-6) no value inside the norm meets. The
    headline was Flax's `sqrt` against torch's `rsqrt` (reciprocals), max abs 0.747; it is
    the norm's output, with the magnitude numpy computes there (the gain w lies in [1, 1.2])."""
    r = _locate(traces["rms_eps"])
    f = r.first_beyond_tolerance
    assert r.verdict == "diverged" and f.layer["module"]["a"] == "Block/norm", f.layer
    assert f.a["op"] == "mul" and f.b["op"] == "aten::mul.Tensor" and f.inputs_match is True
    assert "by different formulas" in f.note and f.metrics.max_abs == f.layer["module"]["max_abs"]
    x = np.random.default_rng(0).normal(size=(2, 4, 16))
    var = (x ** 2).mean(-1, keepdims=True)
    d = np.abs(x / np.sqrt(var + 1e-2) - x / np.sqrt(var + 1e-6)).max()
    assert d * (1 - 1e-4) <= f.metrics.max_abs <= 1.2 * d * (1 + 1e-4), (f.metrics.max_abs, d)


def test_a_trained_rmsnorm_and_tanh_gelu_port_matches(traces):
    """RMSNorm -> Dense -> tanh GELU written out -> Dense, 2 AdamW steps under a jitted
    `value_and_grad`, a correct port. Under `jvp` JAX computes the GELU's `x ** 2` (its
    derivative) beside its `x ** 3` from the same x, and `sqrt(v) ** 2` for the norm's;
    torch's forward has only the cube and its RsqrtBackward0 `rsqrt(v) ** 3`. The cube was
    paired with the square (DIVERGED, fails on 2d0e974) and, in HF's T5, the square root's
    square with the reciprocal's cube (0.349): equal inputs pair the values that agree first,
    a backward pair with values apart needs an input in common that is no composite's, and a
    backward difference inside a module whose gradient agrees later is none."""
    r = _locate(traces["rms_train"])
    assert r.first_beyond_tolerance is None, r.first_beyond_tolerance
    assert r.first_parameter is None and r.verdict == "match" and r.exit_code == 0
    assert [s.step for s in r.optimizer_steps] == [0, 1]
    pows = [m for m in r.mapping if m["phase"] == "forward" and m["b_op"] == "pow"]
    assert pows
    with tracediff.load(traces["rms_train"]) as t:
        for m in pows:          # the cube against the cube: the same values
            xa, xb = t.outputs(m["a"])[0], t.outputs(m["b"])[0]
            assert np.allclose(xa, xb.reshape(xa.shape), rtol=1e-5, atol=1e-6), m


def test_a_float_mask_converted_from_integers_is_not_an_input_of_its_own(traces):
    """Torch's attention mask made float [2, 1, 6] has the bytes of the Flax loss's mask made
    float [2, 6, 1] (HF BERT eager's way): as an input of its own it kept torch's masked
    softmax apart from Flax's, built from the integer mask by `select`, and nothing after
    the projection paired (INCONCLUSIVE, 7 of 17 JAX units paired, on 2d0e974). A float
    converted from integers reads the integer input."""
    r = _locate(traces["mask_cast"])
    assert r.verdict == "match" and r.exit_code == 0, r.first_beyond_tolerance
    c = r.coverage
    assert c.a.paired == c.a.events and c.b.paired >= 0.9 * c.b.events
    assert any(m["b_op"].endswith("_softmax") for m in _units(r)), [m["b_op"] for m in _units(r)]


def test_a_mask_converted_to_float_and_the_scores_scaled_after_pair_in_the_backward(traces):
    """HF BERT's eager attention, as a port: the int padding mask given to both sides,
    torch's additive mask made from it converted to float32 (`_to_copy`), Flax masking
    with `mask > 0`; the loss over the tokens that are not padding (Flax multiplies by the
    mask as float32, the same bytes as torch's converted mask: one atom). Torch's attention
    depended on the float mask, Flax's on the int one: nothing after q, k and v paired
    (coverage 34 % of a, 51 % of b). And torch's scores' gradient is scaled after
    `_softmax_backward_data` (which meets the end of Flax's softmax transpose): the `div`
    of that transpose was paired with torch's `div` after it, DIVERGED on a correct port."""
    r = _locate(traces["tr_pad_attn"])
    c = r.coverage
    assert r.verdict == "match" and r.first_beyond_tolerance is None, r.first_beyond_tolerance
    assert c.sufficient and c.b.compared >= 0.9 * c.b.events, c
    fwd = {m["b_op"].rsplit(" + ", 1)[-1] for m in _units(r)
           if m["phase"] == "forward" and m["b_module"] == "block/attn"}
    assert {"_softmax", "bmm", "add"} <= fwd, fwd
    bwd = [(m["a_op"], m["b_op"]) for m in _units(r) if m["phase"] == "backward"]
    assert len(bwd) > 20 and ("div" not in {b for _, b in bwd}), bwd


def test_masked_scores_do_not_meet_as_a_whole_by_their_mask(traces):
    """q and k swapped behind a padded attention (HF BERT's `--bug qk` as a port): Flax's
    softmax `x - max` and torch's `scores + (1 - mask) * finfo.min` hold -3.4e38 alike where
    masked, and those elements made the whole norm: compared as a whole the two "met" (HF
    BERT's: relative L2 3e-40) and were paired by values meeting, while every unmasked
    score differed (the finding was that `sub` against torch's `add`, max abs 4.17; HF
    BERT's qk and scale port bugs lost their inputs' match). Elements both sides mask are
    left out of a norm-wise comparison: the finding is in the attention, at its matmul."""
    r = _locate(traces["tr_pad_qk"])
    f = r.first_beyond_tolerance
    assert r.verdict == "diverged" and f is not None
    assert (f.layer["module"]["a"], f.layer["module"]["b"]) == ("Model/block/attn", "block/attn")
    assert (f.a.op, f.b.op) == ("dot_general", "aten::bmm"), (f.a.op, f.b.op)
    big = np.finfo(np.float32).max / 2
    with tracediff.load(traces["tr_pad_qk"]) as t:
        for m in _units(r):
            if m["by"] != "dataflow (values meet)":
                continue
            xa, xb = t.outputs(m["a"])[0], t.outputs(m["b"])[0]
            if xa.size != xb.size:
                continue
            masked = (np.abs(xa) >= big) & (np.abs(xb.reshape(xa.shape)) >= big)
            if masked.any():      # met where not masked too
                assert np.allclose(xa[~masked], xb.reshape(xa.shape)[~masked],
                                   rtol=1e-5, atol=1e-6), m


# -- BatchNorm in training mode, trained 2 Adam steps


def _bn_truth(*args):
    """`port_batchnorm.py --truth`: the first module beyond tolerance in the first forward
    (Flax `capture_intermediates` against torch forward hooks) and its max abs, or None."""
    p = subprocess.run([sys.executable, os.path.join(FIXTURES, "port_batchnorm.py"), "--truth",
                        *args], env=_env(os.environ.get("JAX_COMPILATION_CACHE_DIR", "")),
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    words = p.stdout.strip().splitlines()[-1].split()[1:]
    return None if words == ["none"] else (words[0], float(words[1]))


def test_training_mode_batch_norm_pairs_and_matches(traces):
    """Each side normalises by the batch's statistics; torch's native_batch_norm also reads
    its running statistics, only to update them in place. Read as inputs, they made every
    BatchNorm a unit of torch's alone after one step (HF ResNet trained so: 10 of 990 JAX
    units paired). Flax's derivative of `max(0, var)` selects fills of ones and zeros with
    the bytes of the BatchNorm's scale and bias at init: read as those parameters, step 1's
    backward paired a term with native_batch_norm_backward (DIVERGED). The shortcut's 1x1
    kernel read through `rev` equals torch's weight in the reversed axis order too: a
    layout (HWIO <- OIHW), not "converted wrongly"."""
    assert _bn_truth() is None                       # the port is right (truth)
    r = _locate(traces["bn_train"])
    assert (r.verdict, r.exit_code) == ("match", 0), (r.first_beyond_tolerance,
                                                      r.first_parameter, r.coverage)
    c = r.coverage
    assert c.a.paired >= 0.9 * c.a.events and c.b.paired >= 0.9 * c.b.events, c
    # every backward unit counted: Flax's BatchNorm transpose sums its scale's and bias's
    # gradients in reduce_sums torch's native_batch_norm_backward returns whole; they are
    # the gradients the optimizer snapshots hold, compared by role
    for side in (c.a, c.b):
        bwd = side.by_phase["backward"]
        assert bwd["paired"] == bwd["events"], side.by_phase
    bn = [m for m in _units(r) if m["b_op"] == "native_batch_norm"]
    assert {(m["a_module"], m["b_module"]) for m in bn} == {("CNN/bn1", "bn1"), ("CNN/bn2", "bn2")}
    assert len(bn) == 4                                # both BatchNorms in both steps
    assert any(m["b_op"] == "native_batch_norm_backward" and m["a_module"] == "CNN/bn2"
               for m in _units(r))
    assert [s.step for s in r.optimizer_steps] == [0, 1]


def test_training_mode_batch_norm_epsilon_is_found_at_the_first_batch_norm(traces):
    module, magnitude = _bn_truth("--bug", "eps")
    assert module == "bn1"
    r = _locate(traces["bn_train_eps"])
    assert r.verdict == "diverged"
    f = r.first_beyond_tolerance
    assert (f.layer["module"]["a"], f.layer["module"]["b"]) == ("CNN/bn1", "bn1"), f.layer
    assert f.a.step == 0 and f.inputs_match is True
    assert magnitude / 2 <= f.metrics["max_abs"] <= 2 * magnitude, (f.metrics, magnitude)


def test_a_size_one_kernel_is_read_in_a_frameworks_layout():
    """[1, 1, 12, 4] (HWIO) against [4, 12, 1, 1] (OIHW): the reversal and the kernel layout
    give the same bytes; the layout is the one found, so it is no "converted wrongly"."""
    from tracediff.diff.pairing.graph import conventional, find_layout
    w = np.random.default_rng(0).standard_normal((4, 12, 1, 1)).astype(np.float32)
    p = find_layout(w.transpose(2, 3, 1, 0), w)
    assert p is not None and conventional(p), p
