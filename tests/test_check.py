"""Golden traces: `tracediff check` and the pytest plugin, on a tiny JAX training loop
written into the test's folder (a few seconds per recording)."""

import importlib.metadata
import os
import subprocess
import sys
import textwrap
import tomllib

import pytest

from .helpers import ROOT, run_cli

TRAIN = textwrap.dedent('''
    """Tiny JAX loop: --scale perturbs the initial weight, --fail exits with status 3."""
    import argparse
    import jax
    import jax.numpy as jnp

    p = argparse.ArgumentParser()
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--fail", action="store_true")
    args = p.parse_args()


    @jax.jit
    def step(w, x):
        y = jnp.tanh(x @ w)
        return w - 0.1 * (x.T @ (y - 1.0)), jnp.mean(y)


    w = jnp.ones((4, 3)) * 0.1 * args.scale
    x = jnp.arange(8.0).reshape(2, 4) / 8
    for _ in range(3):
        w, loss = step(w, x)
    print("loss", float(loss))
    if args.fail:
        raise SystemExit(3)
''')


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("check")
    (folder / "train.py").write_text(TRAIN)
    return folder


def test_check_cycle(project):
    golden, script = project / "goldens" / "train.h5", project / "train.py"
    os.makedirs(golden.parent)
    # no golden yet: exit 2 and the command that creates it
    proc = run_cli("check", golden, script, "--scale", "1")
    assert proc.returncode == 2
    assert f"tracediff check --update {golden} {script} --scale 1" in proc.stderr
    proc = run_cli("check", "--update", golden, script)
    assert proc.returncode == 0 and golden.exists(), proc.stderr
    assert "golden trace written" in proc.stderr
    # same run: match, report on stdout, the script's output on stderr
    proc = run_cli("check", golden, script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("MATCH") and "loss" not in proc.stdout and "loss" in proc.stderr
    # drift: exit 1, the new trace kept, a report written
    report, new = project / "drift.md", project / "new.h5"
    proc = run_cli("check", "--report", report, "-o", new, golden, script, "--scale", "1.001")
    assert proc.returncode == 1, proc.stderr
    assert "DIVERGED" in proc.stdout and "train.py:" in proc.stdout
    assert new.exists() and report.read_text().startswith("# tracediff report")
    proc = run_cli("check", "-q", "--rtol", "0.01", golden, script, "--scale", "1.001")
    assert proc.returncode == 0 and proc.stdout == ""
    # the script fails: exit 2, said plainly
    proc = run_cli("check", golden, script, "--fail")
    assert proc.returncode == 2
    assert "exited with status 3 while being recorded" in proc.stderr


def test_check_argument_errors(project):
    script = project / "train.py"
    proc = run_cli("check", script, project / "g.h5")
    assert proc.returncode == 2 and "wrong order" in proc.stderr
    proc = run_cli("check", project / "g.h5", project / "missing.py")
    assert proc.returncode == 2 and "no such script" in proc.stderr
    proc = run_cli("check", "--report", project / "r.pdf", project / "g.h5", script)
    assert proc.returncode == 2


def test_pytest11_entry_point_is_declared():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        meta = tomllib.load(fh)
    assert meta["project"]["entry-points"]["pytest11"] == {"tracediff": "tracediff.pytest_plugin"}


def _plugin_installed():
    return any(ep.value == "tracediff.pytest_plugin"
               for ep in importlib.metadata.entry_points(group="pytest11"))


TESTS = textwrap.dedent('''
    import jax.numpy as jnp


    def test_script(tracediff_check):
        tracediff_check("goldens/train.h5", "train.py")


    def test_script_rtol(tracediff_check):
        result = tracediff_check("goldens/rtol.h5", "train.py", "--scale", DRIFT, rtol=0.01)
        assert result is None or result.verdict == "match"


    def test_drift(tracediff_check):
        tracediff_check("goldens/drift.h5", "train.py", "--scale", DRIFT)


    def test_block(tracediff_golden):
        with tracediff_golden("goldens/block.h5"):
            jnp.tanh(jnp.arange(4.0) * SCALE)


    def test_missing(tracediff_check):          # never given a golden
        tracediff_check("goldens/never.h5", "train.py")


    def test_missing_block(tracediff_golden):
        with tracediff_golden("goldens/never_block.h5"):
            jnp.tanh(jnp.arange(4.0))
''')


def _pytest(folder, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.pop("XLA_FLAGS", None)
    plugin = [] if _plugin_installed() else ["-p", "tracediff.pytest_plugin"]
    return subprocess.run([sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider",
                           "-p", "no:anyio", "-q", "-rf", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)


# slow (10-15 s each here): CI's deep stage, which keeps README's test command within five minutes
@pytest.mark.deep
def test_pytest_plugin(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "test_golden.py").write_text(TESTS.replace("DRIFT", '"1"').replace("SCALE", "1.0"))
    proc = _pytest(tmp_path, "--tracediff-update-golden", "-k", "not missing")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "4 passed, 2 deselected" in proc.stdout
    assert {p.name for p in (tmp_path / "goldens").iterdir()} == {"train.h5", "rtol.h5", "drift.h5", "block.h5"}
    # now perturb: the drift run and the with-block fail, with the report; rtol=0.01 passes
    (tmp_path / "test_golden.py").write_text(TESTS.replace("DRIFT", '"1.001"')
                                             .replace("SCALE", "1.001"))
    proc = _pytest(tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "4 failed, 2 passed" in proc.stdout
    assert "diverges from the golden trace" in proc.stdout and "DIVERGED" in proc.stdout
    assert "FAILED test_golden.py::test_drift" in proc.stdout
    assert "FAILED test_golden.py::test_block" in proc.stdout
    # a golden never written names itself and the option that writes it (the -rf summary
    # may repeat it: terminal width decides)
    for name in ("never", "never_block"):
        assert f"goldens/{name}.h5 does not exist; create it with: pytest --tracediff-update-golden" \
            in proc.stdout, proc.stdout[-3000:]
    assert not (tmp_path / "goldens" / "never.h5").exists()


def _hollow_goldens(folder, real):
    """Two goldens that a comparison cannot fail on, from a real one: no events at all,
    and every value metadata only (bytes and hash dropped, as for a meta tensor)."""
    import shutil

    import h5py

    from tracediff.trace import schema

    from . import synth

    empty = synth.write(str(folder / "empty.h5"), [])
    meta = folder / "meta.h5"
    shutil.copyfile(real, meta)
    with h5py.File(meta, "r+") as f:
        v = f["values"][()]
        assert len(v)
        v["flags"] = schema.VFLAG_NOT_STORED
        v["offset"], v["nbytes"], v["hash"] = -1, 0, 0
        f["values"][...] = v
        for name in ("stats", "shards"):
            if name in f:
                f.attrs[f"committed_{name}"] = 0
    return empty, str(meta)


def test_check_refuses_a_golden_with_nothing_to_compare(project):
    """A golden with no events, or only metadata-only values, made `check` say MATCH
    (exit 0) whatever the script computed; it is refused before the script runs."""
    golden, script = project / "goldens" / "train.h5", project / "train.py"
    if not golden.exists():
        golden.parent.mkdir(exist_ok=True)
        run_cli("check", "--update", golden, script, check=True)
    empty, meta = _hollow_goldens(project, golden)
    for path, why in ((empty, "it holds no events"),
                      (meta, "values are metadata only (no bytes, no hash)")):
        proc = run_cli("check", path, script, "--scale", "7")
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.startswith(f"tracediff: error: {path}: the golden trace has nothing "
                                      f"to compare ("), proc.stderr
        assert why in proc.stderr and proc.stderr.count("\n") == 1
        assert proc.stderr.endswith(f"record it again: tracediff check --update {path} "
                                    f"{script} --scale 7\n")
        assert "loss" not in proc.stderr    # refused before the script ran


HOLLOW_TESTS = textwrap.dedent('''
    def test_empty(tracediff_check):
        tracediff_check("empty.h5", "train.py")


    def test_meta(tracediff_check):
        tracediff_check("meta.h5", "train.py")


    def test_block(tracediff_golden):
        with tracediff_golden("empty.h5"):
            pass
''')


def test_pytest_plugin_refuses_a_golden_with_nothing_to_compare(project, tmp_path):
    golden = project / "goldens" / "train.h5"
    if not golden.exists():
        golden.parent.mkdir(exist_ok=True)
        run_cli("check", "--update", golden, project / "train.py", check=True)
    (tmp_path / "train.py").write_text(TRAIN)
    _hollow_goldens(tmp_path, golden)
    (tmp_path / "test_hollow.py").write_text(HOLLOW_TESTS)
    proc = _pytest(tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "3 failed" in proc.stdout, proc.stdout[-3000:]
    for name, why in (("empty", "it holds no events"),
                      ("meta", "values are metadata only (no bytes, no hash)")):
        assert f"{tmp_path / name}.h5 has nothing to compare (" in proc.stdout
        assert why in proc.stdout
    assert "record it again with: pytest --tracediff-update-golden" in proc.stdout
