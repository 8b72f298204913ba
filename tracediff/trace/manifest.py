"""Environment manifest: everything about the machine and libraries that can change numbers.

Collected at the start of a recording (machine, packages, variables, start-up hooks) and
completed at the end by each capture (framework configuration the script may have
changed, e.g. x64; kernels registered from Python over a library's own, `dispatcher_
overrides`) and with the native libraries the process has loaded by then
(`native_libraries`). What a run loaded besides the script is part of its environment:
a `sitecustomize` on PYTHONPATH that replaces `aten::dot`, an LD_PRELOAD'ed BLAS.
"""

import datetime
import hashlib
import importlib.metadata
import os
import platform
import re
import sys

from .._version import __version__

# Packages whose versions can change numerics or capture.
PACKAGES = ["jax", "jaxlib", "jax-cuda12-plugin", "flax", "optax", "chex", "ml_dtypes", "numpy",
            "scipy", "torch", "h5py", "tracediff-ml", "intel-openmp", "mkl", "nvidia-cublas-cu12"]

# Environment variables that can change numerics or threading.
ENV_PREFIXES = ("XLA_", "JAX_", "TF_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOTO", "BLIS_",
                "VECLIB_", "CUDA_", "CUBLAS_", "NVIDIA_", "TORCH_", "PYTORCH_", "ONEDNN_", "DNNL_",
                "ATEN_", "TPU_", "NPROC", "PYTHONHASHSEED", "TORCHINDUCTOR_", "TORCHDYNAMO_")
# ... and those that decide which code and native libraries a run loads
ENV_KEYS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONNOUSERSITE", "PYTHONUSERBASE",
            "LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES", "DYLD_LIBRARY_PATH",
            "DYLD_FRAMEWORK_PATH")

# Start-up hooks Python imports before any script (site.py): code that can patch anything.
STARTUP_MODULES = ("sitecustomize", "usercustomize")

# Shared libraries whose code computes numbers (matched on the file name): BLAS/LAPACK,
# oneDNN, OpenMP runtimes, vector math, CUDA math libraries, libm/libc, the frameworks'
# own native code.
NUMERIC_LIBRARY = re.compile(
    r"(blas|lapack|mkl|dnnl|onednn|mkldnn|omp|tbb|cublas|cudnn|cusolver|cusparse|cufft|curand|"
    r"nccl|nvrtc|sleef|fftw|gfortran|quadmath|blis|flexiblas|armpl|aocl|accelerate|veclib|"
    r"^libm[.-]|^libmvec|^libc[.-]|^libstdc\+\+|^libjax|^libxla|^libtorch|^libc10)", re.I)


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
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES) or k in ENV_KEYS}


def startup_hooks():
    """{module: "path (sha256 ...)"} of the start-up hooks this interpreter imported."""
    out = {}
    for name in STARTUP_MODULES:
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None) if mod is not None else None
        if not path:
            continue
        try:
            out[name] = f"{path} (sha256 {file_sha256(path)[:16]})"
        except OSError:
            out[name] = f"{path} (unreadable)"
    return out


def _library_key(filename):
    """`libopenblas64_p-r0-0cf96a72.3.23.dev.so` -> `libopenblas64_p`: a name that stays
    the same across versions and builds of one library."""
    m = re.match(r"[A-Za-z_+][A-Za-z0-9_+]*?(?=[-.]|$)", filename)
    return m.group(0) if m else filename


def native_libraries(maps="/proc/self/maps"):
    """{library: "file name, N bytes"} of the numeric shared libraries this process has
    mapped (Linux; empty elsewhere), plus each LD_PRELOAD entry and numpy's BLAS/LAPACK.
    The file name carries the version (libgomp.so.1.0.0, libopenblas64_p-r0-...-0.3.23.so),
    the size tells two builds of one version apart. Never raises: it runs while the trace
    is being closed."""
    try:
        return _native_libraries(maps)
    except Exception as exc:  # never lose a trace over its manifest
        return {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}


