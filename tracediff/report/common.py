"""What the Markdown and HTML reports share: the typed result, a report context, and
the helpers both render it with.

Both take the `LocateResult` of `locate()` itself (the same object the terminal and the
JSON render) and a `ReportContext` (`report_context(result)`): what only the trace files
and this machine know: file sizes, the commands that reproduce the comparison (each run's
command line and the environment variables that differ), and the user's source lines
around the culprit as the trace recorded them (a local file only with `--source-dir`, see
`source_context`). Sections for what a result may carry (`explain`: the replay verdict,
`chain`: origin to outputs) appear when it carries them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional

from ..diff.compare.args import text as args_text
from ..diff.result import EventRef, Finding, Gap, LocateResult, Replay
from ..diff.explain.mechanisms.summary import FAR_ULP
from ..diff.explain.verdict import meaningful_ulp
from ..diff.compare import levels
from ..trace import sources
from ..trace.sources import parse_source
from ..untrusted import md_code, md_text

GITHUB_ATTACH_LIMIT = 25 << 20


def typed(obj, cls, optional=False):
    """`obj` when it is a `cls` (or None with `optional`); TypeError otherwise: renderers
    take the typed result, never its JSON (`json_report.build`) or another dict."""
    if isinstance(obj, cls) or (optional and obj is None):
        return obj
    raise TypeError(f"expected a {cls.__name__}{' or None' if optional else ''} (as "
                    f"tracediff.locate() returns), got {type(obj).__name__}")


def fmt(x, digits=3):
    """A number as a short human string ('-' for None)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10000 else str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
        if x == 0:
            return "0"
        if x.is_integer() and abs(x) < 1e15:
            return fmt(int(x))
        return f"{x:.{digits}g}"
    return str(x)


def ulp_cell(m, number=None) -> str:
    """A Metrics' max ULP as a reader should see it: the count where it means something
    (floating, finite, close values: `verdict.meaningful_ulp`), written by `number` (the
    renderer's own number format; `fmt` by default), else why it is left out."""
    if m is None or m.max_ulp is None:
        return "-"
    u = meaningful_ulp(m)
    if u is not None:
        return (number or fmt)(u)
    finite = all(x is None or math.isfinite(x) for x in (m.max_ulp, m.max_rel, m.max_abs))
    return "- (non-finite values)" if not finite else "- (values far apart; see rel)"


def worst_detail(step, f=fmt):
    """" (relative L2, max abs Y)" of an optimizer step's worst parameter (chosen by its
    own ||a-b|| / ||a||), "" when none was computed."""
    if step is None or step.worst_rel_l2 is None:
        return ""
    return f" ({f(step.worst_rel_l2)}, max abs {f(step.worst_max_abs)})"


def fmt_pct(x):
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "-"
    return f"{100 * x:.3g}%"


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"


def culprit(result: LocateResult) -> tuple:
    """(Finding, title) of what the report is about, or (None, None)."""
    if result.first_beyond_tolerance is not None:
        return result.first_beyond_tolerance, "First divergence beyond tolerance"
    if result.first_difference is not None:
        return result.first_difference, "First bitwise difference (within tolerance)"
    return None, None


def first_parameter_text(p, code=md_code, text=md_text) -> str:
    """One line for `LocateResult.first_parameter` (two frameworks: the first parameter
    whose grads, optimizer state or value after a step differs beyond tolerance), for the
    document formats; `code`/`text` escape the trace's strings for the format."""
    role = "after the step" if p.role == "params" else p.role
    up = "; its grads and optimizer state match" if p.role == "params" and p.upstream_match \
        else ""
    line = (f"step {fmt(p.step)}, {code(p.parameter)} ({text(role)}): a {code(p.a)} <-> b "
            f"{code(p.b)}; relative L2 {fmt(p.rel_l2)} (rtol {fmt(p.rtol)}), max abs "
            f"{fmt(p.max_abs)}{up}")
    return line + (f". {text(p.note)}" if p.note else "")


