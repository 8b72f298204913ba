"""What the Markdown and HTML reports know beyond the result: a `ReportContext`.

Both take the `LocateResult` of `locate()` itself (the same object the terminal and the
JSON render) and a `ReportContext` (`report_context(result)`): what only the trace files
and this machine know: file sizes, the commands that reproduce the comparison (each run's
command line and the environment variables that differ), and the user's source lines
around the culprit as the trace recorded them (a local file only with `--source-dir`, see
source_context.py). Sections for what a result may carry (`explain`: the replay verdict,
`chain`: origin to outputs) appear when it carries them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from ..diff.compare import levels
from ..diff.result import LocateResult
from .findings import culprit
from .source_context import source_context

GITHUB_ATTACH_LIMIT = 25 << 20


@dataclasses.dataclass
class TraceFile:
    """What a report says about one trace file beyond the result: its size, and how the
    run was started (for the reproduction commands)."""

    path: str
    size: Optional[int] = None
    argv: object = None          # the script's command line as recorded (untrusted)
    env: dict = dataclasses.field(default_factory=dict)
    tool: Optional[str] = None
    end: object = None
    world_size: Optional[int] = None   # ranks of a torchrun job (manifest `distributed`)
    processes: Optional[tuple] = None  # jax.distributed: (count, [(id, argv)]) (levels.jax_processes)


@dataclasses.dataclass
class ReportContext:
    """What only the trace files and this machine know (`report_context`)."""

    traces: dict                 # {"a": TraceFile, "b": TraceFile}
    source: Optional[dict] = None    # `source_context` of the culprit's line
    commands: list = dataclasses.field(default_factory=list)   # reproduce the comparison
    attach_ok: bool = True       # both files fit a GitHub attachment


def _trace_context(path, source=None):
    """(TraceFile, manifest, recorded lines around `source` or None) of one trace."""
    from ..trace.reader import Trace

    info = TraceFile(path=path)
    try:
        info.size = os.path.getsize(path)
    except OSError:
        pass
    recorded = None
    try:
        with Trace(path) as t:
            m = t.manifest
            if source:
                recorded = t.source_lines(source)
    except Exception:  # a report never fails over context it cannot read
        return info, {}, None
    info.argv = (m.get("script") or {}).get("argv")
    info.env = m.get("env") or {}
    info.tool = (m.get("recording") or {}).get("tool")
    info.end = m.get("end")
    dist = m.get("distributed") or {}
    n = dist.get("world_size")
    if dist.get("launcher") == "torchrun" and isinstance(n, int) and \
            not isinstance(n, bool) and 1 < n <= 1 << 20:
        info.world_size = n
    else:   # one process of a jax.distributed run: every process's own command line
        procs = levels.jax_processes(m, path)
        if procs is not None:
            info.processes = (m["distributed"]["process_count"], procs)
    return info, m, recorded


def reproduction(result: LocateResult, traces: dict) -> list:
    """Shell commands that reproduce the comparison (record both runs, locate); lines made
    by `tracediff.shell`, so no string from the traces can add a command."""
    from .. import shell

    cmds = []
    names = {}
    env_a, env_b = traces["a"].env, traces["b"].env
    for side, mine, other in (("a", env_a, env_b), ("b", env_b, env_a)):
        c = traces[side]
        name = os.path.basename(result.traces[side].path)
        if side == "b" and name == names.get("a"):
            name = "b_" + name
        names[side] = name
        argv = shell.script_argv({"script": {"argv": c.argv}})
        if not argv:
            cmds.append(shell.comment(f"{side}: recorded with {c.tool or 'tracediff'} "
                                      f"(no script command line)"))
            continue
        if c.world_size or c.processes:   # one rank of several: every rank into a folder
            name = names[side] = f"run_{side}/"
        if c.processes:   # jax.distributed: each process started with its id, together
            cmds += _process_commands(c.processes, name, shell.env_differences(mine, other))
            continue
        cmds += shell.record_command([os.path.basename(argv[0]), *argv[1:]], name,
                                     shell.env_differences(mine, other),
                                     nproc=c.world_size)
    cmds.append(shell.command("tracediff", "locate", names["a"], names["b"]))
    f, _ = culprit(result)
    if f is not None:
        shown = names["a"]
        if shown.endswith("/") and f.a.rank is not None:
            shown = f"{shown}rank{f.a.rank}.h5"
        cmds.append(shell.command("tracediff", "show", shown, f.a.index))
    return cmds


def _process_commands(processes, name, env):
    """The `record` lines of every process of a jax.distributed run (levels.jax_processes),
    started together into folder `name`; a note when a process's command line is unknown."""
    from .. import shell

    n, processes = processes
    lines = [shell.comment("a jax.distributed run: start every process together, each with "
                           "its own process id and command line (one alone blocks at "
                           "initialize)")]
    if len(processes) < n or any(argv is None for _, argv in processes):
        lines.append(shell.comment("the command line of some process is not known here: run "
                                   "the matching command of every process (its trace's "
                                   "manifest has it)"))
    for k, argv in processes:
        if not argv:
            continue
        *notes, cmd = shell.record_command([os.path.basename(argv[0]), *argv[1:]], name,
                                           dict(env, **levels.process_env(k, n)))
        lines += notes + [cmd + " &"]
    lines.append("wait")
    return lines


def report_context(result: LocateResult, source_dir: Optional[str] = None) -> ReportContext:
    """The `ReportContext` of a result (see the module docstring); code context from trace
    a's recorded lines, or from `source_dir` (`--source-dir`)."""
    f, _ = culprit(result)
    src = f.a.source if f is not None and f.a.source else None
    files = {}
    for s in ("a", "b"):
        files[s] = _trace_context(result.traces[s].path, src if s == "a" else None)
    ctx = ReportContext(traces={s: files[s][0] for s in ("a", "b")})
    if src:
        _, manifest, recorded = files["a"]
        ctx.source = source_context(src, recorded, source_dir, manifest)
    ctx.commands = reproduction(result, ctx.traces)
    ctx.attach_ok = all((ctx.traces[s].size or 0) <= GITHUB_ATTACH_LIMIT for s in ("a", "b"))
    return ctx
