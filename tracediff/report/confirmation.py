"""A `Confirmation` (`tracediff confirm`) as plain lines, and as JSON at the edge: each
source's estimate beside its measured removal and the cause found by re-running, each
setting measured both ways with its interaction, and the runs with their exact commands.
Words from traces (settings, commands, op names) go through `untrusted.printable`."""

from __future__ import annotations

import dataclasses

from ..diff.result import Confirmation
from ..untrusted import printable
from .findings import typed
from .json_report import strict


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def lines(c: Confirmation) -> list:
    typed(c, Confirmation)
    out = [f"confirm: {printable(c.trace_a)} vs {printable(c.trace_b)}, measured on "
           f"{c.measures}: relative L2 {c.distance:.3g} as recorded"
           if c.distance is not None else
           f"confirm: {printable(c.trace_a)} vs {printable(c.trace_b)} ({c.measures})"]
    if c.sources:
        out.append("sources, estimated by locate and measured by re-running b with settings of a:")
        for s in c.sources:
            cause = ", ".join(printable(x) for x in s.causes_measured) or "-"
            said = ", ".join(printable(x) for x in s.causes_estimated[:2]) or "none named"
            out.append(f"  {s.rank}. {printable(s.ops)} ({printable(s.mechanism)}): estimated "
                       f"{_pct(s.estimated)}, measured {_pct(s.measured)}; cause by "
                       f"experiment: {cause} (locate said: {said}) — {s.verdict}")
    if c.settings:
        out.append("settings (b -> as on a): removed without it / made by it alone:")
        for e in c.settings:
            line = (f"  {printable(e.setting)}: {printable(e.b or 'unset')} -> "
                    f"{printable(e.a or 'unset')}: removes {_pct(e.removal)}"
                    + (f", alone makes {_pct(e.alone)}" if e.alone is not None else ""))
            out.append(line + (f"; {printable(e.interacts)}" if e.interacts else ""))
    if c.residual is not None:
        out.append(f"left with every setting as on a: {_pct(c.residual)} of the difference "
                   f"(what no setting here explains: the machine, a library, the program)")
    by_why = {}
    for key, why in c.unsettable:
        by_why.setdefault(why, []).append(key)
    for why, keys in by_why.items():
        shown = ", ".join(printable(k) for k in keys[:4]) + (f" +{len(keys) - 4} more"
                                                             if len(keys) > 4 else "")
        out.append(f"not re-run: {shown} ({printable(why)})")
    if c.runs:
        out.append(f"runs ({len(c.runs)}" + (f", script {printable(c.script)}" if c.script
                                              else "") + "):")
        for r in c.runs:
            if r.distance is None:
                state = printable(r.error or "not run")
            elif r.alone and r.removal is not None:   # one setting as on b: what it makes
                state = f"distance {r.distance:.3g}, makes {_pct(1 - r.removal)}"
            else:
                state = f"distance {r.distance:.3g}, removes {_pct(r.removal)}"
            out.append(f"  {printable(r.name)}: {state}  ({r.seconds:.1f} s)")
            if r.command:
                out.append(f"    {r.command}")
    if c.skipped_runs:
        out.append(f"{c.skipped_runs} runs left out by --max-runs")
    out += [f"note: {printable(n)}" for n in c.notes]
    return out


def markdown(c: Confirmation) -> str:
    """A report section: the lines in a fence longer than any backtick run in them."""
    from .markdown import _fence

    body = lines(c)
    fence = _fence(body)
    return "\n## Confirmed by runs\n\n" + "\n".join([fence, *body, fence]) + "\n"


def html_section(c: Confirmation) -> str:
    """A report section: the lines, escaped, in a <pre>."""
    import html

    body = "\n".join(html.escape(x, quote=True) for x in lines(c))
    return f"<h2>Confirmed by runs</h2><pre>{body}</pre>"


def to_json(c: Confirmation) -> dict:
    """The JSON form of a Confirmation (docs/json.md)."""
    typed(c, Confirmation)
    return strict(dataclasses.asdict(c))


__all__ = ["lines", "markdown", "html_section", "to_json"]
