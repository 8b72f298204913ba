"""Self-contained HTML report of a `locate` result: one file, no network.

The page holds the same sections as the Markdown report, plus two inline SVG plots
(generated here, log scale): the difference magnitude (max relative difference of the
outputs) of every aligned event along the run, with the culprit and the first bitwise
difference marked, and the same per optimizer step. Tables (environment, optimizer
steps, differing events) can be searched with a few lines of vanilla JavaScript.

Every string from a trace goes through `e` (HTML-escaped, control characters shown as
text) or `code`; the shared helpers (findings.py, analysis_lines.py) get these as their
renderers.
"""

from __future__ import annotations

import html
import math
import os
from typing import Optional

import numpy as np

from .._version import __version__
from ..diff.result import Finding, LocateResult
from ..untrusted import printable
from .analysis_lines import chain_items, coverage_lines, explain_parts, sources_lines
from .context import GITHUB_ATTACH_LIMIT, ReportContext
from .findings import culprit, event_label, finding_rows, first_parameter_text, summary, typed
from .nonfinite import result_lines
from .numbers import fmt, fmt_bytes, fmt_pct, ulp_cell, worst_detail
from .source_context import MATCHES, NO_LINES, RECORDED

MAX_POINTS = 2500          # wider runs are binned (max per bin) to keep the page small
MAX_EVENT_ROWS = 500
FLOOR = 1e-18

COLORS = {"beyond": "#d62728", "within": "#f0a030", "equal": "#b8b8b8", "culprit": "#d62728",
          "first": "#1f77b4", "grid": "#e6e6e6", "axis": "#555"}

CSS = """
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;
 color:#1f2328;margin:0;background:#f6f8fa}
main{max-width:1180px;margin:0 auto;padding:18px 24px 40px}
h1{font-size:22px;margin:6px 0 10px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #d0d7de;
 padding-bottom:4px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:12px 16px;margin:10px 0}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;color:#fff;
 font-size:13px;vertical-align:middle;margin-left:8px}
.diverged{background:#cf222e}.match{background:#1a7f37}.inconclusive{background:#9a6700}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
code{background:#eff1f3;padding:1px 4px;border-radius:4px}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;overflow-x:auto}
pre .hl{background:#ffebe9;display:inline-block;width:100%}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #e6e8eb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{background:#fff5f5}tr.culprit td{background:#ffe3e3;font-weight:600}
.kv td:first-child{color:#57606a;width:190px}
input.search{width:320px;padding:4px 8px;margin:4px 0 6px;border:1px solid #d0d7de;border-radius:6px}
.scroll{max-height:420px;overflow:auto;border:1px solid #e6e8eb;border-radius:6px}
.muted{color:#57606a}.warn{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:6px 10px}
svg text{font:11px -apple-system,Helvetica,Arial,sans-serif;fill:#444}
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:10px;height:10px;
 margin-right:4px;border-radius:2px;vertical-align:middle}
"""

JS = """
document.querySelectorAll('input.search').forEach(function(box){
  box.addEventListener('input',function(){
    var q=box.value.toLowerCase(),t=document.getElementById(box.dataset.table),n=0;
    t.querySelectorAll('tbody tr').forEach(function(r){
      var hit=r.textContent.toLowerCase().indexOf(q)>=0;r.style.display=hit?'':'none';if(hit)n++;});
    var c=document.getElementById(box.dataset.table+'-count');if(c)c.textContent=n+' shown';
  });
});
"""


def e(x):
    """Text (maybe from a trace) as HTML text or attribute value: control characters
    shown as `\\xNN` (`untrusted.printable`, line breaks as spaces), markup escaped."""
    return html.escape(printable(str(x).replace("\r\n", " ").replace("\n", " ")), quote=True)


def code(x):
    """A trace string as one <code> element."""
    return f"<code>{e(x)}</code>"


def bold(rendered):
    """Emphasis around text that is already HTML."""
    return f"<b>{rendered}</b>"


# -- plots -----------------------------------------------------------------------------------
def _log_range(vals):
    pos = vals[np.isfinite(vals) & (vals > 0)]
    if not len(pos):
        return -16.0, 0.0
    lo = math.floor(math.log10(max(pos.min(), FLOOR)))
    hi = math.ceil(math.log10(pos.max()))
    if hi <= lo:
        hi = lo + 1
    return float(lo), float(hi)