def event_label(e: EventRef, code=md_code, text=md_text) -> str:
    """'jax eqn `tanh`' style label of an event; `code` and `text` render trace strings
    for the output format (Markdown by default)."""
    origin = f" ({text(e.origin)})" if e.origin and e.origin != e.kind else ""
    return f"{text(e.framework)} {text(e.kind)}{origin} {code(e.op)}".strip()


def site(e) -> str:
    """An event's source as shown: "LIB ← USER" when the op ran inside library code (the
    library's line, called from the user's), USER otherwise (trace/sources.py)."""
    return sources.join_site(e.source, getattr(e, "lib_source", "") or None) or ""


def where(e: EventRef, code=md_code) -> str:
    """'step 0, event #375, `Controller/GRUCell_0`, `jax_gru.py:25`'."""
    parts = [f"step {e.step}", f"event #{e.index}"]
    if e.name_stack:
        parts.append(code(e.name_stack))
    if e.source:
        parts.append(code(site(e)))
    return ", ".join(parts)


def inputs_words(f: Finding) -> tuple:
    """(word, detail) on what a finding's inputs say of it, plain text: "introduced here"
    only where every input is bitwise equal; inputs that differ within tolerance give
    "adds X beyond what its inputs carry" where the op's own error (`local_error`, from
    the float64 replay on each side's inputs) accounts for at least half its output
    difference, else "inherited within tolerance"."""
    reason = f.inputs_reason or ""
    if f.inputs_match is True and f.inputs_bitwise is False:
        le = f.local_error
        if le and all(x is not None for x in le):
            local = f"local error a {fmt(le[0])} / b {fmt(le[1])}, max rel from float64 on " \
                    f"each side's own inputs"
            out = _metric(f, "max_rel")
            if out is not None and max(le) * 2 >= out:
                return (f"adds {fmt(max(le))} beyond what its inputs carry",
                        f"{local}; {reason}")
            return "inherited within tolerance", f"{reason}; {local}"
        return "inherited within tolerance", reason
    return {True: "introduced here", False: "inherited"}.get(f.inputs_match,
                                                               "inputs unknown"), reason


def finding_rows(f: Finding, code, text, strong) -> list:
    """The (label, cell) rows describing a finding, rendered with the caller's markup:
    `code` and `text` turn trace strings into safe cells of the output format, `strong`
    emphasises text that is already rendered."""
    a, b = f.a, f.b
    rows = [("dtype", text(f.dtype_note))] if f.dtype_note else []
    if a.rank is not None or b.rank is not None:   # a multi-process run: whose trace
        rk = text(a.rank if a.rank is not None else "-")
        if b.rank != a.rank:
            rk += f" (b: {text(b.rank if b.rank is not None else '-')})"
        rows.append(("rank", rk))
    if f.layer and f.layer.get("text"):   # two frameworks: the layer on both sides
        rows.append(("layer", code(f.layer["text"])))
    for label, field in (("name stack", "name_stack"), ("source", "source"),
                         ("device", "device")):
        va, vb = (site(a), site(b)) if field == "source" else (getattr(a, field), getattr(b, field))
        if va or (vb and field != "source"):   # a's, and b's where it differs
            cell = code(va or "-")
            if vb and vb != va:
                cell += f" (b: {code(vb)})"
            rows.append((label, cell))
    if f.device_note:
        rows.append(("devices", text(f.device_note)))
    if f.optimizer:   # an optimizer-internal op: its optimizer, state and leaf
        rows.append(("optimizer", text(f.optimizer)))
    if f.arguments:   # the op's non-tensor arguments that differ (diff/compare/args.py)
        rows.append(("arguments differ", code(args_text(f.arguments))))
    if b.op != a.op or b.framework != a.framework:
        rows.append(("paired with", f"{event_label(b, code, text)} in b "
                                    f"(by {text(f.pair_by)})"))
    shapes = ", ".join(f"{d}{list(s)}" for d, s in zip(a.dtypes, a.shapes))
    rows.append(("outputs", code(shapes or "-")))
    word, detail = inputs_words(f)
    rows.append(("inputs", f"{strong(word) if f.introduced else text(word)}: {text(detail)}"))
    if f.call is not None:
        c = f.call
        rows.append(("inside compiled call", f"{code(c.op)} (a #{text(c.a)}, b #{text(c.b)})"))
    if f.note:
        rows.append(("note", text(f.note)))
    return rows


