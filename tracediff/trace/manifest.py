"""Environment manifest: everything about the machine and libraries that can change numbers.

Collected at the start of a recording (machine, packages, variables) and completed at
the end by each capture (framework configuration the script may have changed, e.g. x64).
"""

import datetime
import hashlib
import importlib.metadata
import os
import platform
import sys

from .._version import __version__

# Packages whose versions can change numerics or capture.
PACKAGES = ["jax", "jaxlib", "jax-cuda12-plugin", "flax", "optax", "chex", "ml_dtypes", "numpy",
            "scipy", "torch", "h5py", "tracediff-ml", "intel-openmp", "mkl", "nvidia-cublas-cu12"]

# Environment variables that can change numerics or threading.
ENV_PREFIXES = ("XLA_", "JAX_", "TF_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOTO", "BLIS_",
                "VECLIB_", "CUDA_", "CUBLAS_", "NVIDIA_", "TORCH_", "PYTORCH_", "ONEDNN_", "DNNL_",
                "ATEN_", "TPU_", "NPROC", "PYTHONHASHSEED", "TORCHINDUCTOR_", "TORCHDYNAMO_")


def cpu_info():
    """CPU model and ISA flags (Linux /proc/cpuinfo, macOS sysctl), best effort."""
    info = {"machine": platform.machine(), "processor": platform.processor(),
            "count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20)
        for line in text.splitlines():
            key, _, val = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model") and "model" not in info:
                info["model"] = val.strip()
            elif key in ("flags", "Features") and "isa_flags" not in info:
                info["isa_flags"] = sorted(val.split())
    except OSError:
        pass
    if sys.platform == "darwin":
        import subprocess
        for key, name in (("machdep.cpu.brand_string", "model"), ("machdep.cpu.features", "isa_flags")):
            try:
                out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True,
                                     timeout=5).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                continue
            if out:
                info[name] = sorted(out.lower().split()) if name == "isa_flags" else out
    return info


def package_versions():
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def numeric_env():
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def base_manifest(script=None, argv=None, recording=None):
    """Manifest fields known before the script runs."""
    m = {
        "tracediff_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "os": {"system": platform.system(), "release": platform.release(),
               "version": platform.version(), "platform": platform.platform()},
        "hostname": platform.node(),
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "cpu": cpu_info(),
        "packages": package_versions(),
        "env": numeric_env(),
        "threads": {"cpu_count": os.cpu_count(),
                    "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None},
        "recording": dict(recording or {}),
        "pid": os.getpid(),
    }
    if script is not None:
        m["script"] = {"path": os.path.abspath(script), "name": os.path.basename(script),
                       "sha256": file_sha256(script), "argv": list(argv or [])}
    return m