def _axes(parts, x0, y0, w, h, lo, hi, ylabel):
    """Decade grid lines and labels; returns y(value) mapper."""
    step = max(1, int(math.ceil((hi - lo) / 8)))
    d = lo
    while d <= hi + 1e-9:
        y = y0 + h - (d - lo) / (hi - lo) * h
        parts.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="{COLORS["grid"]}"/>')
        parts.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">1e{int(d)}</text>')
        d += step
    parts.append(f'<line x1="{x0}" x2="{x0}" y1="{y0}" y2="{y0 + h}" stroke="{COLORS["axis"]}"/>')
    parts.append(f'<text transform="translate(14,{y0 + h / 2}) rotate(-90)" '
                 f'text-anchor="middle">{e(ylabel)}</text>')

    def ymap(v):
        lv = min(max(math.log10(v), lo), hi)
        return y0 + h - (lv - lo) / (hi - lo) * h

    return ymap


def _squares(xs, ys, size=3.0):
    r = size / 2
    return "".join(f"M{x - r:.1f} {y - r:.1f}h{size}v{size}h-{size}z" for x, y in zip(xs, ys))


def event_plot(profile, result: LocateResult, width=1120, height=300):
    """SVG: max relative difference per aligned event along the run (log scale), the
    result's culprit and first bitwise difference marked."""
    a_idx = np.asarray(profile["a"], np.int64)
    if not len(a_idx):
        return '<p class="muted">No aligned events.</p>'
    rel = np.asarray(profile["max_rel"], np.float64)
    beyond = np.asarray(profile["beyond"], bool)
    pos = np.arange(len(a_idx))
    n = len(a_idx)
    if n > MAX_POINTS:   # bin: the max of each bin, beyond if any is beyond
        edges = np.linspace(0, n, MAX_POINTS + 1).astype(np.int64)
        edges = np.unique(edges)
        r0 = np.where(np.isnan(rel), -1.0, rel)
        rel_b = np.maximum.reduceat(r0, edges[:-1])
        rel_b = np.where(rel_b < 0, np.nan, rel_b)
        beyond_b = np.maximum.reduceat(beyond.astype(np.int8), edges[:-1]) == 1
        pos_b = edges[:-1]
    else:
        rel_b, beyond_b, pos_b = rel, beyond, pos
    lo, hi = _log_range(rel_b)
    x0, y0, pw, ph = 64, 26, width - 84, height - 78
    band = y0 + ph + 14          # bitwise-equal band under the axis
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="difference per event">']
    ymap = _axes(parts, x0, y0, pw, ph, lo, hi, "max relative difference")

    def xmap(p):
        return x0 + (p + 0.5) / n * pw

    # optimizer steps: light vertical separators where the step number changes
    steps = np.asarray(profile["step"], np.int64)
    change = np.flatnonzero(np.diff(steps) != 0) + 1
    every = max(1, int(math.ceil(len(change) / 20)))
    if len(steps):
        parts.append(f'<text x="{x0 + 3}" y="{y0 + 10}">step {int(steps[0])}</text>')
    for j, p in enumerate(change.tolist()):
        x = xmap(p - 0.5)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{y0 + ph}" stroke="#c9d1d9" '
                     f'stroke-dasharray="3 3"/>')
        if j % every == 0:
            label = f"step {int(steps[p])}"
            if x + 7 * len(label) > x0 + pw:      # keep the last labels inside the plot
                parts.append(f'<text x="{x - 3:.1f}" y="{y0 + 10}" text-anchor="end">{label}</text>')
            else:
                parts.append(f'<text x="{x + 3:.1f}" y="{y0 + 10}">{label}</text>')
    ok = ~np.isnan(rel_b)
    eq = ok & (rel_b == 0)
    bad = ok & (rel_b > 0) & beyond_b
    within = ok & (rel_b > 0) & ~beyond_b
    parts.append(f'<text x="{x0 - 6}" y="{band + 4}" text-anchor="end">equal</text>')
    if eq.any():
        xs = [xmap(p) for p in pos_b[eq]]
        parts.append(f'<path fill="{COLORS["equal"]}" d="{_squares(xs, [band] * len(xs), 2.0)}"/>')
    for mask, color in ((within, COLORS["within"]), (bad, COLORS["beyond"])):
        if mask.any():
            xs = [xmap(p) for p in pos_b[mask]]
            ys = [ymap(v) for v in rel_b[mask]]
            parts.append(f'<path fill="{color}" d="{_squares(xs, ys)}"/>')
    # markers: the first bitwise difference and the culprit
    where = {int(a): i for i, a in enumerate(a_idx.tolist())}
    marks = []
    fd = result.first_difference
    f, _ = culprit(result)
    if fd is not None and (f is None or fd.a.index != f.a.index):
        marks.append((fd, COLORS["first"], "first bitwise difference"))
    if f is not None:
        diverged = result.verdict == "diverged"
        marks.append((f, COLORS["culprit"] if diverged else COLORS["first"],
                      "culprit" if diverged else "first bitwise difference"))
    for k, (finding, color, label) in enumerate(marks):
        p = where.get(int(finding.a.index))
        if p is None:
            continue
        x = xmap(p)
        anchor = "start" if x < x0 + pw * 0.7 else "end"
        dx = 5 if anchor == "start" else -5
        ty = y0 + 24 + 14 * k
        parts.append(f'<g class="marker"><line x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{band}" '
                     f'stroke="{color}" stroke-width="1.5"/>'
                     f'<title>{e(label)}: {e(finding.a.op)} (event #{finding.a.index})</title>'
                     f'<text x="{x + dx:.1f}" y="{ty}" text-anchor="{anchor}" style="fill:{color};'
                     f'font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:4px">{e(label)}: {e(finding.a.op)} '
                     f'#{finding.a.index}</text></g>')
    parts.append(f'<text x="{x0 + pw / 2}" y="{height - 8}" text-anchor="middle">aligned events '
                 f'in the order of run a ({fmt(n)}{", binned" if n > MAX_POINTS else ""}); '
                 f'dashed lines: optimizer steps</text>')
    parts.append("</svg>")
    return "".join(parts)


