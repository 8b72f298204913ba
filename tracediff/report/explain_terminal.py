"""Terminal rendering of `tracediff explain`: the whole `Analysis` of a divergence.

The origin, the chain from it (collapsed to the hops that matter), the replay verdict with
what this machine replays with and the mechanism that reproduces each side, the compiled-call note, the likely causes, the divergence
over time and the summary. Rich markup: every string from the traces goes through
`untrusted.markup` (shown as typed, no escape sequence).
"""

from __future__ import annotations

from typing import Optional

from rich.console import Console

from ..diff.explain.analysis import short_value
from ..diff.explain.chain import collapse
from ..diff.result import Analysis, Gap
from ..diff.explain.verdict import fmt, ulp_text
from ..untrusted import markup
from .analysis_lines import coverage_text, sources_lines
from .findings import inputs_words, site, typed
from .numbers import ulp_cell, worst_detail


def print_analysis(an: Optional[Analysis], console: Optional[Console] = None) -> None:
    """Print the analysis (None: none could be made, nothing to explain)."""
    typed(an, Analysis, optional=True)
    c = console or Console(highlight=False, soft_wrap=True, emoji=False)
    diverged = an is not None and an.verdict == "diverged"
    o = an.origin if an is not None else None
    st = an.structural if an is not None else None
    if an is not None and an.verdict == "inconclusive":   # locate's headline, word for word
        c.print("[bold yellow]INCONCLUSIVE[/]: no divergence in what was compared, but too "
                "little was compared for a match (exit code 3)")
    else:
        head = "[bold red]DIVERGED[/]" if diverged else "[bold green]MATCH[/]"
        why = "an op only one run has" if st is not None and o is None and \
            not an.origin_write else \
            f"beyond tolerance: {'yes' if diverged else 'no'}"
        c.print(f"{head} ({why})")
    if an is not None and an.origin_write:   # the script's own write only one run executed
        _print_write_origin(c, an)
        return
    if st is not None and o is not None:   # the values differ after the structural difference
        c.print(f"[bold]first difference[/]: {markup(st.text)} (step {st.event.step}, "
                f"{markup(st.side)} #{st.event.index}); the origin below comes after it")
    if o is None:
        c.print(markup((an.summary if an is not None else "") or "nothing to explain"))
        _print_steps(c, an.steps if an is not None else [])
        _print_coverage(c, an)
        return
    a = o.a
    # two frameworks: the layer on both sides, not the unit's last op (Flax's bias `add`
    # for a Dense whose matmul made the difference)
    what = f"[bold]{markup(o.layer['text'])}[/]" if o.layer and o.layer.get("text") else \
        f"{markup(a.framework)} {markup(a.kind)} [bold]{markup(a.op)}[/]"
    c.print(f"[bold]origin[/]: {what} "
            f"(a #{a.index}, b #{o.b.index}"
            f"{', ' + markup(a.origin) if a.origin else ''}), step {a.step}"
            f"{'  ' + markup(a.name_stack) if a.name_stack else ''}"
            f"{'  ' + markup(site(a)) if a.source else ''}"
            f"{'  on ' + markup(a.device) if getattr(a, 'device', '') else ''}")
    if getattr(o, "device_note", ""):
        c.print(f"  devices: {markup(o.device_note)}")
    m = o.metrics
    word, detail = inputs_words(o)   # "introduced here" only on bitwise equal inputs
    word = f"[bold]{word}[/]" if o.introduced else markup(word)
    c.print(f"  {word}: {markup(detail)}; outputs differ by max abs "
            f"{fmt(m.max_abs if m else None)}, max rel {fmt(m.max_rel if m else None)}, "
            f"max ULP {markup(ulp_cell(m))}")
    if o.call is not None:
        c.print(f"  inside compiled call {markup(o.call.op)} (a #{o.call.a})")
    if an.inner is not None:
        c.print(f"  inside {markup(a.op)}: {markup(an.inner.text)}")
    if o.optimizer:
        c.print(f"  optimizer: {markup(o.optimizer)}")
    if an.tolerance_origin is not None:
        t = an.tolerance_origin
        c.print(f"  first beyond tolerance: {markup(t.a.op)} (a #{t.a.index}, step {t.a.step}"
                f"{'; ' + markup(t.optimizer) if t.optimizer else ''}),"
                f" {markup(': '.join(inputs_words(t)))}")
    _print_chain(c, an.chain)
    rv = an.replay
    c.print(f"[bold]replay verdict[/]: {markup(rv.verdict or '-')}")
    if rv.replayed:
        orc = rv.oracle
        mach = rv.machine or {}
        if mach:
            c.print("  this machine: " + ", ".join(
                markup(f"{k} {v if v is not None else '(unset)'}") for k, v in mach.items()))
        if orc:
            c.print(f"  exact reference: {markup(orc.op)} computed by {markup(orc.computed_by)} "
                    f"from {markup(orc.side)}'s recorded inputs")
        for side in ("a", "b"):
            s = getattr(rv, side)
            fo = s.from_oracle
            rep = {True: "reproduced here bitwise", False: "NOT reproduced here",
                   None: "not replayed"}[s.reproduced_here]
            dist = ""
            if fo:
                dist = f"; from exact: {ulp_text(fo)}"
                dist += "" if dist.endswith(f"max rel {fmt(fo.max_rel)}") else \
                    f", max rel {fmt(fo.max_rel)}"
            c.print(f"  {side}: {markup(s.op or '')} {rep}{dist}"
                    f"{' (' + markup(s.reason) + ')' if s.reason else ''}")
    if rv.mechanism:   # diff/explain/mechanisms/
        c.print(f"[bold]mechanism[/]: {markup(rv.mechanism)}")
    if an.compiled_call is not None:
        cc = an.compiled_call
        c.print(f"[bold]compiled-call divergence[/] in {markup(cc.call)}: "
                f"{markup(cc.explanation)}" +
                (f". To narrow it: {markup(cc.narrow)}" if cc.probe is None else ""))
    env = an.environment
    if env.causes:
        c.print(f"[bold]likely causes[/] ({markup(env.op_class)} op; from the recorded environment "
                f"differences, ranked):")
        for i, cause in enumerate(env.causes[:8], 1):
            c.print(f"  {i}. {markup(cause.key)}: {markup(short_value(cause.a))} -> "
                    f"{markup(short_value(cause.b))}  ({markup(cause.reason)})"
                    f"{'  ' + markup(cause.note) if cause.note else ''}")
    elif env.none_found:
        c.print(f"[bold]likely causes[/]: {markup(env.none_found)}")
    for line in sources_lines(an.sources, details=True):   # diff/explain/sources.py
        c.print(markup(line))
    _print_steps(c, an.steps)
    noise = an.noise
    if noise:
        c.print(f"noise floor: {noise.nondeterministic_events} events nondeterministic on a's "
                f"machine; {noise.skipped_total} skipped as origin")
    c.print(f"[bold]summary[/]: {markup(an.summary or '')}")
    _print_coverage(c, an)


