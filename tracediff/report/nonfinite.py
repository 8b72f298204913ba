"""Where a trace's NaN or Inf came from (`NonFinite`, `NonFiniteRanks`), in plain lines that
every renderer escapes its own way: `info` and the head of `locate` through
`untrusted.markup` (`markup_lines`), the Markdown report in a fence, the HTML report in a
`<pre>` (both through `untrusted.printable`)."""

from __future__ import annotations

from ..diff.result import EventRef, LocateResult
from ..diff.result.nonfinite import NonFinite, NonFiniteRanks
from ..untrusted import markup
from .findings import site, typed
from .numbers import fmt

LEVEL_WORDS = {"statistics": "found from the statistics of a --level stats trace (NaN and Inf "
                             "counts, min, max); --level full gives the element and its values",
               "calls": "recorded at --level calls: only jit calls and optimizer steps"}
CHAIN_SHOWN = 6   # events of the chain from the origin to the first NaN, the rest counted


def _event(e: EventRef) -> str:
    """"aten::log (forward) step 3  t.py:9  module rnn.gru" with the device and rank."""
    parts = [f"{e.op} ({e.phase}{', ' + e.node if e.node and e.kind == 'op' else ''}) "
             f"step {e.step}"]
    where = site(e)
    if where:
        parts.append(where)
    if e.name_stack:
        parts.append(f"module {e.name_stack}")
    if e.device:
        parts.append(f"device {e.device}")
    if e.rank is not None:
        parts.append(f"rank {e.rank}")
    return "  ".join(parts) + f"  (event #{e.index})"


def _inputs_words(nf: NonFinite) -> str:
    if nf.received:
        return "not made here"
    if nf.inputs_finite is True:
        return "origin: its inputs are finite"
    if nf.inputs_finite is False:
        return "origin: it reads non-finite values that no recorded op made"
    return "origin as far as recorded: an input's values were not recorded"


def _chain(nf: NonFinite) -> str:
    steps = nf.chain
    if len(steps) > CHAIN_SHOWN:
        steps = steps[:CHAIN_SHOWN - 2] + [None] + steps[-1:]
    out = []
    for s in steps:
        if s is None:
            out.append(f"({len(nf.chain) - CHAIN_SHOWN + 1} more)")
        else:
            out.append(f"{s.event.op} #{s.event.index} ({s.made})")
    return " -> ".join(out)


def nonfinite_lines(nf: NonFinite, title="first non-finite") -> list:
    """The plain lines `info` prints (and `locate` under its headline) for one trace."""
    typed(nf, NonFinite)
    if not nf.kept:
        o = nf.origin
        n = nf.absorbed + 1
        return [f"{title.replace('first non-finite', 'no NaN or Inf reaches the results')}: "
                f"{n} op{'s' if n > 1 else ''} made non-finite values that later ops absorbed "
                f"(masked or selected away); first: {_event(o)}: {nf.mechanism}"]
    count = f"{nf.made}: {fmt(nf.nan + nf.inf)} of {fmt(nf.elements)} elements"
    lines = [f"{title}: {_event(nf.origin)}  {count}",
             f"  {_inputs_words(nf)}: {nf.mechanism}"]
    if nf.element:
        lines.append(f"  {nf.element}")
    if nf.nan_at is not None:
        lines.append(f"  Inf becomes NaN at {_event(nf.nan_at)}: {nf.nan_mechanism}")
        lines.append(f"  chain: {_chain(nf)}")
    kept = nf.kept_at
    if kept is not None and kept.index != nf.origin.index:
        lines.append(f"  kept by the run: reaches {kept.op} ({kept.phase}) step {kept.step} "
                     f"(event #{kept.index}); {fmt(nf.events_nonfinite)} events hold "
                     f"non-finite values in all")
    if nf.absorbed:
        first = nf.first_absorbed
        lines.append(f"  before it, {nf.absorbed} op{'s' if nf.absorbed > 1 else ''} made "
                     f"non-finite values that later ops absorbed (masked or selected away; "
                     f"first: {first.op} step {first.step}, event #{first.index})")
    if nf.level in LEVEL_WORDS:
        lines.append(f"  {LEVEL_WORDS[nf.level]}")
    if nf.note:
        lines.append(f"  note: {nf.note}")
    if nf.zoom:
        lines.append(f"  to name the op, record step {nf.origin.step} again with every op's "
                     f"values: {nf.zoom}")
    return lines


def result_lines(r: LocateResult) -> list:
    """Plain lines of a locate result's `nonfinite`: each side's origin (once for one
    trace of two frameworks), the side that alone holds NaN or Inf first."""
    if r.nonfinite is None:
        return []
    only = r.nonfinite_only
    keys = sorted(r.nonfinite, key=lambda k: k != only)
    out = []
    for key in keys:
        nf = r.nonfinite[key]
        if nf is None or (key == "b" and nf is r.nonfinite.get("a")):
            continue
        other = "a" if key == "b" else "b"
        title = (f"{key} holds NaN or Inf that {other} has not; its first non-finite"
                 if key == only else
                 f"{'the trace' if r.path_a == r.path_b else key}: first non-finite")
        out += nonfinite_lines(nf, title)
    return out


def ranks_lines(r: NonFiniteRanks) -> list:
    """`info DIR`: each rank's origin, and the rank it started on (plain lines)."""
    typed(r, NonFiniteRanks)
    lines = []
    if r.first_rank is not None:
        lines.append(f"non-finite values start on rank {r.first_rank}")
    for rank, nf in sorted(r.ranks.items()):
        if nf is None:
            lines.append(f"rank {rank}: every recorded value is finite")
            continue
        lines += nonfinite_lines(nf, title=f"rank {rank}, first non-finite")
    if r.note:
        lines.append(f"note: {r.note}")
    return lines


def markup_lines(lines) -> list:
    """Plain lines as rich markup for the terminal: escaped, the first one bold red."""
    return [f"[bold red]{markup(x)}[/]" if i == 0 else markup(x) for i, x in enumerate(lines)]