def step_plot(steps, width=1120, height=220):
    """SVG: the parameters' relative L2 distance ||a - b|| / ||a|| per optimizer step (log
    scale; max rel is set by near-zero elements and says little), max abs in each tooltip."""
    if not steps:
        return ""
    xs_step = [int(s.step) for s in steps]
    rel = np.array([math.nan if s.rel_l2 is None else s.rel_l2 for s in steps], np.float64)
    absd = [s.max_abs for s in steps]
    lo, hi = _log_range(rel)
    x0, y0, pw, ph = 64, 14, width - 84, height - 64
    band = y0 + ph + 14
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="difference per optimizer step">']
    ymap = _axes(parts, x0, y0, pw, ph, lo, hi, "relative L2 (parameters)")
    s_lo, s_hi = min(xs_step), max(xs_step)
    span = max(1, s_hi - s_lo)

    def xmap(s):
        return x0 + 10 + (s - s_lo) / span * (pw - 20) if s_hi > s_lo else x0 + pw / 2

    parts.append(f'<text x="{x0 - 6}" y="{band + 4}" text-anchor="end">equal</text>')
    pts = []
    for s, v, ab, st in zip(xs_step, rel, absd, steps):
        if math.isnan(v):
            continue
        worst = f" (worst {st.worst}{worst_detail(st)}), all parameters" \
            if st.worst and st.worst_rel_l2 is not None else ""
        pts.append((xmap(s), band if v == 0 else ymap(v), v, s, ab, worst))
    if len(pts) > 1:
        d = "M" + " L".join(f"{x:.1f} {y:.1f}" for x, y, *_ in pts)
        parts.append(f'<path d="{d}" fill="none" stroke="#8c959f" stroke-width="1"/>')
    for x, y, v, s, ab, worst in pts:
        color = COLORS["equal"] if v == 0 else COLORS["beyond"]
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}">'
                     f'<title>step {s}{e(worst)}: relative L2 {fmt(float(v))}, max abs {fmt(ab)}'
                     f'</title></circle>')
    ticks = sorted(set(xs_step))
    every = max(1, int(math.ceil(len(ticks) / 20)))
    for s in ticks[::every]:
        parts.append(f'<text x="{xmap(s):.1f}" y="{band + 18}" text-anchor="middle">{s}</text>')
    parts.append(f'<text x="{x0 + pw / 2}" y="{height - 4}" text-anchor="middle">optimizer step'
                 f'</text></svg>')
    return "".join(parts)