def _metric(f, name):
    return getattr(f.metrics, name) if f.metrics is not None else None


def _ulp_words(f):
    u = meaningful_ulp(f.metrics)
    return f", max ULP {fmt(u)}" if u is not None else ""


def summary(result: LocateResult, code=md_code, text=md_text) -> str:
    """One paragraph; trace strings rendered by `code` and `text` (Markdown inline
    syntax by default)."""
    a, b = result.traces["a"], result.traces["b"]
    script = code(a.script) if a.script else "the script"
    script_b = b.script
    one = a.framework and b.framework and a.path == b.path
    runs = (f"The {text(a.framework)} and {text(b.framework)} sides of {script}" if one else
            f"Two runs of {script}" if not script_b or script_b == a.script else
            f"A run of {script} and a run of {code(script_b)}")
    hosts = ""
    if a.hostname and b.hostname and a.hostname != b.hostname:
        hosts = f" (on {code(a.hostname)} and {code(b.hostname)})"
    f, _ = culprit(result)
    tol_txt = ("the per-dtype default tolerances" if _default_tolerance(result) else
               f"rtol {fmt(result.tolerance.get('rtol'))}, atol {fmt(result.tolerance.get('atol'))}")
    out = []
    st = result.structural
    subject = f"{runs}{hosts}"
    if st is not None:   # an op only one run has, before any value differs
        other = "a" if st.side == "b" else "b"
        feeds = ", ".join(code(c.op) for c in st.consumers[:3])
        out.append(f"{subject} diverge in structure: the run recorded as {st.side} executed "
                   f"{event_label(st.event, code, text)} at {where(st.event, code)} and the "
                   f"run recorded as {other} did not; it changes the inputs of "
                   f"{feeds or 'what follows'}.")
        subject = "They"
    if result.verdict == "diverged" and f is None:
        if st is None:   # two frameworks: only the optimizer compared by role differs
            out.append(f"{subject} diverge beyond {tol_txt} in the parameters "
                       f"(see the first parameter beyond tolerance).")
        out.append("Every compared value is bitwise identical.")
    elif result.verdict == "diverged":
        e = f.a
        out.append(f"{subject} diverge beyond {tol_txt}. The first operation whose outputs "
                   f"differ beyond tolerance is the {event_label(e, code, text)} at "
                   f"{where(e, code)}: max relative "
                   f"difference {fmt(_metric(f, 'max_rel'))} (max abs "
                   f"{fmt(_metric(f, 'max_abs'))}){_ulp_words(f)}, "
                   f"{fmt_pct(_metric(f, 'beyond_tolerance_fraction'))} of its elements beyond "
                   f"tolerance.")
        if f.introduced:
            out.append("Its inputs match bitwise, so the difference is introduced by this "
                       "operation.")
        elif f.inputs_match is True:
            word, _ = inputs_words(f)
            out.append(f"Its inputs differ bitwise, within tolerance: it {text(word)}.")
        elif f.inputs_match is False:
            out.append("Its inputs already differ, so the difference is inherited from an "
                       "earlier operation.")
        fd = result.first_difference
        if fd is not None and fd.a.index != e.index:
            out.append(f"The first bitwise difference comes earlier, at the "
                       f"{event_label(fd.a, code, text)} ({where(fd.a, code)}), within "
                       f"tolerance.")
    elif result.first_difference is not None:
        fd = result.first_difference
        out.append(f"{subject} agree within {tol_txt}, but not bitwise: the first bitwise "
                   f"difference is at the {event_label(fd.a, code, text)} "
                   f"({where(fd.a, code)}), max relative "
                   f"difference {fmt(_metric(fd, 'max_rel'))} (max abs "
                   f"{fmt(_metric(fd, 'max_abs'))}){_ulp_words(fd)}.")
    else:
        out.append(f"{subject} are bitwise identical in every compared value.")
    if result.verdict == "inconclusive":
        out.append(f"That is no match: too little was compared "
                   f"({text('; '.join(result.coverage.reasons[:2]))}).")
    ex = result.explain
    if ex is not None and ex.event:
        verdict = f" ({text(str(ex.verdict).split(';')[0])})" if ex.verdict else ""
        out.append(f"The replay analysis names {code(ex.event)} as the origin{verdict}.")
    steps = [s for s in result.optimizer_steps if not s.bitwise_equal]
    if steps:
        last = result.optimizer_steps[-1]
        out.append(f"The parameters first differ after optimizer step "
                   f"{steps[0].step}; at the last compared step ({last.step}) the max "
                   f"relative difference is {fmt(last.max_rel)}.")
    env = result.env_diff or []
    if env:
        keys = ", ".join(code(d["key"]) for d in env[:4]) + (" ..." if len(env) > 4 else "")
        out.append(f"The environments differ in {len(env)} "
                   f"{'entry' if len(env) == 1 else 'entries'} ({keys}).")
    else:
        out.append("The recorded environments are identical.")
    return " ".join(out)


