"""HF transformers' BertModel against its FlaxBertModel port (tests/field/programs/hf_bert.py:
random weights converted by transformers' own converter, a padded batch), recorded as a user
records it, in one process and in two scripts, in torch's eager and SDPA attention, correct
and with one port bug each (LayerNorm epsilon, GELU approximation, q/k swapped in layer 1,
no attention scale in layer 1).

The truth is computed here, independently of tracediff: torch `register_forward_hook` on every
module and Flax `capture_intermediates`, paired by module path; the first module (in the order
torch's modules finish, children before parents) whose output differs beyond float32
tolerance. Every module finished before it agrees, so its inputs agree. tracediff's module,
op and magnitude are asserted against it; a correct port exits 0 (MATCH) in both modes.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import tracediff

from ..helpers import ROOT, script_env

PROGRAM = os.path.join(ROOT, "tests", "field", "programs", "hf_bert.py")
GPT2 = os.path.join(ROOT, "tests", "field", "programs", "hf_gpt2.py")
RTOL, ATOL = 1e-5, 1e-6     # float32 (compare.DEFAULT_TOLERANCES)

# name: (attention, bug, one trace or two)
CASES = {
    "eager": ("eager", "none", 1), "sdpa": ("sdpa", "none", 1), "eager_2": ("eager", "none", 2),
    "eps": ("eager", "eps", 1), "gelu": ("eager", "gelu", 1), "qk": ("eager", "qk", 1),
    "scale": ("eager", "scale", 1), "scale_sdpa": ("sdpa", "scale", 1),
    "gelu_2": ("eager", "gelu", 2),
}


def _program(path=PROGRAM):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3] + "_program", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _record(out, *args, cwd, program=PROGRAM):
    env = script_env()
    env.pop("XLA_FLAGS", None)
    r = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", out, program, *args],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_bert")
    out = {}
    for name, (attn, bug, n) in CASES.items():
        args = ["--attn", attn, "--bug", bug]
        if n == 1:
            out[name] = (_record(str(d / f"{name}.h5"), *args, cwd=d),)
        else:
            w = str(d / f"{name}.npz")
            tb = _record(str(d / f"{name}_torch.h5"), *args, "--side", "torch", "--weights", w, cwd=d)
            ta = _record(str(d / f"{name}_flax.h5"), *args, "--side", "flax", "--weights", w, cwd=d)
            out[name] = (ta, tb)
    for name, args in (("eager", ()), ("sdpa", ("--attn", "sdpa")), ("gelu", ("--bug", "gelu"))):
        out[f"gpt2_{name}"] = (_record(str(d / f"gpt2_{name}.h5"), *args, cwd=d, program=GPT2),)
    return out


def _first(x):
    """The first array of a module's output (a tuple, a transformers ModelOutput)."""
    while isinstance(x, (tuple, list)) or hasattr(x, "to_tuple"):
        x = x.to_tuple()[0] if hasattr(x, "to_tuple") else x[0]
    return np.asarray(x.detach().numpy() if hasattr(x, "detach") else x, np.float64)