# -- tables ----------------------------------------------------------------------------------
def _table(tid, header, rows, num_cols=(), row_classes=None, search=True, note=""):
    out = []
    if search:
        out.append(f'<input class="search" type="search" placeholder="filter rows..." '
                   f'data-table="{tid}" aria-label="filter {tid}"> '
                   f'<span class="muted" id="{tid}-count">{len(rows)} rows</span>{note}')
    out.append(f'<div class="scroll"><table id="{tid}"><thead><tr>' +
               "".join(f"<th>{e(h)}</th>" for h in header) + "</tr></thead><tbody>")
    for i, r in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(
            f'<td class="num">{c}</td>' if j in num_cols else f"<td>{c}</td>"
            for j, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _kv(rows):
    return '<table class="kv"><tbody>' + "".join(
        f"<tr><td>{e(k)}</td><td>{v}</td></tr>" for k, v in rows) + "</tbody></table>"


def _finding(f: Finding, title, src=None):
    a, b = f.a, f.b
    rows = [("event", f"#{a.index} in a, #{b.index} in b; step {e(a.step)}, "
                      f"{e(a.phase)}")]
    rows += finding_rows(f, code=code, text=e, strong=lambda x: bold(e(x)))

    def m(name):
        return getattr(f.metrics, name) if f.metrics is not None else None

    rows += [("max abs difference", e(fmt(m("max_abs")))),
             ("max relative difference", e(fmt(m("max_rel")))),
             ("max ULP distance", e(ulp_cell(f.metrics))),
             ("elements that differ / beyond tolerance",
              f"{e(fmt_pct(m('mismatch_fraction')))} / {e(fmt_pct(m('beyond_tolerance_fraction')))}"),
             ("tolerance (rtol, atol)", f"{e(fmt(m('rtol')))}, {e(fmt(m('atol')))}")]
    out = [f'<div class="card"><h3>{e(title)}: {event_label(a, code, e)}</h3>', _kv(rows)]
    if src:
        out.append(_source(src))
    out.append("</div>")
    return "".join(out)


def _source(src):
    """The culprit's code context (`source_context.source_context`), from the trace's lines."""
    note = src.get("note")
    if not src.get("found"):
        return (f'<p class="muted">source {e(printable(src["file"], 300))}:{src["line"]} '
                f'({e(NO_LINES)}{"; " + e(note) if note else ""})</p>')
    origin = MATCHES if src.get("origin") == "local" else RECORDED
    if note and note != origin:
        origin += f"; {note}"
    lines = []
    for no, text in src["lines"]:
        line = f"{no:>5}  {e(printable(text, 300))}"
        lines.append(f'<span class="hl">{line}</span>' if no == src["line"] else line)
    return (f'<p class="muted">{e(printable(src["file"], 300))} ({e(origin)})</p><pre>' +
            "\n".join(lines) + "</pre>")


def _events_rows(profile, result, limit=MAX_EVENT_ROWS):
    """Rows of the differing-events table: every differing aligned event up to `limit`."""
    rel = np.asarray(profile["max_rel"], np.float64)
    diff = np.flatnonzero(~np.asarray(profile["bitwise_equal"], bool))
    f, _ = culprit(result)
    cidx = f.a.index if f else None
    rows, classes = [], []
    for k in diff[:limit].tolist():
        a = int(profile["a"][k])
        rows.append((str(a), str(int(profile["b"][k])), str(int(profile["step"][k])),
                     e(profile["kind"][k]) + (f" ({e(profile['origin'][k])})"
                                              if profile["origin"][k] else ""),
                     f"<code>{e(profile['op'][k])}</code>", e(profile["name_stack"][k]),
                     e(profile["source"][k]), e(fmt(float(rel[k]))),
                     "beyond" if profile["beyond"][k] else "within"))
        classes.append("culprit" if a == cidx else ("bad" if profile["beyond"][k] else ""))
    return rows, classes, len(diff)


def render(result: LocateResult, ctx: Optional[ReportContext] = None, profile=None) -> str:
    """HTML text of a `LocateResult`, its `context.report_context` and the event profile
    (`profile.event_profile`) of its traces; without a context or a profile, the page has
    no code lines, reproduction commands or trace files, or no plot of the run."""
    typed(result, LocateResult)
    typed(ctx, ReportContext, optional=True)
    a, b = result.traces["a"], result.traces["b"]
    verdict = result.verdict
    title = f"tracediff: {os.path.basename(a.path)} vs {os.path.basename(b.path)}"
    body = [f'<h1>{e(title)}<span class="badge {e(verdict)}">{e(verdict.upper())}</span></h1>',
            f'<p class="muted">exit code {result.exit_code} · tracediff '
            f'{e(__version__)} · a: <code>{e(a.path)}</code> · '
            f'b: <code>{e(b.path)}</code></p>',
            f'<div class="card"><p>{summary(result, code, e)}</p></div>']
    for w in result.warnings:
        body.append(f'<p class="warn"><b>Warning:</b> {e(w)}</p>')
    if profile is not None:
        body.append('<h2>Difference along the run</h2><div class="card">')
        body.append('<div class="legend">' + "".join(
            f'<span><i class="sw" style="background:{c}"></i>{e(t)}</span>' for c, t in (
                (COLORS["beyond"], "beyond tolerance"), (COLORS["within"], "differs, within tolerance"),
                (COLORS["equal"], "bitwise equal"))) + "</div>")
        body.append(event_plot(profile, result))
        body.append("</div>")
    steps = result.optimizer_steps
    if steps:
        body.append(f'<h2>Per optimizer step ({fmt(result.optimizer_steps_total or len(steps))} '
                    f'compared)</h2><div class="card">{step_plot(steps)}</div>')
    nf = result_lines(result)
    if nf:   # where a side's NaN or Inf came from (diff/nonfinite/)
        body.append('<h2>Non-finite values</h2><div class="card"><pre>' +
                    "\n".join(e(printable(line, 2000)) for line in nf) + "</pre></div>")
    st = result.structural
    if st is not None:   # an op only one run has, before any value differs
        body.append(f'<h2>First difference: an op only one run has</h2><div class="card"><p>'
                    f'{e(st.text)} (step {e(st.event.step)}, event #{st.event.index} of '
                    f'{e(st.side)}); feeds ' + (", ".join(f"{code(c.op)} (#{c.index})"
                                                         for c in st.consumers[:3]) or "-")
                    + "</p></div>")
    f, ftitle = culprit(result)
    if f is not None:
        body.append("<h2>Culprit</h2>")
        body.append(_finding(f, ftitle, ctx.source if ctx is not None else None))
    if result.explain is not None:
        head, summ, rows = explain_parts(result.explain)
        body.append('<h2>Replay verdict</h2><div class="card">')
        if head:
            body.append(f"<p><b>{e(head)}</b></p>")
        if summ:
            body.append(f"<p>{e(summ)}</p>")
        if rows:
            body.append(_kv([(k, e(v)) for k, v in rows]))
        body.append("</div>")
    if result.chain:
        body.append('<h2>From origin to outputs</h2><div class="card"><ol>' +
                    "".join(f"<li>{t}</li>" for t in chain_items(result.chain, code, e, bold)) +
                    "</ol></div>")
    src = sources_lines(result.sources, details=True)   # diff/explain/sources.py
    if src:
        body.append('<h2>Sources of the difference</h2><div class="card"><pre>' +
                    "\n".join(e(printable(line, 2000)) for line in src) + "</pre></div>")
    fd = result.first_difference
    if fd is not None and f is not None and fd.a.index != f.a.index:
        body.append(_finding(fd, "First bitwise difference (earlier, within tolerance)"))
    if result.first_parameter is not None:   # two frameworks: the optimizer by role
        body.append('<h2>First parameter beyond tolerance</h2><div class="card"><p>' +
                    first_parameter_text(result.first_parameter, code, e) + "</p></div>")
    if result.near_zero is not None:   # passed over by the tolerance search (nearzero.py)
        body.append(_finding(result.near_zero, f"Rounding noise around zero (not counted as "
                                               f"beyond tolerance; {result.near_zero_total} "
                                               f"event(s))"))
    if profile is not None:
        rows, classes, total = _events_rows(profile, result)
        note = (f' <span class="muted">(the first {len(rows)} of {fmt(total)} differing '
                f'events)</span>' if total > len(rows) else "")
        body.append(f"<h2>Differing events ({fmt(total)} of {fmt(len(profile['a']))} aligned)</h2>")
        if rows:
            body.append(_table("events", ["a #", "b #", "step", "kind", "op", "name stack",
                                          "source", "max rel", "tolerance"], rows,
                               num_cols=(0, 1, 2, 7), row_classes=classes, note=note))
        else:
            body.append('<p class="muted">Every aligned event is bitwise equal.</p>')
    if steps:
        rows = [(str(s.step), "yes" if s.bitwise_equal else "no", e(fmt(s.rel_l2)),
                 e(("≥ " if s.max_abs_is_lower_bound else "") + fmt(s.max_abs)), e(fmt(s.max_rel)),
                 f"<code>{e(s.worst or '-')}</code>{e(worst_detail(s))}")
                for s in steps]
        body.append("<h2>Optimizer steps</h2>")
        body.append(_table("steps", ["step", "bitwise equal", "relative L2", "max abs",
                                     "max rel", "worst parameter (relative L2)"], rows,
                           num_cols=(0, 2, 3, 4),
                           row_classes=["" if s.bitwise_equal else "bad" for s in steps]))
    env = result.env_diff or []
    body.append("<h2>Environment differences (a → b)</h2>")
    if env:
        rows = [(e(d.get("category")), f"<code>{e(d.get('key'))}</code>",
                 e("(unset)" if d.get("a") is None else d.get("a")),
                 e("(unset)" if d.get("b") is None else d.get("b"))) for d in env]
        body.append(_table("env", ["category", "key", "a", "b"], rows))
    else:
        body.append('<p class="muted">None: the manifests record the same machine, packages '
                    'and variables.</p>')
    al = result.alignment or {}
    if al:
        body.append(f'<h2>Alignment</h2><p>{fmt(al.get("matched"))} events matched; a has '
                    f'{fmt(al.get("events_a"))} ({fmt(al.get("only_in_a"))} only in a), b has '
                    f'{fmt(al.get("events_b"))} ({fmt(al.get("only_in_b"))} only in b).</p>')
    cov = coverage_lines(result)
    if cov:
        body.append("<h2>Coverage: what was compared</h2><ul>" +
                    "".join(f"<li>{e(x.strip())}</li>" for x in cov) + "</ul>")
    if ctx is not None and ctx.commands:
        body.append("<h2>Reproduce</h2><pre>" + "\n".join(e(c) for c in ctx.commands) + "</pre>")
    if ctx is not None and ctx.traces:
        items = []
        for side in ("a", "b"):
            t, c = result.traces[side], ctx.traces[side]
            items.append(f"<li>{side}: <code>{e(os.path.basename(t.path))}</code> — "
                         f"{e(fmt_bytes(c.size))}, {e(fmt(t.events))} events, recorded "
                         f"{e(t.created or '?')} on <code>{e(t.hostname or '?')}</code>"
                         f"{'' if t.complete else ' — <b>truncated</b>'}</li>")
        body.append("<h2>Traces to attach</h2><ul>" + "".join(items) + "</ul>")
        if not ctx.attach_ok:
            body.append(f'<p class="warn">A trace is larger than GitHub\'s '
                        f'{e(fmt_bytes(GITHUB_ATTACH_LIMIT))} attachment limit: compress it '
                        f'(<code>gzip -9</code>) or share it from elsewhere.</p>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{e(title)}</title><style>{CSS}</style></head><body><main>"
            + "\n".join(body) + f"</main><script>{JS}</script></body></html>\n")