def _side_coverage(s) -> str:
    pct = lambda x: f"{x / s.events:.0%}" if s.events else "-"  # noqa: E731
    phases = ", ".join(f"{k} {v['compared']}/{v['events']}" for k, v in s.by_phase.items())
    return (f"{s.side}{' (' + s.framework + ')' if s.framework else ''}"
            f"{' rank ' + str(s.rank) if s.rank is not None else ''}: {s.paired:,} of "
            f"{s.events:,} {s.counted} paired ({pct(s.paired)}), {s.compared:,} compared "
            f"({pct(s.compared)}){' [' + phases + ']' if phases else ''}"
            f"{f' (+{s.setup:,} units not counted: RNG, initialisers, optimizer internals)' if s.setup else ''}; "
            f"{s.values_with_data:,} of {s.values:,} values with bytes or hash "
            f"({fmt_bytes(s.bytes)})")


def coverage_lines(result: LocateResult) -> list:
    """What the comparison compared, in plain lines (each renderer escapes them: they hold
    module names and ops from the traces): per side, then why it is not enough for a
    match, the largest unpaired regions and the next step (diff/coverage.py)."""
    return coverage_text(result.coverage, result.verdict)


def coverage_text(cov, verdict: str) -> list:
    """`coverage_lines` of a `Coverage` and the verdict it stands beside (explain's too)."""
    if cov is None:
        return []
    out = [f"coverage: {_side_coverage(cov.a)}", f"          {_side_coverage(cov.b)}"]
    if not cov.sufficient:
        what = ("below the bar for a match (the divergence stands; what was not compared may "
                "hold an earlier one)" if verdict == "diverged" else "not enough for a match")
        out.append(f"{what} (the bar: {cov.bar:.0%} of each side's computing events paired and "
                   f"compared, no capture stopped): " + "; ".join(cov.reasons))
    for r in cov.unpaired:
        if not cov.sufficient or r.length > 1:
            out.append(f"unpaired: {r.length:,} {'units' if cov.a.counted != 'events' else 'events'}"
                       f" of {r.side} from #{r.start} ({r.op}"
                       f"{' in ' + r.module if r.module else ''}{' at ' + r.source if r.source else ''})")
    if cov.next_step and not cov.sufficient:
        out.append(f"next step: {cov.next_step}")
    return out


