"""`tracediff confirm` (issue 64): each source checked by runs tracediff makes itself.

Truth, independent of tracediff: the same program run plainly (no recording) under each
environment, its final parameters compared with numpy (the part of the difference a
setting removes, and what it makes alone); and each op kind run alone on fixed inputs in
a process per setting (does the setting change its bits here?).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from .helpers import run_cli, script_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CNN = """
import sys
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
if len(sys.argv) > 2:   # the truth's runs: save the initial parameters, or load them
    how, path = sys.argv[2].split(":", 1)
    if how == "save":
        torch.save(model.state_dict(), path)
    else:
        model.load_state_dict(torch.load(path))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))
for _ in range(3):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
print(loss.item())
if len(sys.argv) > 1:
    np.savez(sys.argv[1], **{k: v.detach().numpy() for k, v in model.state_dict().items()
                             if v.dtype.is_floating_point})
"""

SETTINGS = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "OMP_NUM_THREADS": "1"}

# the truth of each op's cause, without tracediff: the script run plainly under a dispatch
# mode that saves the inputs of the first calls of every aten op (torch.save); then, in one
# process per setting, each saved call run again on those inputs and its outputs hashed: a
# setting that changes an op's hash from the plain process's changes how that op computes
OPS = """
import collections, copy, hashlib, io, runpy, sys
import torch
from torch.utils._python_dispatch import TorchDispatchMode

def digest(x):
    ts = [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]
    return hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes() for t in ts
                                   if t.dtype.is_floating_point)).hexdigest()[:16]

if sys.argv[1] == "save":
    calls, seen = [], collections.Counter()

    class Save(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "aten" and seen[func.name()] < 20:
                seen[func.name()] += 1
                detach = lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t
                call = (func.name(), torch.utils._pytree.tree_map(detach, (args, kwargs)))
                try:   # calls holding what cannot be saved (a profiler handle) are left out
                    torch.save(call, io.BytesIO())
                    calls.append(call)
                except Exception:
                    pass
            return func(*args, **kwargs)

    out, sys.argv = sys.argv[2], sys.argv[3:]
    with Save():
        runpy.run_path(sys.argv[0], run_name="__main__")
    torch.save(calls, out)
else:
    for name, (args, kwargs) in torch.load(sys.argv[2], weights_only=False):
        packet, _, overload = name.split("::")[1].partition(".")
        func = getattr(getattr(torch.ops.aten, packet), overload or "default")
        args, kwargs = copy.deepcopy((args, kwargs))
        try:
            print(name, digest(func(*args, **kwargs)))
        except Exception as exc:
            print(name, "failed")
"""


def _plain(tmp_path, script, env, name, *extra):
    out = tmp_path / f"{name}.npz"
    full = {k: v for k, v in script_env(env).items() if k not in SETTINGS or k in env}
    subprocess.run([sys.executable, str(script), str(out), *extra], env=full, check=True,
                   capture_output=True)
    with np.load(out) as f:
        return {k: f[k].astype(np.float64) for k in f.files}


def _rel(a, b):
    num = sum(float(np.sum((a[k] - b[k]) ** 2)) for k in a)
    return (num / sum(float(np.sum(a[k] ** 2)) for k in a)) ** 0.5


def _op_hashes(calls, env):
    full = {k: v for k, v in script_env(env).items() if k not in SETTINGS or k in env}
    out = subprocess.run([sys.executable, "-c", OPS, "run", str(calls)], env=full,
                         check=True, capture_output=True, text=True).stdout.splitlines()
    return [line.split() for line in out if line.startswith("aten::")]


def _ops_changed(script, tmp):
    """{setting: op names whose bits change under it alone, on the same saved inputs}."""
    calls = tmp / "calls.pt"
    subprocess.run([sys.executable, "-c", OPS, "save", str(calls), str(script)],
                   env=script_env({}), check=True, capture_output=True)
    plain = _op_hashes(calls, {})
    out = {}
    for k, v in SETTINGS.items():
        other = _op_hashes(calls, {k: v})
        out[k] = sorted({op.split(".")[0] for (op, h), (_, h2) in zip(plain, other)
                         if h != h2 and "failed" not in (h, h2) and "empty" not in op})
    return out


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """The CNN recorded plainly (a) and with three settings at once (b), and the truth."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("confirm_cnn")
    script = tmp / "cnn.py"
    script.write_text(CNN)
    changes = _ops_changed(script, tmp)
    if not all(changes.values()):
        pytest.skip(f"a setting changes none of the ops on this CPU: {changes}")
    a = _plain(tmp, script, {}, "a", f"save:{tmp / 'init_a.pt'}")
    b = _plain(tmp, script, SETTINGS, "b")
    whole = _rel(a, b)
    same_init = _rel(a, _plain(tmp, script, SETTINGS, "b_init_a", f"load:{tmp / 'init_a.pt'}"))
    truth = {"changes": changes, "removal": {}, "alone": {}, "initialiser": 1 - same_init / whole}
    for k, v in SETTINGS.items():
        without = {o: w for o, w in SETTINGS.items() if o != k}
        truth["removal"][k] = 1 - _rel(a, _plain(tmp, script, without, f"no_{k}")) / whole
        truth["alone"][k] = _rel(a, _plain(tmp, script, {k: v}, f"only_{k}")) / whole
    paths = []
    for name, env in (("a", {}), ("b", SETTINGS)):
        full = {k: v for k, v in script_env(env).items() if k not in SETTINGS or k in env}
        subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", str(tmp / f"{name}.h5"),
                        str(script)], env=full, check=True, capture_output=True, cwd=tmp)
        paths.append(tmp / f"{name}.h5")
    return paths, truth, tmp


