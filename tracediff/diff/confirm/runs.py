"""The counterfactual runs of `confirm`: side b's script re-recorded on this machine with
settings set as on side a, each run one command line that is printed exactly as it is run
(`env -u KEY KEY=value python -m tracediff record ...`), run in parallel where the cores
allow.

Only the script the traces name is run, and only where the file there is the one both
traces recorded (its sha256): a trace chooses no other code. The variables set are the
numeric settings of `settings.py`, never one that loads code or names a file.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ... import shell
from ...errors import TraceError
from ...trace.manifest import file_sha256
from ...untrusted import printable, shell_word
from . import settings as _settings


@dataclass
class RunSpec:
    name: str
    reverted: list                # [Setting] set as on a
    alone: str = ""
    words: list = field(default_factory=list)
    trace: str = ""


def script_of(ma, mb) -> str:
    """The path of b's script, checked: it exists here and its content is what both traces
    recorded. A clear error otherwise (confirm runs nothing else)."""
    script = (mb or {}).get("script") if isinstance(mb, dict) else None
    path = script.get("path") if isinstance(script, dict) else None
    sha = script.get("sha256") if isinstance(script, dict) else None
    if not isinstance(path, str) or not isinstance(sha, str):
        raise TraceError("trace b names no script (recorded with tracediff.record() in a "
                         "notebook?): confirm re-runs a script recorded with tracediff record")
    sa = ((ma or {}).get("script") or {}).get("sha256") if isinstance(ma, dict) else None
    if sa != sha:
        raise TraceError(f"the two traces ran different scripts (sha256 {str(sa)[:12]} vs "
                         f"{sha[:12]}): confirm changes one setting at a time, the script "
                         f"must be the same")
    if not os.path.isfile(path):
        raise TraceError(f"{shell_word(path)}: the script the traces ran is not here; "
                         f"run confirm on a machine that has it at that path")
    if file_sha256(path) != sha:
        raise TraceError(f"{shell_word(path)} has changed since it was recorded "
                         f"(sha256 differs): confirm runs only the script the traces ran")
    return path


def env_words(side_env, revert=()) -> list:
    """`env -u KEY ... KEY=value ...`: the words that give a command the side's numeric
    settings, those in `revert` as on a (`settings.environment_for`)."""
    unset, assign = _settings.environment_for(dict(os.environ), side_env, revert)
    words = ["env"]
    for k in unset:
        words += ["-u", k]
    return words + [f"{k}={v}" for k, v in assign.items()]


def plan(ma, mb, found, script, folder, level="full", max_runs=16) -> tuple:
    """([RunSpec], left out): b as recorded; b without each setting; with two or more
    settings, each setting alone and b with every setting as on a."""
    specs = [RunSpec("b as recorded", [])]
    specs += [RunSpec(f"without {s.label}", [s]) for s in found]
    if len(found) > 1:
        specs += [RunSpec(f"{s.label} alone", [o for o in found if o is not s], alone=s.label)
                  for s in found]
        specs.append(RunSpec("every setting as on a", list(found)))
    kept, left = specs[:max(1, max_runs)], max(0, len(specs) - max(1, max_runs))
    env_b = _settings.env_of(mb)
    argv_a, argv_b = shell.script_argv(ma) or [script], shell.script_argv(mb) or [script]
    for i, spec in enumerate(kept):
        spec.trace = os.path.join(folder, f"run{i}.h5")
        argv = argv_a if any(s.kind == "argv" for s in spec.reverted) else argv_b
        words = env_words(env_b, spec.reverted) + [
            sys.executable, "-m", "tracediff", "record", "--level", level, "-o", spec.trace,
            script, *argv[1:]]
        if any(printable(w) != w for w in words):
            raise TraceError("the recorded command line holds control characters: confirm "
                             "runs only what it can print exactly")
        spec.words = words
    return kept, left


def command_line(spec) -> str:
    """The line printed for a run: the words it runs, each quoted."""
    return shell.command(*spec.words)


def default_jobs() -> int:
    """Processes at once: half the cores, at most 4, at least 1."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def execute(specs, jobs=None, progress=None) -> list:
    """[(exit code, seconds, error)] of each run, in order; runs in parallel (`jobs`,
    default `default_jobs()`)."""
    jobs = jobs or default_jobs()
    done = [0]

    def one(spec):
        log = spec.trace[:-3] + ".log"
        t0 = time.perf_counter()
        with open(log, "wb") as out:
            try:
                rc = subprocess.run(spec.words, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL).returncode
                err = "" if rc == 0 else f"exit code {rc} (see {log})"
            except OSError as exc:
                rc, err = None, f"could not start: {exc}"
        done[0] += 1
        if progress:
            progress("counterfactual runs", done[0], len(specs))
        return rc, time.perf_counter() - t0, err

    if progress:
        progress("counterfactual runs", 0, len(specs))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, specs))


__all__ = ["RunSpec", "script_of", "env_words", "default_jobs", "plan", "execute", "command_line"]