def truth(attn, bug, program=PROGRAM):
    """[(module path, max abs, differs)] in the order torch's modules finish, and the first
    that differs beyond tolerance: {'module', 'max_abs'}."""
    import jax
    import torch
    prog = _program(program)
    ids, mask = prog.batch()
    tmodel, state = prog.torch_model(attn, bug)
    outs = {}
    order = []

    def hook(name):
        def fn(_module, _inputs, output):
            outs[name] = _first(output)
            order.append(name)
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in tmodel.named_modules() if n]
    with torch.no_grad():
        tmodel(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    for h in handles:
        h.remove()
    fmodel, params = prog.flax_model(state, bug)
    _, inter = fmodel.module.apply({"params": params}, *prog.flax_args(ids, mask),
                                   capture_intermediates=True, mutable=["intermediates"])
    flat = {}
    for path, v in jax.tree_util.tree_flatten_with_path(inter["intermediates"],
                                                       is_leaf=lambda x: isinstance(x, tuple))[0]:
        keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        if keys and keys[-1] == "__call__":
            flat[".".join(str(k) for k in keys[:-1])] = _first(v)
    rows = []
    for name in order:
        if name not in flat:
            continue
        a, b = flat[name], outs[name]
        if a.size != b.size:
            continue
        a, b = a.reshape(b.shape), b
        diff = np.abs(a - b)
        rows.append((name, float(diff.max()), bool((diff > ATOL + RTOL * np.abs(b)).any())))
    first = next((r for r in rows if r[2]), None)
    return rows, (None if first is None else {"module": first[0], "max_abs": first[1]})


def _locate(paths):
    return tracediff.locate(*paths) if len(paths) == 2 else tracediff.locate(paths[0])


@pytest.mark.parametrize("case", ["eager", "sdpa", "eager_2"])
def test_correct_port_matches(traces, case):
    attn, bug, _ = CASES[case]
    rows, first = truth(attn, bug)
    assert first is None and len(rows) > 20, rows   # every paired module agrees
    r = _locate(traces[case])
    assert r.verdict == "match" and r.exit_code == 0, r.first_beyond_tolerance
    from tracediff.cli import main as cli
    from click.testing import CliRunner
    res = CliRunner().invoke(cli, ["locate", *traces[case]])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_gpt2_correct_port_matches_with_its_attention_compared(traces, attn):
    """A second family: HF GPT2Model (Conv1D layers: `addmm` on (in, out) weights) against
    FlaxGPT2Model, the causal mask and the padding mask combined differently on each side,
    and torch's keys and values passed through its DynamicCache (`cat` with an empty
    cache). The pairing used to stop in layer 0's attention (4 of torch's 55 computing
    units paired: INCONCLUSIVE); every layer now pairs and compares (the truth: every module
    agrees)."""
    rows, first = truth(attn, "none", GPT2)
    assert first is None and len(rows) > 10, rows
    r = _locate(traces[f"gpt2_{attn}"])
    c = r.coverage
    assert r.verdict == "match" and r.exit_code == 0, (r.first_beyond_tolerance, c.reasons)
    assert c.sufficient, c.reasons
    for side in (c.a, c.b):
        assert side.events > 40 and side.compared >= 0.9 * side.events, side
    # the attention is compared inside, where the values meet (the scores, the softmax, the
    # weighted values read by c_proj), not only at the module's end
    paired_b = {m["b_module"] for m in r.mapping if m["b_module"]}
    assert {"h/0/attn", "h/1/attn", "h/0/attn/c_proj", "h/1/mlp/c_proj"} <= paired_b, paired_b


def _gpt2_activation_truth(bug):
    """Max abs of layer 0's MLP activation, torch's `h.0.mlp.act` module (a forward hook)
    against the Flax port's: its config's activation applied to its captured `c_fc` output,
    as FlaxGPT2MLP applies it (Flax has no module for it)."""
    import torch
    from transformers.modeling_flax_utils import ACT2FN
    prog = _program(GPT2)
    ids, mask = prog.batch()
    tmodel, state = prog.torch_model("eager", bug)
    seen = {}

    def keep(_module, _inputs, output):
        seen["act"] = output.detach().numpy()

    hook = tmodel.h[0].mlp.act.register_forward_hook(keep)
    with torch.no_grad():
        tmodel(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    hook.remove()
    fmodel, params = prog.flax_model(state, bug)
    _, inter = fmodel.module.apply({"params": params}, *prog.flax_args(ids, mask),
                                   capture_intermediates=True, mutable=["intermediates"])
    c_fc = inter["intermediates"]["h"]["0"]["mlp"]["c_fc"]["__call__"][0]
    act = np.asarray(ACT2FN[fmodel.config.activation_function](c_fc))
    return float(np.abs(act.astype(np.float64) - seen["act"]).max())


def test_gpt2_activation_bug_named_in_layer_0_mlp(traces):
    """`gelu` where GPT-2 uses `gelu_new`: the truth's first differing module is layer 0's
    MLP (hooks: `h.0.mlp.c_proj`, the first both sides have; torch's `act` module before it
    differs by the activation's magnitude). tracediff names torch's activation module against
    the Flax MLP's ops, with the activation's magnitude, its inputs matching."""
    rows, first = truth("eager", "gelu", GPT2)
    assert first is not None and first["module"].startswith("h.0.mlp."), first
    act = _gpt2_activation_truth("gelu")
    assert act > 10 * ATOL
    r = _locate(traces["gpt2_gelu"])
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    mod = f.layer["module"]
    assert mod["b"] == "h/0/mlp/act" and mod["a"].endswith("h/0/mlp"), f.layer
    assert act / 2 <= mod["max_abs"] <= 2 * act, (mod, act)
    assert f.inputs_match is True, f.inputs_reason


# case: (the module tracediff names, as a torch path; the op on torch's side or inside)
EXPECT = {
    "eps": ("embeddings.LayerNorm", "native_layer_norm"),
    "gelu": ("encoder.layer.0.intermediate", "gelu"),
    "gelu_2": ("encoder.layer.0.intermediate", "gelu"),
    "scale": ("encoder.layer.1.attention.self", "inside"),
    "scale_sdpa": ("encoder.layer.1.attention.self", "scaled_dot_product"),
    # by path the truth is the query projection (Flax's holds the key's parameters); values
    # pair Flax's query with torch's key, so the first computation that differs is the
    # attention they feed
    "qk": ("encoder.layer.1.attention.self", "inside"),
}


@pytest.mark.parametrize("case", sorted(EXPECT))
def test_port_bug_named_at_its_module(traces, case):
    attn, bug, _ = CASES[case]
    rows, first = truth(attn, bug)
    assert first is not None
    module, op = EXPECT[case]
    r = _locate(traces[case])
    assert r.verdict == "diverged" and r.exit_code == 1
    f = r.first_beyond_tolerance
    mod = f.layer["module"]           # the module whose output differs, then the op inside
    assert mod["b"].replace("/", ".").startswith(module), (f.layer, first)
    assert mod["a"].replace("/", ".").endswith(module), f.layer
    assert f.inputs_match is True, f.inputs_reason
    if op == "inside":     # the score matmul inside the attention, where both have matmuls
        assert f.layer["inside"]["a_op"] == "dot_general", f.layer
    else:
        assert op in f.b.op, (f.b.op, f.layer)
    truth_abs = dict((n, m) for n, m, _ in rows)[module]
    if case == "qk":
        assert first["module"] == "encoder.layer.1.attention.self.query", first
        # Flax's query projection is paired with torch's key projection: equal values
        pairs = [(m["a_module"], m["b_module"]) for m in r.mapping if m["b_module"]]
        assert ("FlaxBertModule/encoder/layer/1/attention/self/query",
                "encoder/layer/1/attention/self/key") in pairs
    else:
        assert first["module"] == module, (first, rows)
    assert mod["max_abs"] == pytest.approx(truth_abs, rel=1e-3), (mod, truth_abs)


# -- positions after a padding index, which the port forgot (issue 52)

@pytest.fixture(scope="module")
def padpos_trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_bert_padpos")
    return _record(str(d / "padpos.h5"), "--bug", "padpos", cwd=d)


def test_positions_after_the_padding_index_are_found_at_the_position_lookup(padpos_trace):
    """Torch is given positions as RoBERTa computes them from the ids (after the padding
    index, torch ops); the Flax port forgot the offset (0, 1, 2, ...). The two lookups read
    one table at indices that pair with nothing (before: found at layer 0's attention, the
    lookups in two classes). Now they pair by role: DIVERGED at `position_embeddings` with
    the truth's magnitude (numpy: the table's rows at both sides' positions) and the
    indices named."""
    import torch
    prog = _program()
    ids, _ = prog.batch()
    _, state = prog.torch_model("eager", "none")
    table = state["embeddings.position_embeddings.weight"]
    pos_b = prog.torch_positions(torch.from_numpy(ids)).numpy()
    truth = float(np.abs(table[prog.positions(ids)] - table[pos_b]).max())
    r = tracediff.locate(padpos_trace, explain=False)
    assert r.verdict == "diverged" and r.exit_code == 1, r.coverage.reasons
    f = r.first_beyond_tolerance
    assert f.layer["module"]["b"].replace("/", ".") == "embeddings.position_embeddings", f.layer
    assert truth / 3 <= f.metrics.max_abs <= 3 * truth, (f.metrics.max_abs, truth)
    assert f.inputs_match is False and "its indices differ" in f.inputs_reason, f.inputs_reason
