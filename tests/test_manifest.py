"""The environment manifest records what a run loaded besides the script: the faulty
aten::dot kernel registered by a sitecustomize on PYTHONPATH shows up in the environment
differences (as a replaced kernel, a start-up hook and PYTHONPATH), is the top cause in
explain, and is in the report's reproduction commands; the native numeric libraries
loaded, with versions; JAX lowering rules replaced from outside JAX."""

import importlib.util
import io
import json
import os
import subprocess
import sys

import pytest

import tracediff
from tracediff.diff.explain.env import env_diff
from tracediff.trace import manifest

from .conftest import BROKEN_DOT, PERTURB
from .helpers import script_env

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (the oldest-JAX CI environment)")


@pytest.fixture(scope="module")
def dot(recorded):
    """torch_dot.py plain and with the faulty aten::dot of tests/perturb/broken_dot (the
    session's recordings), and their locate result."""
    a, b = recorded("torch_dot.py"), recorded("torch_dot.py", env=BROKEN_DOT)
    return a, b, tracediff.locate(a, b)


@needs_torch
def test_a_kernel_loaded_through_pythonpath_is_an_environment_difference(dot):
    a, b, r = dot
    diff = {e["key"]: e for e in r.env_diff}
    kernel = diff["frameworks.torch.python_kernels.aten::dot"]
    assert kernel["category"] == "kernel-override" and kernel["a"] is None
    assert kernel["b"].startswith("CPU kernel registered at ") and \
        os.path.join("broken_dot", "sitecustomize.py:") in kernel["b"]
    hook = diff["startup.sitecustomize"]
    assert hook["category"] == "startup" and hook["a"] is None and "broken_dot" in hook["b"]
    assert "sha256" in hook["b"]
    path = diff["env.PYTHONPATH"]
    assert path["category"] == "env" and "broken_dot" in path["b"] and "broken_dot" not in path["a"]
    assert r.env_diff[0]["key"] == "frameworks.torch.python_kernels.aten::dot"   # ranked first
    # explain: the replaced kernel of the origin op is the most likely cause
    assert r.explain.likely_cause.startswith("frameworks.torch.python_kernels.aten::dot: "
                                                "aten::dot runs a kernel registered from Python")



@needs_torch
def test_within_a_category_the_numerically_relevant_keys_come_first(dot):
    """The environment differences are ranked by category, then numerically relevant
    keys first (PYTHONPATH decides which kernels load), then by name: a variable that
    sorts earlier but changes no number (CUDA_VISIBLE_DEVICES on a CPU run) comes after."""
    a, b, _ = dot
    with tracediff.load(a) as ta, tracediff.load(b) as tb:
        ma, mb = ta.manifest, tb.manifest
    mb["env"]["CUDA_VISIBLE_DEVICES"] = "0"   # as if b had been started with it set
    diff = env_diff(ma, mb)
    env = [e["key"] for e in diff if e["category"] == "env"]
    assert env == ["env.PYTHONPATH", "env.CUDA_VISIBLE_DEVICES"], env
    from tracediff.diff.explain.env import RANK

    ranks = [RANK[e["category"]] for e in diff]
    assert ranks == sorted(ranks) and diff[0]["category"] == "kernel-override"


@needs_torch
def test_headline_shows_the_values_and_the_report_reproduces_the_cause(dot):
    from rich.console import Console

    from tracediff.report.context import report_context
    from tracediff.report.terminal import print_locate

    a, b, r = dot
    out = io.StringIO()
    print_locate(r, Console(file=out, width=200, no_color=True, highlight=False))
    head = out.getvalue().splitlines()[:5]
    assert any("outputs: a float32[]   b float32[]   worst element: 14.0 vs 0.0" in line
               for line in head), head
    commands = report_context(r).commands
    rec_b = next(c for c in commands if "tracediff record" in c and os.path.basename(b) in c)
    assert rec_b.startswith("PYTHONPATH=") and os.path.join(PERTURB, "broken_dot") in rec_b
    rec_a = next(c for c in commands if "tracediff record" in c and os.path.basename(a) in c)
    assert "broken_dot" not in rec_a


@needs_torch
def test_native_libraries_and_torch_build_libraries_are_recorded(dot):
    a, _, _ = dot
    with tracediff.load(a) as t:
        m = t.manifest
    libs = m["libraries"]
    assert libs["numpy-blas"].split()[0] in ("scipy-openblas", "openblas", "mkl", "accelerate")
    if os.path.exists("/proc/self/maps"):
        assert libs["libtorch_cpu"].startswith("libtorch_cpu.so, ") and "bytes" in libs["libtorch_cpu"]
        assert "libc" in libs or "libm" in libs
    built = m["frameworks"]["torch"]["libraries"]
    assert built["blas"] and built["onednn"].startswith("v")   # this CPU build links MKL-DNN
    assert m["frameworks"]["torch"]["python_kernels"] == {}


def test_preloaded_library_is_listed(monkeypatch):
    import numpy

    blas = next((p for p in _mapped() if "openblas" in p or "mkl" in p), None) or numpy.__file__
    monkeypatch.setenv("LD_PRELOAD", blas)
    libs = manifest.native_libraries()
    assert any(v.startswith(os.path.basename(os.path.realpath(blas))) for v in libs.values())
    assert manifest.numeric_env()["LD_PRELOAD"] == blas


def _mapped():
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            return [line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6]
    except OSError:
        return []


def test_jax_lowering_replaced_by_a_sitecustomize_is_recorded():
    code = ("import json, jax; from tracediff.capture.jax.internals import lowering_overrides; "
            "print(json.dumps(lowering_overrides()))")
    env = script_env({"PYTHONPATH": os.path.join(PERTURB, "tanh_ulp")})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    perturbed = json.loads(proc.stdout)
    assert list(perturbed) == ["tanh"]
    assert perturbed["tanh"].startswith("cpu lowering registered at ") and \
        os.path.join("tanh_ulp", "sitecustomize.py:") in perturbed["tanh"]
    from tracediff.capture.jax.internals import lowering_overrides

    assert lowering_overrides() == {}   # this process's JAX is its own
    diff = env_diff({"frameworks": {"jax": {"python_kernels": {}}}},
                    {"frameworks": {"jax": {"python_kernels": perturbed}}})
    assert diff[0]["key"] == "frameworks.jax.python_kernels.tanh"
    assert diff[0]["category"] == "kernel-override"
