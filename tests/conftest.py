"""Session-wide recordings shared by several test modules (each is recorded once)."""

import compileall
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .helpers import FIXTURES, ROOT, Recordings, shared_folder, stop_zygotes

def pytest_ignore_collect(collection_path, config):
    """The field suite (tests/field: third-party programs, their own CI stage) is not even
    collected unless the run selects it (`-m field`): README's test command (`-m "not field"`
    from pyproject's addopts) neither imports transformers nor counts its modules."""
    if collection_path.name == "field" and collection_path.parent == Path(__file__).parent:
        expr = config.getoption("markexpr") or ""
        if "field" not in expr or "not field" in expr:
            return True
    return None


def pytest_configure(config):
    """In the run's first pytest process (not an xdist worker), before the workers start
    and inherit its environment: the bytecode of tracediff/ and tests/, one XLA compilation
    cache and one folder for the test zygotes (tests/zygote.py) for the whole run."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _compile_bytecode()
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        config._tracediff_xla_cache = _xla_cache()
    if "TRACEDIFF_TESTS_ZYGOTES" not in os.environ:
        config._tracediff_zygotes = tempfile.mkdtemp(prefix="tracediff-tests-zygotes-")
        os.environ["TRACEDIFF_TESTS_ZYGOTES"] = config._tracediff_zygotes


def _xla_cache():
    """One XLA compilation cache for the whole run (this process, the xdist workers and
    every recording they start inherit it): the same fixture recorded four ways compiles
    its programs once. The cache is keyed by jaxlib version, XLA flags and program, so
    values are the ones an uncached run computes; `locate` does not list these variables
    as environment differences (diff/explain/env.py). A fresh folder per run: nothing carries
    over from a previous run."""
    folder = tempfile.mkdtemp(prefix="tracediff-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
    return folder


def _compile_bytecode():
    """Byte-compile tracediff/ and tests/ once, before the ~60 fresh interpreters the
    suite starts each import them: with PYTHONDONTWRITEBYTECODE set (a common setting,
    and this machine's), every one of them would otherwise compile the same sources
    again (~0.1 CPU-s each). Python checks a .pyc against its source's mtime and size,
    so a stale one is never used; the __pycache__ folders are git-ignored."""
    for folder in ("tracediff", "tests"):
        compileall.compile_dir(os.path.join(ROOT, folder), quiet=2)


def pytest_unconfigure(config):
    folder = getattr(config, "_tracediff_xla_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
        os.environ.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
        os.environ.pop("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", None)
    folder = getattr(config, "_tracediff_zygotes", None)
    if folder:   # the run is over: end its zygotes (they would end idle anyway)
        stop_zygotes(folder)
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("TRACEDIFF_TESTS_ZYGOTES", None)


# Modules whose recordings take longest, started first so that no worker is left running
# one of them alone at the end (pytest-xdist hands out whole modules: --dist loadfile).
SLOWEST_FIRST = ("test_ports", "test_torch_compile", "test_levels", "test_reliability",
                 "test_explain", "test_replicas", "test_ranks", "test_devices_jax",
                 "test_check", "test_contracts", "test_jax_capture", "test_fuzz")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1],
                                         len(SLOWEST_FIRST)))


PERTURB = os.path.join(ROOT, "tests", "perturb")
GRU_STEPS = "3"
TORCH_GRU_STEPS = "2"
# the real perturbations the tests record with (environment for `tracediff record`)
BROKEN_DOT = {"PYTHONPATH": os.path.join(PERTURB, "broken_dot")}
TANH_ULP = {"PYTHONPATH": os.path.join(PERTURB, "tanh_ulp")}
TF32_ADDMM = {"PYTHONPATH": os.path.join(PERTURB, "tf32_addmm")}
BF16_PASS = {"PYTHONPATH": os.path.join(PERTURB, "bf16_pass")}
XLA_SSE4 = {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"}
MKL_SSE = {"MKL_CBWR": "COMPATIBLE"}
MAX_DIM_INDICES = {"PYTHONPATH": os.path.join(PERTURB, "max_dim_indices")}


@pytest.fixture(scope="session")
def jax_gru(recorded):
    """The GRU+expm+Adam example recorded four ways: twice plainly, with XLA limited to
    SSE4.2 code generation, and with `tanh` made one ULP larger: {key: (path, proc)}."""
    args = ("--steps", GRU_STEPS)
    # two at a time, in this order: "a2" starts once "a" has filled the compilation cache
    # with the programs it compiles too ("isa" shares none: XLA flags are in the key)
    jobs = {
        "a": ("jax_gru_expm_adam.py", args, None),
        "isa": ("jax_gru_expm_adam.py", args, XLA_SSE4),
        "a2": ("jax_gru_expm_adam.py", args, None, (), "again"),
        "tanh": ("jax_gru_expm_adam.py", args, TANH_ULP),
    }
    return {key: (path, recorded.proc(path)) for key, path in recorded.many(jobs).items()}


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):
    """Recordings shared by every module (tests/helpers.Recordings): ask for
    `recorded("torch_dot.py")` or `recorded.many({...})` instead of recording again.
    Under pytest-xdist the folder is the run's, shared by its workers."""
    return Recordings(shared_folder(tmp_path_factory, "recordings"))


OTHER_JAX = os.environ.get("TRACEDIFF_OTHER_JAX_PYTHON")
# the GRU example, one step, recorded under the oldest supported JAX (0.7.2) with
# `tests/record_other_jax.sh`; re-recorded fresh when TRACEDIFF_OTHER_JAX_PYTHON names
# that JAX's Python (CI does), so the README's test command runs the cross-version tests too
OLD_JAX_TRACE = os.path.join(FIXTURES, "traces", "jax_gru_expm_adam.jax-0.7.2.h5")


@pytest.fixture(scope="session")
def two_jax_versions(recorded, tmp_path_factory):
    """(old, new): jax_gru_expm_adam.py --steps 1 under the oldest supported JAX and this one."""
    new = recorded("jax_gru_expm_adam.py", "--steps", "1")
    if not OTHER_JAX:
        return OLD_JAX_TRACE, new
    old = tmp_path_factory.mktemp("other_jax") / "old.h5"
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([OTHER_JAX, "-m", "tracediff", "record", "-o", str(old),
                           os.path.join(FIXTURES, "jax_gru_expm_adam.py"), "--steps", "1"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return old, new
