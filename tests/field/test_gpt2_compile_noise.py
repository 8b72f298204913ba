"""Eager against torch.compile (inductor), HF transformers GPT-2 trained with AdamW: the
headline is the LayerNorm where inductor first computes differently, not AdamW's
`addcdiv_` on a gradient that is mathematically zero (the attention's key bias: softmax
does not see it; its gradient is ~1e-11 of rounding noise, AdamW divides it by ~1e-8 and
the runs land ~1e-6 apart, "relative error" ~2).

Truth, independent of tracediff: torch forward hooks on every module of the same model
run one forward eagerly and compiled; the first module (in execution order) whose output
is not bitwise equal. The script is written as a user writes it and recorded twice
with `tracediff record` (eager, then `--compile`).
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT, run_cli

import torch  # noqa: E402  (the field suite has torch and transformers: never a skip)
import transformers  # noqa: E402,F401

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="inductor needs a C++ compiler on CPU")

SCRIPT = textwrap.dedent('''
    import sys

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 16))
    compiled = "--compile" in sys.argv
    f = torch.compile(model) if compiled else model
    if "--hooks" in sys.argv:   # the truth: every module's output of one forward
        seen = {}

        def keep(name):
            def hook(module, inputs, output):
                out = output[0] if isinstance(output, tuple) else output
                if isinstance(out, torch.Tensor) and name not in seen:
                    seen[name] = out.detach().clone()
            return hook

        for name, mod in model.named_modules():
            if name:
                mod.register_forward_hook(keep(name))
        with torch.no_grad():
            f(input_ids=ids)
        torch.save(list(seen.items()), sys.argv[-1])
        raise SystemExit(0)
    for step in range(3):
        opt.zero_grad()
        loss = f(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        print(step, loss.item())
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2_compile")
    script = folder / "train_gpt2.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"),
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        run_cli("record", "-o", folder / f"{name}.h5", script, *extra, env=env, check=True)
        out = folder / f"{name}.pt"
        proc = subprocess.run([sys.executable, str(script), "--hooks", *extra, str(out)],
                              env=env, cwd=str(folder), capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def _truth(folder):
    """The first module whose output differs between the eager and the compiled forward."""
    eager = torch.load(folder / "eager.pt")
    compiled = dict(torch.load(folder / "compiled.pt"))
    for name, out in eager:   # in the order the hooks fired
        other = compiled.get(name)
        if other is not None and not torch.equal(out, other):
            return name
    return None


def test_the_headline_is_the_layer_norm_not_adamw_noise(runs):
    truth = _truth(runs)
    assert truth == "transformer.h.0.ln_1"
    r = __import__("tracediff").locate(str(runs / "eager.h5"), str(runs / "compiled.h5"))
    head = r.first_beyond_tolerance or r.first_difference
    assert head.a.op == "aten::native_layer_norm" and head.a.name_stack == truth
    assert head.inputs_match is True and head.a.step == 0
    # AdamW's addcdiv_ on the key bias's zero gradient: shown as noise, not the headline
    nz = r.near_zero
    assert nz is not None and nz.a.op == "aten::addcdiv_"
    assert "c_attn.bias" in nz.optimizer and "rounding noise around zero" in nz.note
    proc = run_cli("locate", runs / "eager.h5", runs / "compiled.h5")
    lines = proc.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("first "))
    assert "aten::native_layer_norm" in lines[first]
    assert any(line.startswith("rounding noise around zero") and "aten::addcdiv_" in line
               for line in lines)