# What a report says about the code context (report/markdown.py, html.py, terminal.py).
RECORDED = "recorded in the trace"
MATCHES = "local file matches the recorded sha256"
DIFFERS = "local file differs from the recorded one"
NO_LINES = "the trace holds no source lines for it"


def source_context(source, recorded=None, source_dir=None, manifest=None):
    """The user's lines around `source` ("file.py:25"), from the trace: {"file", "line",
    "lines": [(number, text)], "found", "origin", "note"}; None when `source` has no line
    number. Nothing on this machine is read unless `source_dir` is given.

    `recorded` is `Trace.source_lines(source)` (None for an older trace). With
    `source_dir`, the file is read from there only when it is a regular file inside the
    folder whose sha256 is the recorded one (the manifest's script sha256 for the script
    itself in an older trace); `note` says what happened, `origin` is "trace" or "local".
    Texts are the trace's (or the file's): renderers escape them."""

    parsed = parse_source(source)
    if parsed is None:
        return None
    fname, line = parsed
    out = {"file": fname, "line": line, "lines": [], "found": False, "origin": None,
           "note": None}
    if recorded and recorded.get("lines"):
        out.update(lines=list(recorded["lines"]), found=True, origin="trace")
    if source_dir is None:
        return out
    sha = (recorded or {}).get("sha256")
    if not sha:  # an older trace: the script itself has its sha256 in the manifest
        script = (manifest or {}).get("script") or {}
        if script.get("name") == fname and isinstance(script.get("sha256"), str):
            sha = script["sha256"].lower()
    lines, out["note"] = _local_lines(source_dir, fname, line, sha)
    if lines is not None:
        out.update(lines=lines, found=True, origin="local")
    return out


def _local_lines(source_dir, fname, line, sha):
    """([(number, text)] or None, note) for `fname` read from `source_dir` (see
    `source_context`): a relative path that stays inside the folder once symlinks are
    resolved, a regular file, at most MAX_FILE_BYTES, with the expected sha256."""
    import hashlib


    if os.path.isabs(fname) or fname.startswith("~"):
        return None, "not read: an absolute path"
    try:
        root = os.path.realpath(source_dir)
        path = os.path.realpath(os.path.join(root, fname))
    except (ValueError, OSError):  # a NUL byte, a symlink loop
        return None, "not read: not a valid path"
    if os.path.commonpath([root, path]) != root or path == root:
        return None, "not read: outside --source-dir"
    if not sha:
        return None, "not read: the trace records no sha256 for this file"
    try:
        data = sources.read_regular(path, follow=False)
    except sources.NotRegular:
        return None, "not read: not a regular file in --source-dir"
    except OSError:
        return None, "not read: no such file in --source-dir"
    if data is None or hashlib.sha256(data).hexdigest() != sha:
        return None, DIFFERS
    got = sources.window(sources.split_lines(data), line)
    if got is None:
        return None, DIFFERS
    return [(got[0] + k, t) for k, t in enumerate(got[1])], MATCHES


def _default_tolerance(result):
    tol = result.tolerance or {}
    return tol.get("rtol") is None and tol.get("atol") is None


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


ROLE_WORDS = {"origin": "origin", "first_beyond_tolerance": "first beyond tolerance",
              "last": "last differing event"}


def chain_items(chain: list, code=md_code, text=md_text, strong=lambda s: f"**{s}**") -> list:
    """Lines for the chain from origin to outputs ([Hop | Gap]), trace strings rendered by
    `code` and `text` (Markdown inline syntax by default): one per hop (`op` (event #i,
    step s, source) max rel R, x amplification, role), or the gap ("... 12 more hops")."""
    out = []
    for hop in chain or []:
        if isinstance(hop, Gap):
            out.append(str(hop))
            continue
        e, m = hop.a, hop.metrics
        line = (f"{code(e.op)} (event #{text(e.index)}, step "
                f"{text(e.step)}{', ' + code(e.source) if e.source else ''})")
        if m.max_rel is not None:
            line += f" max rel {fmt(m.max_rel)}"
        amp = hop.amplification
        if isinstance(amp, (int, float)) and not isinstance(amp, bool) and math.isfinite(amp):
            line += f", amplified x{fmt(float(amp))}"
        roles = [ROLE_WORDS.get(r, r) for r in str(hop.role or "").split(",") if r]
        if roles:
            line += f" — {strong(text(', '.join(roles)))}"
        out.append(line)
    return out


