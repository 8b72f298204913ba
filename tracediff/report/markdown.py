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

import os
import re

from ..untrusted import md_code, md_text, printable
from .common import (GITHUB_ATTACH_LIMIT, MATCHES, NO_LINES, RECORDED, chain_items, culprit,
                     event_label, explain_parts, finding_rows, fmt, fmt_bytes, fmt_pct,
                     summary)

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
    return [
        ("max abs difference", fmt(m.get("max_abs"))),
        ("max relative difference", fmt(m.get("max_rel"))),
        ("max ULP distance", fmt(m.get("max_ulp"))),
        ("elements that differ", fmt_pct(m.get("mismatch_fraction"))),
        ("elements beyond tolerance", fmt_pct(m.get("beyond_tolerance_fraction"))),
        ("tolerance (rtol, atol)", f"{fmt(m.get('rtol'))}, {fmt(m.get('atol'))}"),
    ]


def _finding(lines, f, title, ctx_source=None):
    a, b = f["a"], f["b"]
    lines += [f"## {title}", ""]
    lines.append(f"**{event_label(a)}** — event #{a['index']} in a, #{b['index']} in b, step "
                 f"{md_text(a.get('step'))}, {md_text(a.get('phase', ''))}")
    lines.append("")
    rows = finding_rows(f, code=_code, text=_cell, strong=lambda x: f"**{x}**")
    lines += _table(["", ""], [(k, v) for k, v in rows])
    lines.append("")
    if ctx_source:
        _source(lines, ctx_source)
    m = f.get("metrics") or {}
    lines += _table(["metric", "value"], _metrics_rows(m))
    lines.append("")
    if len(f.get("values") or []) > 1:
        rows = []
        for v in f["values"]:
            vm = v.get("metrics") or {}
            desc = v.get("a") or v.get("b") or {}
            rows.append((_code(v["key"]), _code(f"{desc.get('dtype')}{desc.get('shape')}"),
                         "yes" if vm.get("bitwise_equal") else ("-" if not v.get("compared") else "no"),
                         fmt(vm.get("max_rel")), fmt(vm.get("max_ulp")),
                         fmt_pct(vm.get("beyond_tolerance_fraction"))))
        lines += _table(["output", "value", "bitwise equal", "max rel", "max ULP", "beyond tol"], rows)
        if f.get("values_total", 0) > len(f["values"]):
            lines.append(f"\n... {f['values_total'] - len(f['values'])} more outputs "
                         f"(`tracediff locate --json`)")
        lines.append("")


def _source(lines, src):
    """The culprit's code context (`common.source_context`): the trace's lines in a fenced
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
    """The replay verdict (`locate`'s "explain" field)."""
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
    """The chain from origin to outputs (`locate`'s "chain" field)."""
    lines += ["## From origin to outputs", ""]
    lines += [f"{i + 1}. {text}" for i, text in enumerate(chain_items(chain))]
    lines.append("")


def render(data):
    """Markdown text from `common.report_data(result)`."""
    ctx = data.get("report") or {}
    lines = ["# tracediff report", "", summary(data), ""]
    verdict = {"diverged": "**Verdict: DIVERGED** (exit code 1)",
               "match": "**Verdict: MATCH** (exit code 0)"}.get(data["verdict"], data["verdict"])
    tol = data.get("tolerance") or {}
    tol_txt = ("per-dtype default tolerances" if tol.get("rtol") is None and tol.get("atol") is None
               else f"rtol {fmt(tol.get('rtol'))}, atol {fmt(tol.get('atol'))}")
    lines += [f"{verdict} — {tol_txt}; tracediff {data.get('tracediff_version', '')}", ""]
    for w in data.get("warnings") or []:
        lines.append(f"> **Warning:** {md_text(w)}")
    if data.get("warnings"):
        lines.append("")
    f, title = culprit(data)
    if f is not None:
        _finding(lines, f, title, ctx.get("source"))
    if data.get("explain"):
        _explain(lines, data["explain"])
    if data.get("chain"):
        _chain(lines, data["chain"])
    fd = data.get("first_difference")
    if fd and f is not None and fd is not f and fd["a"].get("index") != f["a"].get("index"):
        _finding(lines, fd, "First bitwise difference (earlier, within tolerance)")
    ro = data.get("replay_only")
    if ro and data["verdict"] == "match":
        lines += ["## Replay-only difference", "",
                  f"{event_label(ro['a'])} (event #{ro['a']['index']}) differs beyond tolerance "
                  f"in the op-by-op replay only; the compiled outputs the script saw match.", ""]
    al = data.get("alignment") or {}
    if al:
        lines += ["## Alignment", "",
                  f"{fmt(al.get('matched'))} events matched; a has {fmt(al.get('events_a'))} "
                  f"({fmt(al.get('only_in_a'))} only in a), b has {fmt(al.get('events_b'))} "
                  f"({fmt(al.get('only_in_b'))} only in b).", ""]
    steps = data.get("optimizer_steps") or []
    if steps:
        total = data.get("optimizer_steps_total") or len(steps)
        lines += [f"## Optimizer steps ({total} compared)", ""]
        rows = [(str(s["step"]), "yes" if s["bitwise_equal"] else "no", fmt(s.get("max_rel")),
                 fmt(s.get("max_abs")), _code(s.get("worst") or "-")) for s in steps]
        table = _table(["step", "bitwise equal", "max rel", "max abs", "worst parameter"],
                       rows[:MAX_STEP_ROWS])
        if len(rows) > 8:
            lines += ["<details><summary>per-step table</summary>", ""] + table + \
                [""] + ([f"... {len(rows) - MAX_STEP_ROWS} more rows (`tracediff locate --json`)", ""]
                        if len(rows) > MAX_STEP_ROWS else []) + ["</details>", ""]
        else:
            lines += table + [""]
    env = data.get("env_diff") or []
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
    cmds = ctx.get("commands")
    if cmds:
        cmds = [printable(c) for c in cmds]
        fence = _fence(cmds)
        lines += ["## Reproduce", "", f"{fence}sh"] + cmds + [fence, ""]
    if ctx.get("traces"):
        lines += ["## Traces to attach", ""]
        for side in ("a", "b"):
            t = data["traces"][side]
            c = ctx["traces"][side]
            state = "" if t.get("complete") else " — **truncated** (the recording did not finish)"
            lines.append(f"- {side}: {md_code(os.path.basename(t['path']))} — "
                         f"{fmt_bytes(c.get('size'))}, {md_text(fmt(t.get('events')))} events, "
                         f"recorded {md_code(t.get('created') or '?')} on "
                         f"{md_code(t.get('hostname') or '?')}{state}")
        if not ctx.get("attach_ok", True):
            lines.append(f"\nA trace is larger than GitHub's {fmt_bytes(GITHUB_ATTACH_LIMIT)} "
                         f"attachment limit: compress it (`gzip -9`, HDF5 compresses well) or "
                         f"share it from elsewhere.")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