@pytest.mark.deep
def test_each_source_gets_the_setting_that_changes_its_op_and_its_measured_removal(cnn):
    """Three settings at once: the convolution is oneDNN's, Adam's lerp_ ATen's vector
    kernels', the matmul the thread count's (before: every source carried "the same
    ONEDNN_MAX_CPU_ISA" first). The measured removals are those of plain runs, and the
    settings that offset each other are said to interact."""
    (a, b), truth, tmp = cnn
    proc = run_cli("confirm", a, b, "--json", "--dir", tmp / "runs")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for s in doc["sources"]:
        if s["mechanism"] in ("initialiser", "random_data"):
            continue   # an RNG draw: not an op a dispatch mode sees change on equal inputs
        ops = {op.split(" x")[0].split(".")[0] for op in s["ops"].split(", ")}
        true = {k for k, changed in truth["changes"].items() if ops & set(changed)}
        assert s["causes_measured"] and set(s["causes_measured"]) <= true, (s, truth)
    for e in doc["settings"]:
        assert abs(e["removal"] - truth["removal"][e["setting"]]) <= 0.05, (e, truth)
        assert abs(e["alone"] - truth["alone"][e["setting"]]) <= 0.05, (e, truth)
        if truth["removal"][e["setting"]] < -0.05:
            assert "differ" in e["interacts"] and "more" in e["interacts"], e
    assert doc["reproduced"] is True and doc["residual"] == 0.0
    # the initialiser, which no setting alone expresses here, measured by substituting a's
    # drawn values in b's run: what b started from a's initial parameters removes
    (init,) = [s for s in doc["sources"] if s["mechanism"] == "initialiser"]
    assert "substituted" in init["verdict"], init
    assert abs(init["measured"] - truth["initialiser"]) <= 0.05, (init, truth)


def _tiny(tmp_path, b_env):
    script = tmp_path / "tiny.py"
    script.write_text("import torch\ntorch.manual_seed(0)\nx = torch.randn(64, 64)\n"
                      "print(float((x @ x).sum()))\n")
    paths = []
    for name, env in (("a", {}), ("b", b_env)):
        out = tmp_path / f"{name}.h5"
        run_cli("record", "-o", out, script, env=env, check=True)
        paths.append(out)
    return script, paths


def test_a_dry_run_prints_the_runs_that_run_exactly_as_printed(tmp_path):
    """The runs are printed as one command line each; pasted into a shell, the first records
    b again. Settings that load code or name files (a cache folder, an XLA dump folder) are
    listed and never set."""
    pytest.importorskip("torch")
    script, (a, b) = _tiny(tmp_path, {"ATEN_CPU_CAPABILITY": "default",
                                      "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
                                      "XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_cpu_max_isa=AVX"})
    proc = run_cli("confirm", a, b, "--dry-run", "--json", "--dir", tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    names = [r["name"] for r in doc["runs"]]
    assert names[0] == "b as recorded" and "without ATEN_CPU_CAPABILITY" in names
    assert "without XLA flag --xla_cpu_max_isa" in names
    unset = dict(doc["unsettable"])
    assert "XLA flag --xla_dump_to" in unset and "env.TORCHINDUCTOR_CACHE_DIR" in unset
    for r in doc["runs"]:
        assert "xla_dump_to" not in r["command"] and "TORCHINDUCTOR" not in r["command"]
        assert not os.path.exists(r["trace"])
    first = doc["runs"][0]
    assert "ATEN_CPU_CAPABILITY=default" in first["command"]
    subprocess.run(["bash", "-c", first["command"]], check=True, capture_output=True)
    assert os.path.exists(first["trace"])


def test_a_script_changed_since_it_was_recorded_is_never_run(tmp_path):
    pytest.importorskip("torch")
    script, (a, b) = _tiny(tmp_path, {"ATEN_CPU_CAPABILITY": "default"})
    script.write_text(script.read_text() + "print('changed')\n")
    proc = run_cli("confirm", a, b, "--dir", tmp_path / "runs")
    assert proc.returncode == 2 and "has changed since it was recorded" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not os.listdir(tmp_path / "runs")


def test_a_run_made_elsewhere_is_measured_with_its_setting_and_must_run_the_same_script(tmp_path):
    """`--with`: a trace of b's script recorded with a setting changed (where b ran on a
    TPU, the run confirm prints for there) is measured as a run: its removal and the sources
    it removed, named by what it changed. A trace of another script is refused."""
    pytest.importorskip("torch")
    script, (a, b) = _tiny(tmp_path, {"ATEN_CPU_CAPABILITY": "default"})
    given = tmp_path / "given.h5"
    run_cli("record", "-o", given, script, check=True)   # b's script, the setting unset
    proc = run_cli("confirm", a, b, "--with", given, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    if doc["distance"] == 0:
        pytest.skip("ATEN_CPU_CAPABILITY=default computes this matmul as this CPU does")
    (run,) = doc["runs"]
    assert run["distance"] == 0 and run["removal"] == 1.0
    assert run["reverted"] == ["ATEN_CPU_CAPABILITY=unset"]
    assert all(s["causes_measured"] == ["ATEN_CPU_CAPABILITY=unset"] for s in doc["sources"])
    other = tmp_path / "other.py"
    other.write_text(script.read_text() + "print()\n")
    run_cli("record", "-o", tmp_path / "other.h5", other, check=True)
    proc = run_cli("confirm", a, b, "--with", tmp_path / "other.h5")
    assert proc.returncode == 2 and "ran another script than b" in proc.stderr