def _far_ulp(u, unit=" ULP"):
    """A ULP count, or where it is a different value rather than a rounding (a million
    ULP and more: 14.0 against 0.0 is 1.1e9) words that say so."""
    if u is None or not u >= FAR_ULP:
        return fmt(u) + unit
    return "far off (a different value, not a rounding difference)"


def explain_parts(explain: Replay) -> tuple:
    """(headline, summary or None, [(key, value text)]) of the replay verdict, as plain
    strings: they quote trace strings, so the renderer escapes them."""
    head = explain.verdict or explain.summary or ""
    summ = explain.summary if explain.summary not in (None, head) else None
    rows = []
    for f in dataclasses.fields(explain):
        k, v = f.name, getattr(explain, f.name)
        if k in ("verdict", "summary") or v is None or (k == "mechanisms" and not v):
            continue
        if k == "mechanisms" and explain.mechanism:   # the one line says it
            continue
        if k == "mechanisms":
            v = "; ".join(f"{m.side}: {m.name} ({'bitwise' if m.bitwise else _far_ulp(m.max_ulp)})"
                          f"{' - ' + m.note if m.note else ''}" for m in v)
        if k.endswith("_ulp_from_exact"):
            v = _far_ulp(v, "")
        rows.append((k.replace("_", " "), v if isinstance(v, str) else
                     fmt(v) if isinstance(v, (int, float)) else str(v)))
    return str(head), summ, rows


def sources_lines(srcs, limit=None, details=False) -> list:
    """Plain text lines for the sources of a difference (`Sources`, explain/sources.py):
    a heading, one line a source (the first `limit`), and with `details` each one's
    mechanism, fix and counterfactual run. Trace strings are in them: callers escape."""
    if srcs is None:
        return []
    if not srcs.sources:
        return [f"sources: none ({srcs.note})"] if srcs.note else []
    shown = srcs.sources if limit is None else srcs.sources[:limit]
    more = len(srcs.sources) - len(shown)
    bound = " (bounds: stats-level traces)" if srcs.bound else ""
    out = [f"sources of the difference, ranked by estimated share{bound} "
           f"({srcs.examined} differing ops examined, {srcs.replayed} op runs replayed):"]
    for s in shown:
        out.append(f"  {s.rank}. {s.text}")
        if details:
            out.append(f"       mechanism: {s.mechanism_text}")
            out.append(f"       largest at a #{s.event_a} / b #{s.event_b}; "
                       f"{s.events} events, {s.replayed} replayed")
            if s.fix:
                out.append(f"       fix: {s.fix}")
            for line in s.counterfactual:
                out.append(f"       {line}")
    if more > 0:
        out.append(f"  ... {more} more (tracediff explain lists every source)")
    if len(srcs.sources) > 1:
        out.append("  shares estimate what each source adds where it acts, not how much the "
                   "program amplifies it afterwards: the counterfactual run measures that")
    if srcs.not_judged:
        out.append("  shares are of the measured sources; not measured: " +
                   "; ".join(f"{op} x{n} ({why})" for op, n, why in srcs.not_judged[:4]) +
                   (f"; +{len(srcs.not_judged) - 4} more" if len(srcs.not_judged) > 4 else ""))
    if not details and shown and shown[0].counterfactual:
        out.append("  check source 1 with a counterfactual run:")
        out += [f"    {line}" for line in shown[0].counterfactual]
    return out
