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

import pytest

from . import confirm_truth as truth_of
from .helpers import FIXTURES, rel_l2, run_cli, script_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CNN = os.path.join(FIXTURES, "torch_cnn_settings.py")
SETTINGS = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """The CNN recorded plainly (a) and with three settings at once (b), and the truth."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("confirm_cnn")
    base = script_env({})
    changes = truth_of.ops_changed(CNN, [], str(tmp), SETTINGS, base)
    if not all(changes.values()):
        pytest.skip(f"a setting changes none of the ops on this CPU: {changes}")

    def final(env, name, *args):
        return truth_of.final(CNN, args, env, tmp / f"{name}.npz", base)

    a = final({}, "a", "--save-init", str(tmp / "init_a.pt"))
    b = final(SETTINGS, "b")
    whole = rel_l2(a, b)
    same_init = rel_l2(a, final(SETTINGS, "b_init_a", "--init-from", str(tmp / "init_a.pt")))
    truth = {"changes": changes, "removal": {}, "alone": {}, "initialiser": 1 - same_init / whole}
    for k, v in SETTINGS.items():
        without = {o: w for o, w in SETTINGS.items() if o != k}
        truth["removal"][k] = 1 - rel_l2(a, final(without, f"no_{k}")) / whole
        truth["alone"][k] = rel_l2(a, final({k: v}, f"only_{k}")) / whole
    paths = []
    for name, env in (("a", {}), ("b", SETTINGS)):
        subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", str(tmp / f"{name}.h5"),
                        CNN], env=truth_of.environment(env, base), check=True,
                       capture_output=True, cwd=tmp)
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


@pytest.mark.deep
def test_a_report_carries_the_sources_measured_by_runs(tmp_path):
    """`report --confirm`: the Markdown and HTML reports end with the sources checked by
    runs (measured beside estimated, the runs and their commands)."""
    pytest.importorskip("torch")
    _, (a, b) = _tiny(tmp_path, {"ATEN_CPU_CAPABILITY": "default"})
    for name in ("r.md", "r.html"):
        proc = run_cli("report", a, b, "-o", tmp_path / name, "--confirm")
        assert proc.returncode == 0, proc.stderr
        text = (tmp_path / name).read_text()
        assert "Confirmed by runs" in text and "without ATEN_CPU_CAPABILITY" in text
        assert "estimated" in text and "measured" in text
