"""Differences between the environment manifests of two traces, most relevant first."""

import re

# Manifest keys that are not differences worth listing (they always differ).
IGNORED = {"created", "pid", "python.executable", "script.path", "script.argv.0",
           "recording.tool", "end.duration_s", "end.wall_s", "end.elapsed_s", "duration_s"}
IGNORED_PREFIX = ("end.", "counts.", "stats.")

CATEGORY_OF_TOP = {"packages": "package", "cpu": "cpu", "env": "env", "jax": "jax-config",
                   "torch": "torch-config", "threads": "threads", "python": "python",
                   "os": "os", "hostname": "host", "script": "script", "recording": "recording",
                   "tracediff_version": "package"}
RANK = {"package": 0, "cpu": 1, "env": 2, "jax-config": 3, "torch-config": 3, "threads": 4,
        "python": 5, "os": 6, "recording": 7, "script": 8, "other": 8, "host": 9}

# within a category, keys matching this rank first (numerically relevant)
_HOT = re.compile(r"(jax|jaxlib|torch|numpy|mkl|openblas|xla|x64|precision|tf32|matmul|"
                  r"deterministic|flush|denormal|fast_math|threads|OMP_|MKL_|XLA_FLAGS|model)",
                  re.IGNORECASE)
_NUMERIC_ISA = re.compile(r"^(avx|fma|sse|amx|f16c|ssse|neon|asimd|sve|fp16|bf16|vnni|"
                          r"avx512|fphp|asimdhp|fcma|frint)")


def _flatten(obj, prefix="", out=None):
    out = {} if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v:
                _flatten(v, key + ".", out)
            else:
                out[key] = v
    else:
        out[prefix.rstrip(".")] = obj
    return out


def _category(key):
    top = key.split(".", 1)[0]
    return CATEGORY_OF_TOP.get(top, "other")


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


def env_diff(ma, mb):
    """List of {key, category, a, b}, numerically relevant first. Hostname is kept as
    informative (last); timestamps and pids are never listed."""
    fa, fb = _flatten(ma or {}), _flatten(mb or {})
    out = []
    for key in sorted(set(fa) | set(fb)):
        if key in IGNORED or key.startswith(IGNORED_PREFIX) or key.startswith("cpu.isa_flags"):
            continue
        va, vb = fa.get(key), fb.get(key)
        if va == vb:
            continue
        out.append({"key": key, "category": _category(key), "a": va, "b": vb})
    ia, ib = (ma or {}).get("cpu", {}).get("isa_flags"), (mb or {}).get("cpu", {}).get("isa_flags")
    if isinstance(ia, list) and isinstance(ib, list) and set(ia) != set(ib):
        out.append(_isa_entry(ia, ib))

    def rank(e):
        cat = RANK.get(e["category"], 8)
        hot = 0 if (_HOT.search(e["key"]) or e["key"] == "cpu.isa_flags") else 1
        return (cat, hot, e["key"])

    out.sort(key=rank)
    return out
