"""The settings that differ between two traces and that a re-run can set from outside the
script: numeric environment variables (`ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`, thread
counts, `JAX_DEFAULT_MATMUL_PRECISION`), each XLA flag on its own, and the script's own
arguments. `confirm` re-runs one side with each set as on the other side.

The values come from a trace, so only what cannot run code is ever set: variables that
decide which code or libraries load (`LD_PRELOAD`, `PYTHONPATH`), name files or folders
(a cache, a dump directory) or hold control characters are listed as differing but are
never set (`Unsettable`); an XLA flag whose value is a path likewise.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Optional

from ...shell import script_argv
from ...untrusted import is_env_name

# variables whose value changes how a kernel computes or how many threads it uses
_NUMERIC = re.compile(r"^(ATEN_|ONEDNN_|DNNL_|OMP_|MKL_|OPENBLAS_|KMP_|BLIS_|GOTO|VECLIB_|"
                      r"JAX_|XLA_FLAGS$|TORCH_|PYTORCH_|PYTHONHASHSEED$|NPROC)")
# ... except those that name files, folders or caches, or load code
_NOT_NUMERIC = re.compile(r"(DIR|PATH|FILE|CACHE|PRELOAD|LIBRARY|PLUGIN|HOOK|LOG|DUMP|TRACE)",
                          re.I)
_SAFE_VALUE = re.compile(r"^[\w.,:=+\- ]{0,400}$")   # no quote, slash, $, ; or control char
_FLAG_NAME = re.compile(r"^--?([A-Za-z0-9_]+)")


@dataclass
class Setting:
    """One setting that differs and can be set for a re-run: `kind` "env", "xla_flag" or
    "argv"; `name` the variable, the flag or "script arguments"; the two values as recorded
    (None: not set on that side); `keys` the manifest keys it explains (a source's causes)."""

    kind: str
    name: str
    a: Optional[str]
    b: Optional[str]
    keys: tuple = ()

    @property
    def label(self) -> str:
        if self.kind == "xla_flag":
            return f"XLA flag --{self.name}"
        return self.name


@dataclass
class Unsettable:
    """A difference that a re-run here does not set, and why."""

    key: str
    why: str


def env_of(manifest) -> dict:
    env = (manifest or {}).get("env")
    return {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(env, dict) else {}


def settable_env(key, value) -> bool:
    """May a re-run set variable `key` to `value` (taken from a trace)?"""
    return (is_env_name(key) and bool(_NUMERIC.match(key)) and not _NOT_NUMERIC.search(key)
            and (value is None or bool(_SAFE_VALUE.match(value))))


def xla_flags(text) -> dict:
    """{flag name: its word} of an XLA_FLAGS value ("--xla_cpu_max_isa=SSE4_2")."""
    try:
        words = shlex.split(text or "")
    except ValueError:
        words = (text or "").split()
    out = {}
    for w in words:
        m = _FLAG_NAME.match(w)
        if m:
            out[m.group(1)] = w
    return out


def _safe_flag(word) -> bool:
    return word is None or ("/" not in word and bool(_SAFE_VALUE.match(word))
                            and not _NOT_NUMERIC.search(word.split("=", 1)[0]))


def differing(ma, mb) -> tuple:
    """([Setting], [Unsettable]) between manifests a and b."""
    ea, eb = env_of(ma), env_of(mb)
    settings, unsettable = [], []
    for key in sorted(set(ea) | set(eb)):
        va, vb = ea.get(key), eb.get(key)
        if va == vb:
            continue
        if key == "XLA_FLAGS":
            fa, fb = xla_flags(va), xla_flags(vb)
            for name in sorted(set(fa) | set(fb)):
                wa, wb = fa.get(name), fb.get(name)
                if wa == wb:
                    continue
                if _safe_flag(wa) and _safe_flag(wb):
                    settings.append(Setting("xla_flag", name, wa, wb, ("env.XLA_FLAGS",)))
                else:
                    unsettable.append(Unsettable(f"XLA flag --{name}", "its value names a "
                                                 "file or folder: set it yourself"))
        elif settable_env(key, va) and settable_env(key, vb):
            settings.append(Setting("env", key, va, vb, (f"env.{key}",)))
        else:
            unsettable.append(Unsettable(f"env.{key}", "it decides which code or files a run "
                                         "loads or writes: set it yourself"))
    aa, ab = script_argv(ma), script_argv(mb)
    if aa is not None and ab is not None and aa[1:] != ab[1:]:
        settings.append(Setting("argv", "script arguments", shlex.join(aa[1:]),
                                shlex.join(ab[1:]), ("script.argv",)))
    return settings, unsettable


def swapped(s: Setting) -> Setting:
    """The same setting seen from the other side (b's value becomes the one set)."""
    return Setting(s.kind, s.name, s.b, s.a, s.keys)


def environment_for(base_env: dict, side_env: dict, revert=()) -> tuple:
    """(unset, assign) for a re-run: every numeric variable as on the side (`side_env`),
    except the settings in `revert`, set to their `a` value; the numeric variables of this
    shell that the side did not set are unset (they were not set when it was recorded)."""
    want = {k: v for k, v in side_env.items() if k != "XLA_FLAGS" and settable_env(k, v)}
    for s in revert:
        if s.kind == "env":
            want.pop(s.name, None)
            if s.a is not None:
                want[s.name] = s.a
    # XLA_FLAGS: the side's flags, those naming files left out, the reverted ones as on a
    words = {k: w for k, w in xla_flags(side_env.get("XLA_FLAGS")).items() if _safe_flag(w)}
    for s in revert:
        if s.kind == "xla_flag":
            words.pop(s.name, None)
            if s.a is not None:
                words[s.name] = s.a
    if words:
        want["XLA_FLAGS"] = " ".join(words.values())
    unset = sorted(k for k in base_env if settable_env(k, None) and k not in want)
    assign = {k: v for k, v in sorted(want.items()) if base_env.get(k) != v}
    return unset, assign


__all__ = ["Setting", "Unsettable", "differing", "environment_for", "swapped", "env_of",
           "settable_env", "xla_flags"]
