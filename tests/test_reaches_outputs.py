"""The first difference that matters (issue 64, item 3): a difference that never reaches
another op is never the headline.

Two runs of a torch MLP + Adam load the same saved initial parameters over freshly drawn
ones; b runs under `ATEN_CPU_CAPABILITY=default`, which draws other numbers. The drawn
values differ first, but the load's `copy_` overwrites them before anything reads them.
Truth, without tracediff: forward hooks on every module of the same script run both ways;
the first module whose output differs is the LayerNorm (its kernel is ATen's), so the first
difference that reaches the outputs is `native_layer_norm` in step 0's forward.
"""

import json
import subprocess
import sys

import pytest

from .helpers import locate_json, run_cli, script_env

MLP = """
import os, sys
import numpy as np
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                            torch.nn.Linear(64, 4))
# the truth run keeps the drawn values (a read of its own); the recorded run does not
drawn = [p.detach().clone() for p in model.parameters()] if len(sys.argv) > 1 else []
saved = os.path.join(os.path.dirname(os.path.abspath(__file__)), "init.pt")
if not os.path.exists(saved):
    torch.save(model.state_dict(), saved)
model.load_state_dict(torch.load(saved))          # the drawn values are overwritten
rng = np.random.default_rng(1)
x = torch.from_numpy(rng.standard_normal((16, 32)).astype(np.float32))
y = torch.from_numpy(rng.standard_normal((16, 4)).astype(np.float32))
seen = []
if len(sys.argv) > 1:   # the truth: every module's output, in the order the hooks fire
    for name, m in model.named_modules():
        if name:
            m.register_forward_hook(lambda m, i, o, name=name: seen.append(
                (name, o.detach().numpy().copy())))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for _ in range(2):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
print(loss.item())
if len(sys.argv) > 1:
    np.savez(sys.argv[1], names=np.array([n for n, _ in seen]),
             drawn=np.concatenate([d.flatten().numpy() for d in drawn]),
             **{f"out{i}": o for i, (_, o) in enumerate(seen)})
"""


def _truth(tmp_path, script):
    outs = []
    for name, env in (("a", {}), ("b", {"ATEN_CPU_CAPABILITY": "default"})):
        path = tmp_path / f"{name}_truth.npz"
        subprocess.run([sys.executable, str(script), str(path)], env=script_env(env),
                       check=True, capture_output=True)
        import numpy as np

        outs.append(dict(np.load(path)))
    a, b = outs
    first = next((str(n) for i, n in enumerate(a["names"])
                  if a[f"out{i}"].tobytes() != b[f"out{i}"].tobytes()), None)
    return first, a["drawn"].tobytes() != b["drawn"].tobytes()


def test_a_drawn_value_overwritten_by_a_load_is_never_the_first_difference(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "mlp.py"
    script.write_text(MLP)
    first_module, drawn_differ = _truth(tmp_path, script)
    if not drawn_differ or first_module != "1":
        pytest.skip(f"ATEN_CPU_CAPABILITY=default does not draw other numbers, or the "
                    f"LayerNorm is not the first module it changes, on this CPU "
                    f"(drawn differ: {drawn_differ}, first module: {first_module})")
    paths = []
    for name, env in (("a", {}), ("b", {"ATEN_CPU_CAPABILITY": "default"})):
        run_cli("record", "-o", tmp_path / f"{name}.h5", script, env=env, check=True)
        paths.append(tmp_path / f"{name}.h5")
    doc = locate_json(*paths, "--no-sources")
    first = doc["first_difference"]
    assert first["a"]["op"] == "aten::native_layer_norm", first["a"]
    assert first["a"]["step"] == 0 and first["a"]["phase"] == "forward"
    absorbed = doc["absorbed"]
    assert absorbed["a"]["op"] == "aten::uniform_" and "aten::copy_" in absorbed["note"]
    assert "overwritten before anything read it" in absorbed["note"]
    text = run_cli("locate", *paths, "--no-sources").stdout
    assert "a difference that never reached the outputs" in text and "aten::uniform_" in text
