"""Mixed precision on a program nobody here wrote (issue #27, item 3): a transformers GPT-2
(2 layers, n_embd 64, random init, AdamW) trained one step in float32, and the same script
under `torch.autocast("cpu", dtype=torch.bfloat16)` (tests/field/programs/gpt2_autocast.py).

Truth, independent of tracediff: forward hooks on every module of the same model, run both
ways; the first module (in the order the hooks fire) whose output differs is the attention's
`c_attn` of the first block (its `addmm` computes in bfloat16). tracediff must name that op
and say bfloat16 and autocast, not a residual add further on.
"""

import os

import pytest

from ..helpers import locate_json, run_cli

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