def _native_libraries(maps):
    paths = set()
    try:
        with open(maps, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
                    paths.add(parts[5].strip())
    except OSError:
        pass
    preload = [p for p in re.split(r"[:\s]+", os.environ.get("LD_PRELOAD", "")) if p]
    out = numpy_blas()
    for path in sorted(paths) + preload:
        name = os.path.basename(path)
        if path not in preload and not NUMERIC_LIBRARY.search(name):
            continue
        try:
            real = os.path.realpath(path)
            desc = f"{os.path.basename(real)}, {os.path.getsize(real)} bytes"
        except OSError:
            desc = f"{name}, not found"
        key = _library_key(name)
        if out.get(key, desc) != desc:   # two builds of one library: keep both
            key = f"{key} ({name})"
        out[key] = desc
    return out


def numpy_blas():
    """{"numpy-blas": "name version", "numpy-lapack": ...} from numpy's build config."""
    np = sys.modules.get("numpy")
    deps = (getattr(getattr(np, "__config__", None), "CONFIG", None) or {}).get(
        "Build Dependencies") or {}
    out = {}
    for kind in ("blas", "lapack"):
        d = deps.get(kind)
        if isinstance(d, dict) and d.get("name"):
            out[f"numpy-{kind}"] = f"{d['name']} {d.get('version') or ''}".strip()
    return out


_TORCH_BUILD = (("mkl", r"Math Kernel Library Version ([^\n]+?) for"),
                ("onednn", r"MKL-DNN (v[0-9][^ \n]*)"),
                ("openmp", r"OpenMP ([0-9]+)"),
                ("blas", r"BLAS_INFO=([^,\s]+)"),
                ("lapack", r"LAPACK_INFO=([^,\s]+)"),
                ("cudnn", r"CuDNN ([0-9][^ \n]*)"),
                ("cuda", r"CUDA Runtime ([0-9][^ \n]*)"))


def torch_build_libraries(config_text):
    """The numeric libraries built into torch (MKL and oneDNN are linked statically, so
    they are not among the mapped files) with their versions, from `torch.__config__.show()`."""
    out = {}
    for name, rx in _TORCH_BUILD:
        m = re.search(rx, config_text or "")
        if m:
            out[name] = m.group(1).strip()
    return out


def dispatcher_overrides(torch):
    """{"aten::op[.overload]": "KEY kernel registered at FILE:LINE"} for the aten ops that
    have a kernel registered from Python outside torch's own package (a `torch.library`
    `impl` in a sitecustomize, a plugin): they replace the library's kernel for that
    dispatch key. Best effort: {} when this torch does not expose its registrations."""
    impls = getattr(getattr(torch, "library", None), "_impls", None)
    if not impls:
        return {}
    own = os.path.dirname(os.path.abspath(torch.__file__))
    out = {}
    for entry in sorted(impls):
        ns, _, rest = str(entry).partition("/")
        op, _, key = rest.rpartition("/")
        if ns != "aten" or not op or key == "Meta":
            continue
        try:
            dump = torch._C._dispatch_dump(f"aten::{op}")
        except Exception:
            continue
        for line in dump.splitlines():
            m = re.match(rf"{re.escape(key)}: registered at (.*?):(\d+) ::", line)
            if not m:
                continue
            path = m.group(1)
            if os.path.abspath(path).startswith(own + os.sep):
                break   # torch's own Python kernel
            out[f"aten::{op}"] = f"{key} kernel registered at {path}:{m.group(2)}"
            break
    return out


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
        "startup": startup_hooks(),
        "threads": {"cpu_count": os.cpu_count(),
                    "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None},
        "recording": dict(recording or {}),
        "pid": os.getpid(),
    }
    if script is not None:
        m["script"] = {"path": os.path.abspath(script), "name": os.path.basename(script),
                       "sha256": file_sha256(script), "argv": list(argv or [])}
    return m


def capture_losses(frameworks) -> list:
    """What a recording lost, one sentence each, from the manifest's `frameworks` section
    (a recorder that stopped: `recording_error`; values recorded without their bytes
    because a tensor subclass could not be read: `subclasses.unreadable_values`; settings
    and keys that could not be formatted: `skipped_settings`, `skipped_names`). `record`
    prints them as warnings and `info` shows them; the strings may come from an untrusted
    trace: the caller escapes them."""
    out = []
    if not isinstance(frameworks, dict):
        return out
    for fw in ("jax", "torch"):
        m = frameworks.get(fw)
        if not isinstance(m, dict):
            continue
        if m.get("recording_error"):
            out.append(f"{fw} capture STOPPED at event {m.get('recording_stopped_at_event')}: "
                       f"{str(m['recording_error'])[:200]}; nothing the script ran after it is "
                       f"in the trace")
        subst = m.get("substituted")
        if isinstance(subst, dict):   # confirm's counterfactual run (capture/torch/substitute.py)
            out.append(f"{subst.get('substituted')} {fw} events of {subst.get('events')} hold "
                       f"another run's values, substituted by tracediff confirm: what the "
                       f"script saw, not what those ops computed")
        sub = m.get("subclasses")
        n = sub.get("unreadable_values") if isinstance(sub, dict) else None
        if isinstance(n, int) and n > 0:
            types = sub.get("unreadable_types")
            names = ", ".join(str(k) for k in list(types)[:5]) if isinstance(types, dict) else ""
            out.append(f"{n} {fw} value{'s' if n != 1 else ''} of tensor subclasses "
                       f"({names or 'unknown'}) recorded without their bytes (metadata only): "
                       f"they are not compared")
        out += _skipped(fw, m)
    return out


def _skipped(fw, m):
    """What a capture skipped because it could not read or format it (capture/skipped.py:
    an optimizer setting whose repr raises, a module key that is not a str)."""
    out = []
    for key, what, became in (("skipped_settings", "optimizer setting", "left out of the trace"),
                              ("skipped_names", "module or parameter key",
                               "named by type")):
        got = m.get(key)
        n = got.get("count") if isinstance(got, dict) else None
        if not isinstance(n, int) or n <= 0:
            continue
        first = got.get("first")
        shown = ", ".join(str(x)[:120] for x in first[:3]) if isinstance(first, list) else ""
        out.append(f"{n} {fw} {what}{'s' if n != 1 else ''} could not be read or formatted: "
                   f"{became} ({shown or 'unknown'}; the manifest's {key})")
    return out
