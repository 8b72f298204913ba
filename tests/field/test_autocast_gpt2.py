"""Mixed precision on a program nobody here wrote (issue #27, item 3): a transformers GPT-2
(2 layers, n_embd 64, random init, AdamW) trained one step in float32, and the same script
under `torch.autocast("cpu", dtype=torch.bfloat16)` (tests/field/programs/gpt2_autocast.py).

Truth, independent of tracediff: forward hooks on every module of the same model, run both
ways; the first module (in the order the hooks fire) whose output differs is the attention's
`c_attn` of the first block (its `addmm` computes in bfloat16). tracediff must name that op
and say bfloat16 and autocast, not a residual add further on.

Its sources (issue 51): the float32 program run twice plainly ends with bitwise equal
parameters, so autocast is the only thing the two runs differ in: the counterfactual run
(b without autocast) removes the whole difference. Every source must be the change of dtype,
on b, with autocast as its cause; never a kernel "computing differently" (a transpose of a
bfloat16 weight, a dropout's division in bfloat16).
"""

import os

import pytest

from ..helpers import locate_json, run_cli, run_plain

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs", "gpt2_autocast.py")


def _first_module_that_differs():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32,
                        attn_implementation="eager")
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    names = {m: n for n, m in model.named_modules()}

    def run(autocast):
        seen = []

        def hook(module, args, out):
            out = out[0] if isinstance(out, tuple) else out
            if isinstance(out, torch.Tensor):
                seen.append((names[module], out.detach().clone()))

        handles = [m.register_forward_hook(hook) for m in model.modules()]
        torch.manual_seed(2)   # the same dropout masks both ways (the model trains)
        try:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                model(ids)
        finally:
            for h in handles:
                h.remove()
        return seen

    plain, mixed = run(False), run(True)
    for (name, x), (name_b, y) in zip(plain, mixed):
        assert name == name_b
        if x.dtype != y.dtype or not torch.equal(x, y):
            return name, str(x.dtype).replace("torch.", ""), str(y.dtype).replace("torch.", "")
    raise AssertionError("no module output differs")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2_autocast")
    for name, args in (("fp32", ()), ("bf16", ("--autocast",))):
        run_cli("record", "-o", d / f"{name}.h5", PROGRAM, *args, check=True)
    return d / "fp32.h5", d / "bf16.h5"


def test_autocast_gpt2_names_the_first_bfloat16_op(runs):
    module, dtype_a, dtype_b = _first_module_that_differs()
    assert (module, dtype_a, dtype_b) == ("transformer.h.0.attn.c_attn", "float32", "bfloat16")
    r = locate_json(*runs)
    f = r["first_beyond_tolerance"]
    assert r["verdict"] == "diverged"
    assert f["a"]["name_stack"] == module and f["a"]["op"] == "aten::addmm"
    assert (f["a"]["dtypes"], f["b"]["dtypes"]) == ([dtype_a], [dtype_b])
    assert f["dtype_note"] == "float32 vs bfloat16: autocast on b (cpu bfloat16)"
    assert f["inputs_match"] is True
    assert r["first_difference"]["a"]["index"] == f["a"]["index"]
    assert "autocast" in r["explain"]["mechanism"]
    assert any(e["key"] == "frameworks.torch.autocast.used" and e["b"] == "cpu bfloat16"
               for e in r["env_diff"])


def _final_params(path):
    import torch

    return {k: v.numpy() for k, v in torch.load(path).items()}


def test_autocast_gpt2_every_source_is_the_change_of_dtype(runs, tmp_path):
    # the truth: without autocast the program is bitwise reproducible; with it, it differs
    finals = [tmp_path / f"{n}.pt" for n in ("fp32", "fp32_again", "bf16")]
    for path, args in zip(finals, ((), (), ("--autocast",))):
        run_plain(PROGRAM, *args, "--save-final", path)
    fp32, again, bf16 = map(_final_params, finals)
    assert all((fp32[k] == again[k]).all() for k in fp32)
    assert any((fp32[k] != bf16[k]).any() for k in fp32)
    sources = locate_json(*runs)["sources"]["sources"]
    ranked = [(s["mechanism"], s["side"], s["how"], round(s["share"], 3)) for s in sources]
    assert sources, ranked
    assert all(s["mechanism"] == "dtype" and s["side"] == "b" for s in sources), ranked
    assert "float32 vs bfloat16" in sources[0]["mechanism_text"]
    assert all("autocast" in s["fix"] and "frameworks.torch.autocast.used" in s["causes"]
               for s in sources), [(s["fix"], s["causes"]) for s in sources]
    # the first op computed in bfloat16 (the hooks' c_attn) is one of them
    assert any(op == "aten::addmm" for s in sources for op, _ in s["ops"]), ranked
