"""Differences between the environment manifests of two traces, most relevant first."""

import re

# Manifest keys that are not differences worth listing: they always differ, or they say
# where (and whether) compiled code is cached — a compilation cache is keyed by the
# compiler's version, flags and program, so it changes how long a run takes, not its numbers.
IGNORED = {"created", "pid", "python.executable", "script.path", "script.argv.0",
           "recording.tool", "end.duration_s", "end.wall_s", "end.elapsed_s", "duration_s",
           "env.TORCHINDUCTOR_CACHE_DIR", "env.TRITON_CACHE_DIR",
           "env.JAX_COMPILATION_CACHE_DIR", "env.JAX_ENABLE_COMPILATION_CACHE",
           "env.JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
           "env.JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "env.TRACEDIFF_XLA_CACHE"}
IGNORED_PREFIX = ("end.", "counts.", "stats.", "frameworks.jax.replay_vs_compiled.",
                  "frameworks.jax.probe.", "frameworks.torch.compile.stats.",
                  "frameworks.jax.program_cache.", "frameworks.jax.digests_on_device.groups.",
                  # what a capture could not format (capture/skipped.py): the recording's
                  "frameworks.torch.skipped_settings.", "frameworks.torch.skipped_names.",
                  "frameworks.jax.skipped_settings.")
# leaf names that are recording statistics or notes, not environment
IGNORED_LEAF = {"calls", "calls_not_replayed", "eager_primitives", "equations", "optimizer_steps",
                "replay_errors", "ops", "input_snapshots", "mode", "supported", "threads_note",
                "compile", "events", "bytes_recorded", "captured", "loops", "producer_fallbacks",
                "missed", "captured_late", "regions", "regions_truncated"}

CATEGORY_OF_TOP = {"packages": "package", "cpu": "cpu", "env": "env", "jax": "jax-config",
                   "torch": "torch-config", "threads": "threads", "python": "python",
                   "os": "os", "hostname": "host", "script": "script", "recording": "recording",
                   "tracediff_version": "package", "startup": "startup",
                   "libraries": "library"}
# kernel-override: an op whose kernel was replaced from Python (torch.library) on one side;
# startup: sitecustomize/usercustomize; library: the native numeric libraries loaded
# device: the accelerator's numerics (backend, device kind, default matmul precision),
# shown first: a TPU-vs-CPU difference is about them before any host CPU key or TPU_* variable
DEVICE_KEYS = ("frameworks.jax.backend", "frameworks.jax.device_kind",
               "frameworks.jax.jax_default_matmul_precision")
RANK = {"device": -1, "kernel-override": 0, "package": 0, "startup": 1, "library": 1, "cpu": 1, "env": 2,
        "jax-config": 3, "torch-config": 3, "threads": 4, "python": 5, "os": 6, "recording": 7,
        "script": 8, "other": 8, "host": 9}

# within a category, keys matching this rank first (numerically relevant)
_HOT = re.compile(r"(jax|jaxlib|torch|numpy|mkl|openblas|xla|x64|precision|tf32|matmul|"
                  r"deterministic|flush|denormal|fast_math|threads|OMP_|MKL_|XLA_FLAGS|model|autocast|"
                  r"PYTHONPATH|LD_PRELOAD|LD_LIBRARY_PATH|blas|lapack|onednn)",
                  re.IGNORECASE)
_NUMERIC_ISA = re.compile(r"^(avx|fma|sse|amx|f16c|ssse|neon|asimd|sve|fp16|bf16|vnni|"
                          r"avx512|fphp|asimdhp|fcma|frint)")


def _flatten(obj, prefix="", out=None):
    out = {} if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                _flatten(v, key + ".", out)   # an empty section adds nothing
            else:
                out[key] = v
    else:
        out[prefix.rstrip(".")] = obj
    return out


def _compile_summary(c):
    calls = c.get("torch_compile_calls") or []
    if not isinstance(calls, list) or not calls:
        return "not used"
    return "; ".join(f"{x.get('backend')} (mode {x.get('mode')}, dynamic {x.get('dynamic')})"
                     if isinstance(x, dict) else str(x) for x in calls[:4])


def _category(key):
    if key in DEVICE_KEYS:
        return "device"
    parts = key.split(".")
    if parts[0] == "frameworks" and len(parts) > 2 and parts[2] == "python_kernels":
        return "kernel-override"
    if parts[0] == "frameworks" and len(parts) > 2 and parts[2] == "libraries":
        return "library"
    if parts[0] == "frameworks" and len(parts) > 1:
        return {"jax": "jax-config", "torch": "torch-config"}.get(parts[1], "other")
    if key.startswith(("threads.", "env.OMP_", "env.MKL_")) or key.endswith("_threads"):
        return "threads" if not key.startswith("env.") else "env"
    return CATEGORY_OF_TOP.get(parts[0], "other")


def _isa_entry(a, b):
    sa, sb = set(a or []), set(b or [])
    only_a, only_b = sorted(sa - sb), sorted(sb - sa)
    numeric_a = [f for f in only_a if _NUMERIC_ISA.match(f)]
    numeric_b = [f for f in only_b if _NUMERIC_ISA.match(f)]

    def summary(flags, numeric):
        if not flags:
            return "(none extra)"
        shown = numeric + [f for f in flags if f not in numeric]
        text = " ".join(shown[:12])
        return text + (f" ... (+{len(shown) - 12} more)" if len(shown) > 12 else "")

    return {"key": "cpu.isa_flags", "category": "cpu",
            "a": f"{len(sa)} flags; only here: {summary(only_a, numeric_a)}",
            "b": f"{len(sb)} flags; only here: {summary(only_b, numeric_b)}",
            "only_in_a": only_a, "only_in_b": only_b,
            "numeric_only_in_a": numeric_a, "numeric_only_in_b": numeric_b}


def _extension_module(desc):
    """True for a Python extension module (`_decomp_update.cpython-311-x86_64-linux-gnu.so`,
    scipy's, loaded by an import on one side): a module the script imported, not a native
    library the recorded ops call (those are listed by their own names: libscipy_openblas)."""
    return isinstance(desc, str) and re.search(r"\.(cpython-\d+|abi3|pypy\d*)[-.]", desc) is not None


def env_diff(ma, mb):
    """List of {key, category, a, b}, numerically relevant first. Hostname is kept as
    informative (last); timestamps and pids are never listed."""
    ma, mb = dict(ma or {}), dict(mb or {})
    out = []
    # a framework used on one side only: one line, not one per setting
    fwa, fwb = dict(ma.get("frameworks") or {}), dict(mb.get("frameworks") or {})
    for fw in sorted((set(fwa) | set(fwb)) - {"captured", "missed", "captured_late"}):
        if (fw in fwa) != (fw in fwb):
            section = fwa.get(fw) if fw in fwa else fwb.get(fw)
            ver = section.get("version", "") if isinstance(section, dict) else ""
            out.append({"key": f"frameworks.{fw}", "category": f"{fw}-config",
                        "a": f"{fw} {ver}".strip() if fw in fwa else None,
                        "b": f"{fw} {ver}".strip() if fw in fwb else None})
            fwa.pop(fw, None)
            fwb.pop(fw, None)
    # torch.compile used on one side only: one line, not one per compiler setting
    ca, cb = ((fwa.get("torch") or {}).get("compile")), ((fwb.get("torch") or {}).get("compile"))
    if isinstance(ca, dict) and isinstance(cb, dict) and \
            bool(ca.get("torch_compile_calls")) != bool(cb.get("torch_compile_calls")):
        out.append({"key": "frameworks.torch.compile", "category": "torch-config",
                    "a": _compile_summary(ca), "b": _compile_summary(cb)})
        for fw in (fwa, fwb):
            fw["torch"] = {k: v for k, v in fw["torch"].items() if k != "compile"}
    if "frameworks" in ma:
        ma["frameworks"] = fwa
    if "frameworks" in mb:
        mb["frameworks"] = fwb
    fa, fb = _flatten(ma), _flatten(mb)
    # traces of different frameworks (a Flax model and its torch port): each framework
    # loads native libraries of its own (libtorch, libjax, scipy's); one loaded on one side
    # only computes nothing on the other, so it is no environment difference between them;
    # nor is an extension module one side imported (scipy.linalg's, through a library)
    ca, cb = fwa.get("captured"), fwb.get("captured")
    own_libraries = isinstance(ca, list) and isinstance(cb, list) and set(map(str, ca)) != \
        set(map(str, cb))
    for key in sorted(set(fa) | set(fb)):
        if key in IGNORED or key.startswith(IGNORED_PREFIX) or key.startswith("cpu.isa_flags"):
            continue
        if key.rsplit(".", 1)[-1] in IGNORED_LEAF:
            continue
        if key.startswith("libraries.") and (key in fa) != (key in fb) and \
                (own_libraries or _extension_module(fa.get(key, fb.get(key)))):
            continue
        va, vb = fa.get(key), fb.get(key)
        if va == vb:
            continue
        out.append({"key": key, "category": _category(key), "a": va, "b": vb})
    ia, ib = (ma or {}).get("cpu", {}).get("isa_flags"), (mb or {}).get("cpu", {}).get("isa_flags")
    if isinstance(ia, list) and isinstance(ib, list) and set(ia) != set(ib):
        out.append(_isa_entry(ia, ib))

    def rank(e):
        if e["category"] == "device":   # in DEVICE_KEYS' order
            return (RANK["device"], DEVICE_KEYS.index(e["key"]), e["key"])
        cat = RANK.get(e["category"], 8)
        hot = 0 if (_HOT.search(e["key"]) or e["key"] == "cpu.isa_flags") else 1
        return (cat, hot, e["key"])

    out.sort(key=rank)
    return out