def _print_chain(c, chain):
    """The chain's hops, collapsed to those that matter (a view has no amplification)."""
    if chain is None:
        return
    if chain.hops:
        c.print(f"[bold]chain[/] (dataflow from the origin; {chain.hops_total} "
                f"hops; amplification = output rel / input rel):")
        c.print("  [dim]   a #  step  op                          out rel    in rel     ampl.   "
                "role[/]")
        for hop in collapse(chain.hops):
            if isinstance(hop, Gap):
                c.print(f"  [dim]{markup(str(hop))}[/]")
                continue
            e = hop.a
            c.print(f"  {e.index:>6}  {e.step:>4}  {markup(e.op, limit=26):<26}  "
                    f"{fmt(hop.metrics.max_rel):>9}  {fmt(hop.input_rel):>9}  "
                    f"{fmt(hop.amplification):>7}   {markup(hop.role or '')}")
        st = chain.strongest
        if st:
            c.print(f"  strongest: {markup(st.op)} (a #{st.index}) amplified a "
                    f"{fmt(st.input_rel)} difference to {fmt(st.output_rel)}")
        if chain.reaches_target is False:
            c.print("  the first difference beyond tolerance is not reached through the "
                    "recorded dataflow")


def _print_write_origin(c, an):
    """The origin is an in-place write only one run executed (`Analysis.origin_write`): the
    write, what it feeds, the chain of what it changed, and no environment cause."""
    st = an.structural
    e = st.event
    c.print(f"[bold]origin[/]: {markup(e.framework)} {markup(e.kind)} [bold]{markup(e.op)}[/] "
            f"(only in {markup(st.side)}, {markup(st.side)} #{e.index}), step {e.step}"
            f"{', rank ' + str(e.rank) if e.rank is not None else ''}"
            f"{'  ' + markup(site(e)) if e.source else ''}")
    feeds = ", ".join(f"{x.op} ({st.side} #{x.index})" for x in st.consumers[:3])
    c.print(f"  [bold]an in-place write only {markup(st.side)} executed[/]: it changed the "
            f"values {markup(feeds or 'that follow')} read")
    _print_chain(c, an.chain)
    c.print(f"[bold]likely causes[/]: {markup(an.environment.none_found or '-')}")
    for line in sources_lines(an.sources, details=True):   # diff/explain/sources.py
        c.print(markup(line))
    _print_steps(c, an.steps)
    c.print(f"[bold]summary[/]: {markup(an.summary or '')}")
    _print_coverage(c, an)


def _print_coverage(c, an):
    """What was compared, as locate prints it beside the same verdict."""
    for line in coverage_text(an.coverage if an is not None else None,
                              an.verdict if an is not None else "match"):
        c.print(markup(line))


def _print_steps(c, steps):
    """Per step: the parameters' relative L2 and max abs (max rel is set by near-zero
    elements), and the loss only where the trace names it (`steps.loss_events`)."""
    if not steps:
        return
    loss = next((s.loss for s in steps if s.loss is not None), None)
    c.print("[bold]divergence over time[/] (per optimizer step; parameters after the step: relative L2 = "
            "||a-b||/||a||" + (f"; loss = the scalar {markup(loss.how)}, "
                               f"{markup(loss.op)}{' at ' + markup(loss.source) if loss.source else ''}"
                               if loss is not None and loss.how else "") + "):")
    c.print("  [dim]step  params rel L2   max abs    worst (own rel L2, max abs)                                      "
            + ("loss a            loss b            loss rel" if loss is not None else "") + "[/]")
    shown = steps if len(steps) <= 30 else steps[:10] + steps[-10:]
    for i, s in enumerate(shown):
        if len(steps) > 30 and i == 10:
            c.print(f"  ... {len(steps) - 20} steps")
        opt, ls = s.optimizer, s.loss
        worst = f"{opt.worst}{worst_detail(opt)}" if opt is not None and opt.worst else "-"
        line = (f"  {s.step:>4}  {fmt(opt.rel_l2 if opt else None):>13}  "
                f"{fmt(opt.max_abs if opt else None):>9}  {markup(worst, limit=64):<64} ")
        if loss is not None:
            line += (f"{_fmt17(ls.a if ls else None):>17} {_fmt17(ls.b if ls else None):>17} "
                     f"{fmt(ls.rel if ls else None):>9}")
        c.print(line.rstrip())


def _fmt17(x):
    return "-" if x is None else f"{x:.12g}"
