"""What a comparison compared and what the analysis found, as plain lines every renderer
escapes and shows: the coverage (per side, why it is not enough for a match, the largest
unpaired regions), the chain from origin to outputs, the replay verdict and the ranked
sources of a difference.
"""

from __future__ import annotations

import dataclasses
import math

from ..diff.explain.mechanisms.summary import FAR_ULP
from ..diff.result import Gap, LocateResult, Replay
from ..untrusted import md_code, md_text
from .numbers import fmt, fmt_bytes


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
    ranked = f"ranked by estimated share{bound}" if not srcs.no_shares else \
        f"in the order they first appear, with no share: {srcs.no_shares}"
    out = [f"sources of the difference, {ranked} "
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
    if len(srcs.sources) > 1 and not srcs.no_shares:
        out.append(("  the initialiser's share is followed to the final parameters; the other "
                    "shares estimate" if srcs.initialiser_followed else "  shares estimate") +
                   " what each source adds where it acts, not how much the program amplifies "
                   "it afterwards: the counterfactual run measures that")
    if srcs.not_judged:
        out.append("  shares are of the measured sources; not measured: " +
                   "; ".join(f"{op} x{n} ({why})" for op, n, why in srcs.not_judged[:4]) +
                   (f"; +{len(srcs.not_judged) - 4} more" if len(srcs.not_judged) > 4 else ""))
    if not details and shown and shown[0].counterfactual:
        out.append("  check source 1 with a counterfactual run:")
        out += [f"    {line}" for line in shown[0].counterfactual]
    return out
