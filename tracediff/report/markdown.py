"""Markdown report of a `locate` result, made to paste into a bug tracker (GitHub
flavoured: tables, fenced code, <details> for long sections).

Sections: summary paragraph; verdict line; the culprit op (event, source lines,
metrics, per-value table, inputs, enclosing compiled call); the replay verdict and the
chain from origin to outputs when the result has them ("explain", "chain"); the first
bitwise difference when it is another event; optimizer steps; environment diff; warnings;
reproduction commands; the trace files to attach with their sizes.

Every string from a trace is untrusted: it goes into the Markdown only through
`untrusted.md_code` (a code span it cannot end; `|` escaped in table cells) or
`untrusted.md_text` (Markdown and HTML syntax escaped), so a rendered report holds no raw
HTML, link or table cell that the trace wrote, and no control character.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from .._version import __version__
from ..diff.result import Finding, LocateResult
from ..untrusted import md_code, md_text, printable
from .analysis_lines import chain_items, coverage_lines, explain_parts, sources_lines
from .context import GITHUB_ATTACH_LIMIT, ReportContext
from .findings import culprit, event_label, finding_rows, first_parameter_text, summary, typed
from .nonfinite import result_lines
from .numbers import fmt, fmt_bytes, fmt_pct, ulp_cell, worst_detail
from .source_context import MATCHES, NO_LINES, RECORDED
from .json_report import MAX_VALUES

MAX_STEP_ROWS = 30
MAX_ENV_ROWS = 60


CELL_LIMIT = 120


def _plain(x):
    s = fmt(x) if not isinstance(x, str) else x
    return s.replace("\r\n", " ").replace("\n", " ")


def _cell(x):
    """Text (maybe from a trace) as one Markdown table cell or inline text, shown literally."""
    return md_text(_plain(x), CELL_LIMIT)


def _code(x):
    """A trace string as a code span that stays in its table cell; '-' for nothing."""
    s = _plain(x)
    return md_code(s, CELL_LIMIT, cell=True) if s and s != "-" else "-"


def _fence(lines, least=3):
    """A backtick fence longer than any backtick run in `lines`."""
    runs = [len(r) for line in lines for r in re.findall("`+", line)]
    return "`" * max(least, max(runs, default=0) + 1)


def _table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _metrics_rows(m):
    def g(name):
        return getattr(m, name) if m is not None else None

    return [
        ("max abs difference", fmt(g("max_abs"))),
        ("max relative difference", fmt(g("max_rel"))),
        ("max ULP distance", ulp_cell(m)),
        ("elements that differ", fmt_pct(g("mismatch_fraction"))),
        ("elements beyond tolerance", fmt_pct(g("beyond_tolerance_fraction"))),
        ("tolerance (rtol, atol)", f"{fmt(g('rtol'))}, {fmt(g('atol'))}"),
    ]


def _finding(lines, f: Finding, title, ctx_source=None):
    a, b = f.a, f.b
    lines += [f"## {title}", ""]
    lines.append(f"**{event_label(a)}** — event #{a.index} in a, #{b.index} in b, step "
                 f"{md_text(a.step)}, {md_text(a.phase)}")
    lines.append("")
    rows = finding_rows(f, code=_code, text=_cell, strong=lambda x: f"**{x}**")
    lines += _table(["", ""], [(k, v) for k, v in rows])
    lines.append("")
    if ctx_source:
        _source(lines, ctx_source)
    lines += _table(["metric", "value"], _metrics_rows(f.metrics))
    lines.append("")
    values = f.values[:MAX_VALUES]
    if len(values) > 1:
        rows = []
        for v in values:
            vm = v.metrics
            desc = v.a or v.b
            dtype, shape = (desc.dtype, desc.shape) if desc is not None else (None, None)
            rows.append((_code(v.key), _code(f"{dtype}{shape}"),
                         "yes" if vm is not None and vm.bitwise_equal else
                         ("-" if not v.compared else "no"),
                         fmt(vm.max_rel if vm else None), ulp_cell(vm),
                         fmt_pct(vm.beyond_tolerance_fraction if vm else None)))
        lines += _table(["output", "value", "bitwise equal", "max rel", "max ULP", "beyond tol"], rows)
        if len(f.values) > len(values):
            lines.append(f"\n... {len(f.values) - len(values)} more outputs "
                         f"(`tracediff locate --json`)")
        lines.append("")


def _source(lines, src):
    """The culprit's code context (`source_context.source_context`): the trace's lines in a fenced
    block (each line printable, the fence longer than any backtick run in them)."""
    note = src.get("note")
    if not src.get("found"):
        where = md_code(f"{src['file']}:{src['line']}", limit=300)
        lines += [f"Source: {where} ({NO_LINES}{'; ' + note if note else ''})", ""]
        return
    origin = MATCHES if src.get("origin") == "local" else RECORDED
    if note and note != origin:
        origin += f"; {note}"
    width = len(str(src["lines"][-1][0]))
    body = [printable(t, limit=300) for _, t in src["lines"]]
    fence = _fence(body)
    lines += [f"Source ({md_code(src['file'], limit=300)}, {origin}):", "", f"{fence}python"]
    for (no, _), text in zip(src["lines"], body):
        lines.append(f"{'>' if no == src['line'] else ' '}{no:>{width}}  {text}")
    lines += [fence, ""]


def _explain(lines, explain):
    """The replay verdict (the result's `explain`)."""
    head, summ, rows = explain_parts(explain)
    lines += ["## Replay verdict", ""]
    if head.strip():
        lines += [f"**{md_text(head.strip())}**", ""]
    if summ:
        lines += [md_text(summ), ""]
    if rows:
        lines += _table(["", ""], [(_cell(k), _cell(v)) for k, v in rows])
        lines.append("")


def _chain(lines, chain):
    """The chain from origin to outputs (the result's `chain`)."""
    lines += ["## From origin to outputs", ""]
    lines += [f"{i + 1}. {text}" for i, text in enumerate(chain_items(chain))]
    lines.append("")


def render(result: LocateResult, ctx: Optional[ReportContext] = None) -> str:
    """Markdown text of a `LocateResult` and its `context.report_context` (without one, no
    code lines, reproduction commands or trace files)."""
    typed(result, LocateResult)
    typed(ctx, ReportContext, optional=True)
    lines = ["# tracediff report", "", summary(result), ""]
    verdict = {"diverged": "**Verdict: DIVERGED** (exit code 1)",
               "match": "**Verdict: MATCH** (exit code 0)",
               "inconclusive": "**Verdict: INCONCLUSIVE** (exit code 3: no divergence in what "
                               "was compared, but too little was compared)"
               }.get(result.verdict, md_text(result.verdict))
    tol = result.tolerance or {}
    tol_txt = ("per-dtype default tolerances" if tol.get("rtol") is None and tol.get("atol") is None
               else f"rtol {fmt(tol.get('rtol'))}, atol {fmt(tol.get('atol'))}")
    lines += [f"{verdict} — {tol_txt}; tracediff {__version__}", ""]
    for w in result.warnings:
        lines.append(f"> **Warning:** {md_text(w)}")
    if result.warnings:
        lines.append("")
    nf = [printable(x, 2000) for x in result_lines(result)]
    if nf:   # where a side's NaN or Inf came from (diff/nonfinite/)
        fence = _fence(nf)
        lines += ["## Non-finite values", "", fence, *nf, fence, ""]
    st = result.structural
    if st is not None:   # an op only one run has, before any value differs
        lines += ["## First difference: an op only one run has", "",
                  f"{md_text(st.text)} (step {fmt(st.event.step)}, event #{st.event.index} of "
                  f"{st.side}); feeds " + (", ".join(f"{md_code(c.op)} (#{c.index})"
                                                     for c in st.consumers[:3]) or "-"), ""]
    f, title = culprit(result)
    if f is not None:
        _finding(lines, f, title, ctx.source if ctx is not None else None)
    if result.explain is not None:
        _explain(lines, result.explain)
    if result.chain:
        _chain(lines, result.chain)
    src = sources_lines(result.sources, details=True)   # diff/explain/sources.py
    if src:
        src = [printable(line, 2000) for line in src]
        fence = _fence(src)
        lines += ["## Sources of the difference", "", fence, *src, fence, ""]
    fd = result.first_difference
    if fd is not None and f is not None and fd is not f and fd.a.index != f.a.index:
        _finding(lines, fd, "First bitwise difference (earlier, within tolerance)")
    if result.first_parameter is not None:   # two frameworks: the optimizer by role
        lines += ["## First parameter beyond tolerance", "",
                  first_parameter_text(result.first_parameter), ""]
    if result.near_zero is not None:   # passed over by the tolerance search (nearzero.py)
        _finding(lines, result.near_zero, f"Rounding noise around zero (not counted as beyond "
                                          f"tolerance; {result.near_zero_total} event(s))")
    ro = result.replay_only
    if ro is not None and result.verdict == "match":
        lines += ["## Replay-only difference", "",
                  f"{event_label(ro.a)} (event #{ro.a.index}) differs beyond tolerance "
                  f"in the op-by-op replay only; the compiled outputs the script saw match.", ""]
    al = result.alignment or {}
    if al:
        lines += ["## Alignment", "",
                  f"{fmt(al.get('matched'))} events matched; a has {fmt(al.get('events_a'))} "
                  f"({fmt(al.get('only_in_a'))} only in a), b has {fmt(al.get('events_b'))} "
                  f"({fmt(al.get('only_in_b'))} only in b).", ""]
    cov = coverage_lines(result)
    if cov:
        lines += ["## Coverage: what was compared", ""] + [f"- {md_text(x.strip())}" for x in cov] + [""]
    steps = result.optimizer_steps
    if steps:
        total = result.optimizer_steps_total or len(steps)
        lines += [f"## Optimizer steps ({total} compared)", ""]
        rows = [(str(s.step), "yes" if s.bitwise_equal else "no", fmt(s.rel_l2),
                 ("≥ " if s.max_abs_is_lower_bound else "") + fmt(s.max_abs), fmt(s.max_rel), _code(s.worst or "-") + worst_detail(s))
                for s in steps]
        table = _table(["step", "bitwise equal", "relative L2", "max abs", "max rel",
                        "worst parameter (relative L2)"],
                       rows[:MAX_STEP_ROWS])
        if len(rows) > 8:
            lines += ["<details><summary>per-step table</summary>", ""] + table + \
                [""] + ([f"... {len(rows) - MAX_STEP_ROWS} more rows (`tracediff locate --json`)", ""]
                        if len(rows) > MAX_STEP_ROWS else []) + ["</details>", ""]
        else:
            lines += table + [""]
    env = result.env_diff or []
    lines += ["## Environment differences (a → b)", ""]
    if env:
        rows = [(_cell(e.get("category")), _code(e.get("key")),
                 _code("(unset)" if e.get("a") is None else str(e.get("a"))),
                 _code("(unset)" if e.get("b") is None else str(e.get("b")))) for e in env]
        table = _table(["category", "key", "a", "b"], rows[:MAX_ENV_ROWS])
        if len(rows) > 12:
            lines += [f"<details><summary>{len(rows)} differences</summary>", ""] + table + \
                ["", "</details>"]
        else:
            lines += table
        if len(rows) > MAX_ENV_ROWS:
            lines.append(f"\n... {len(rows) - MAX_ENV_ROWS} more (`tracediff locate --json`)")
    else:
        lines.append("None: the manifests record the same machine, packages and variables.")
    lines.append("")
    cmds = ctx.commands if ctx is not None else None
    if cmds:
        cmds = [printable(c) for c in cmds]
        fence = _fence(cmds)
        lines += ["## Reproduce", "", f"{fence}sh"] + cmds + [fence, ""]
    if ctx is not None and ctx.traces:
        lines += ["## Traces to attach", ""]
        for side in ("a", "b"):
            t = result.traces[side]
            c = ctx.traces[side]
            state = "" if t.complete else " — **truncated** (the recording did not finish)"
            lines.append(f"- {side}: {md_code(os.path.basename(t.path))} — "
                         f"{fmt_bytes(c.size)}, {md_text(fmt(t.events))} events, "
                         f"recorded {md_code(t.created or '?')} on "
                         f"{md_code(t.hostname or '?')}{state}")
        if not ctx.attach_ok:
            lines.append(f"\nA trace is larger than GitHub's {fmt_bytes(GITHUB_ATTACH_LIMIT)} "
                         f"attachment limit: compress it (`gzip -9`, HDF5 compresses well) or "
                         f"share it from elsewhere.")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
