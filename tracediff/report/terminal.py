"""Terminal rendering of a `locate` result: short and pasteable into a bug report.

Short by default; `verbose=True` (`tracediff locate --verbose`) adds the user's source
lines, per-output metrics, the optimizer-step table, every environment difference and
the alignment gaps. The replay verdict ("explain") and the chain from origin to outputs
("chain") are printed when the result carries them. rich honours NO_COLOR and
non-terminal output on its own.

The output is rich markup: every string that comes from a trace (or a file name) goes
through `untrusted.markup`, so it is shown as typed, with control characters as `\\xNN`:
no terminal escape, hyperlink or markup from a trace reaches the terminal.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
from rich.console import Console

from ..diff.result import Finding, Gap, LocateResult
from ..untrusted import markup
from .analysis_lines import coverage_lines, sources_lines
from .findings import args_text, inputs_words, site, typed
from .numbers import ulp_cell
from .json_report import next_steps
from .nonfinite import markup_lines, result_lines

MAX_ENV = 15
SOURCES_SHOWN = 5   # sources under the first difference; `explain` prints them all
MAX_PAIRS = 12
MAX_ENV_SHORT = 8


def _worst(step):
    """" (relative L2 X, max abs Y)" of the step's worst parameter (its own ||a-b||/||a||)."""
    return "" if step.worst_rel_l2 is None else \
        f" (relative L2 {_fmt(step.worst_rel_l2)}, max abs {_fmt(step.worst_max_abs)})"


def _unmeasured(s):
    """A step whose differing parameters were recorded without bytes (--level stats/calls):
    only what the statistics prove, never a figure that reads as "0"; None when measured."""
    if not s.max_abs_is_lower_bound:
        return None
    return f"hashes differ, recorded without bytes: max abs at least {_fmt(s.max_abs)}, the rest unknown"


def _fmt(x):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        if x == 0:
            return "0"
        if float(x).is_integer() and abs(x) < 1e15:
            return str(int(x))
        return f"{x:.3g}"
    return str(x)


def _value(x):
    """A recorded number as its shortest repr (float32 values as float32: 0.1, not
    0.10000000149011612; inf, nan)."""
    if not isinstance(x, float):
        return markup(str(x))
    return str(np.float32(x)) if math.isfinite(x) and float(np.float32(x)) == x else repr(x)


def _where(e):
    parts = [f"{markup(e.framework)} {markup(e.kind)} [bold]{markup(e.op)}[/]"]
    if e.phase and e.kind == "op":
        parts.append(f"({markup(e.phase)}{', ' + markup(e.node) if e.node else ''})")
    parts.append(f"step {markup(e.step)}")
    if e.rank is not None:
        parts.append(f"rank {markup(e.rank)}")
    return " ".join(parts)


def _shapes(e):
    return markup(", ".join(f"{d}{s}" for d, s in zip(e.dtypes, e.shapes)) or "-")


def _what(f):
    """The op, or for two frameworks the layer on both sides (Finding.layer)."""
    if f.layer and f.layer.get("text"):
        return f"[bold]{markup(f.layer['text'])}[/] step {markup(f.a.step)}"
    return _where(f.a)


def _finding(console, title, f: Finding, verbose=False, context=None):
    console.print(f"[bold]{title}[/]: {_what(f)}  (a #{f.a.index}, b #{f.b.index}"
                  f"{', ' + markup(f.origin) if f.origin else ''})")
    if f.dtype_note:   # a dtype change explains a difference before anything else does
        console.print(f"  [bold]dtype[/]: {markup(f.dtype_note)}")
    if f.a.name_stack or f.b.name_stack:
        ns = markup(f.a.name_stack or "-")
        if f.b.name_stack and f.b.name_stack != f.a.name_stack:
            ns += f"  |  b: {markup(f.b.name_stack)}"
        console.print(f"  name stack: {ns}")
    if f.a.source or f.b.source:
        src = markup(site(f.a) or "-")
        if f.b.source and site(f.b) != site(f.a):
            src += f"  |  b: {markup(site(f.b))}"
        console.print(f"  source: {src}")
        if verbose and f.a.source and context is not None:
            _code(console, context(f.a.source))
    if f.a.device or f.b.device:
        dev = markup(f.a.device or "-")
        if f.b.device and f.b.device != f.a.device:
            dev += f"  |  b: {markup(f.b.device)}"
        console.print(f"  device: {dev}")
    if f.device_note:
        console.print(f"  devices: {markup(f.device_note)}")
    if f.optimizer:
        console.print(f"  optimizer: {markup(f.optimizer)}")
    if f.arguments:   # the op's non-tensor arguments that differ (diff/compare/args.py)
        console.print(f"  [bold]arguments differ[/]: {markup(args_text(f.arguments))}")
    if f.b.op != f.a.op or f.b.framework != f.a.framework:
        console.print(f"  paired with b: {_where(f.b)} (by {markup(f.pair_by)})")
    m = f.metrics
    console.print(f"  outputs: a {_shapes(f.a)}   b {_shapes(f.b)}" + (
        f"   worst element: {_value(m.worst_a)} vs {_value(m.worst_b)}"
        if m is not None and m.worst_a is not None and m.worst_b is not None else ""))
    if m is not None:
        console.print(f"  max abs {_fmt(m.max_abs)}  max rel {_fmt(m.max_rel)}  "
                      f"max ulp {markup(ulp_cell(m, _fmt))}  mismatched "
                      f"{_pct(m.mismatch_fraction)}% of elements (beyond tolerance "
                      f"{_pct(m.beyond_tolerance_fraction)}%)")
    if verbose and len(f.values) > 1:
        for v in f.values[:16]:
            vm = v.metrics
            desc = v.a or v.b
            state = ("not compared" if not v.compared else
                     "equal" if vm is not None and vm.bitwise_equal else
                     f"max rel {_fmt(vm.max_rel if vm else None)}, "
                     f"max ulp {ulp_cell(vm, _fmt)}")
            dtype, shape = (desc.dtype, desc.shape) if desc is not None else (None, None)
            console.print(f"    output {markup(v.key)} "
                          f"{markup(str(dtype) + str(shape))}: {markup(state)}")
    word, detail = inputs_words(f)   # "introduced here" only on bitwise equal inputs
    console.print(f"  {'[bold]' + word + '[/]' if f.introduced else markup(word)}: "
                  f"{markup(detail)}")
    if f.call is not None:
        console.print(f"  inside compiled call {markup(f.call.op)} (a #{f.call.a}, b #{f.call.b})")
    if f.note:
        console.print(f"  note: {markup(f.note)}")


def _code(console, ctx):
    """The lines trace a recorded around the source (`source_context.source_context`)."""
    if ctx is None:
        return
    from .source_context import NO_LINES

    for no, text in ctx["lines"]:
        mark = "[bold red]>[/]" if no == ctx["line"] else " "
        console.print(f"    {mark}{no:>5}  {markup(text, 300)}")
    if not ctx["found"]:
        console.print(f"    ({NO_LINES})")
    if ctx.get("note"):
        console.print(f"    ({markup(ctx['note'])})")


def _pct(x):
    return _fmt(100 * x) if isinstance(x, float) else "-"


def _first_parameter(console, p):
    """The first parameter beyond tolerance across frameworks (the optimizer by role)."""
    role = "after the step" if p.role == "params" else p.role
    up = {True: "; its grads and optimizer state match", False: "",
          None: ""}[p.upstream_match if p.role == "params" else None]
    console.print(f"[bold]first parameter beyond tolerance[/]: step {p.step}, "
                  f"{markup(p.parameter)} ({markup(role)}): a {markup(p.a)} <-> b {markup(p.b)}; "
                  f"relative L2 {_fmt(p.rel_l2)} (rtol {_fmt(p.rtol)}), max abs "
                  f"{_fmt(p.max_abs)}{up}")
    if p.note:
        console.print(f"  {markup(p.note)}")


def print_locate(r: LocateResult, console: Optional[Console] = None, verbose: bool = False,
                 source_dir: Optional[str] = None) -> None:
    """Print `r` (a locate result). With `verbose`, the culprit's code as trace a recorded
    it; `source_dir` (`--source-dir`): from that folder when the file's sha256 matches."""
    typed(r, LocateResult)
    console = console or Console(highlight=False, soft_wrap=True, emoji=False)
    context_a = (lambda src: _source_context(r.path_a, src, source_dir)) if verbose else None
    a, b = r.traces["a"], r.traces["b"]
    if r.verdict == "match":
        head = "[bold green]MATCH[/]: no divergence beyond tolerance"
        if r.first_difference is not None:
            head += " (but bitwise differences exist)"
    elif r.verdict == "inconclusive":
        head = ("[bold yellow]INCONCLUSIVE[/]: no divergence in what was compared, but too "
                "little was compared for a match (exit code 3)")
    else:
        head = "[bold red]DIVERGED[/]"
    side = lambda t: f" ({markup(t.framework)})" if t.framework else ""  # noqa: E731
    console.print(f"{head}   a={markup(a.path)}{side(a)}  b={markup(b.path)}{side(b)}")
    only = r.nonfinite_only
    if only is not None:   # the first thing a user asks: where did b's NaN come from
        for line in markup_lines(result_lines(r)):
            console.print(line)
    tol = r.tolerance
    tol_txt = ("per-dtype defaults" if tol.get("rtol") is None and tol.get("atol") is None else
               f"rtol {tol.get('rtol') if tol.get('rtol') is not None else 'default'}, "
               f"atol {tol.get('atol') if tol.get('atol') is not None else 'default'}")
    st = r.structural
    if st is not None:
        users = ", ".join(f"{markup(e.op)} ({side} #{e.index})" for e, side in
                          ((e, st.side) for e in st.consumers[:3]))
        console.print(f"[bold]{'first difference' if st.first else 'structural difference'}[/]: "
                      f"{markup(st.text)} (step {markup(st.event.step)}, {st.side} #{st.event.index}"
                      f"; {st.gap.get('length', 1)} events only in {st.side} from "
                      f"#{st.gap.get('start', st.event.index)})"
                      + (f"; feeds {users}" if users else ""))
    if r.first_beyond_tolerance is not None:
        _finding(console, f"first divergence beyond tolerance ({tol_txt})",
                 r.first_beyond_tolerance, verbose, context_a)
    fd = r.first_difference
    if fd is not None:
        same = (r.first_beyond_tolerance is not None and
                fd.a.index == r.first_beyond_tolerance.a.index)
        if same:
            console.print("first bitwise difference: the same event")
        elif r.first_beyond_tolerance is not None and not verbose:
            # short form: the beyond-tolerance finding above is the main one
            fm = fd.metrics
            word = inputs_words(fd)[0]
            console.print(f"[bold]first bitwise difference[/] (earlier, within tolerance): "
                          f"{_what(fd)}  (a #{fd.a.index}, b #{fd.b.index}"
                          f"{', ' + markup(fd.origin) if fd.origin else ''})"
                          f"{'  ' + markup(site(fd.a)) if fd.a.source else ''}; "
                          f"max abs {_fmt(fm.max_abs if fm else None)}, max rel "
                          f"{_fmt(fm.max_rel if fm else None)}, max ulp {markup(ulp_cell(fm, _fmt))}, "
                          f"{word}  [dim](-v for details)[/]")
        else:
            _finding(console, "first bitwise difference", fd, verbose, context_a)
    elif r.first_beyond_tolerance is None:
        console.print("every compared value is bitwise identical")
    if r.first_parameter is not None:
        _first_parameter(console, r.first_parameter)
    if r.near_zero is not None:   # passed over by the tolerance search (nearzero.py)
        f, fm = r.near_zero, r.near_zero.metrics
        more = r.near_zero_total - 1
        console.print(f"[bold]rounding noise around zero[/] (not counted as beyond tolerance): "
                      f"{_where(f.a)} (a #{f.a.index}, b #{f.b.index})"
                      f"{'  ' + markup(f.optimizer) if f.optimizer else ''}; max abs "
                      f"{_fmt(fm.max_abs if fm else None)}, max rel "
                      f"{_fmt(fm.max_rel if fm else None)}: {markup(f.note.split(': ', 1)[-1])}"
                      f"{f'; {more} more event(s) carry it on' if more > 0 else ''}")
    if r.absorbed is not None:   # passed over: overwritten before anything read it (search.py)
        f, more = r.absorbed, r.absorbed_total - 1
        console.print(f"[bold]a difference that never reached the outputs[/] (not the first "
                      f"difference): {_where(f.a)} (a #{f.a.index}, b #{f.b.index}): "
                      f"{markup(f.note)}{f'; {more} more like it' if more > 0 else ''}")
    if r.replay_only is not None and r.first_beyond_tolerance is None:
        f = r.replay_only
        console.print(f"replay-only difference beyond tolerance (not seen by the script): "
                      f"{_where(f.a)} (a #{f.a.index})")
    _extras(console, r, verbose)
    if r.nonfinite is not None and only is None:
        for key, nf in r.nonfinite.items():
            if nf is not None and (key == "a" or nf is not r.nonfinite["a"]):
                o = nf.origin
                console.print(f"non-finite values in {key if r.path_a != r.path_b else 'the trace'}: "
                              f"first made by {markup(o.op)} ({markup(o.phase)}) step {o.step} "
                              f"(#{o.index}), {nf.made}: {markup(nf.mechanism)}")
    al = r.alignment
    console.print(f"alignment: {al['matched']} {markup(al.get('counted') or 'events')} matched; "
                  f"a {al['events_a']} "
                  f"({al['only_in_a']} only in a), b {al['events_b']} ({al['only_in_b']} only in b)"
                  f"{'; ' + str(al['fallback_regions']) + ' regions aligned by fallback' if al.get('fallback_regions') else ''}")
    for line in coverage_lines(r):
        console.print(markup(line))
    if verbose and r.gaps:
        for g in r.gaps[:20]:
            console.print(f"  gap: {markup(str(g))}")
    if r.mapping:
        by = {}
        for m in r.mapping:
            by[m["by"]] = by.get(m["by"], 0) + 1
        console.print("pairs matched by: " + ", ".join(f"{markup(k)} {v}" for k, v in sorted(by.items())))
        for m in r.mapping[:MAX_PAIRS]:
            a_ns, b_ns = m["a_name_stack"] or "-", m["b_name_stack"] or "-"
            console.print(f"  a #{m['a']} {markup(m['a_op'])} {markup(f'[{a_ns}]')} <-> "
                          f"b #{m['b']} {markup(m['b_op'])} {markup(f'[{b_ns}]')}  "
                          f"({markup(m['family'])}, by {markup(m['by'])})")
        if len(r.mapping) > MAX_PAIRS:
            console.print(f"  ... {len(r.mapping) - MAX_PAIRS} more pairs (--json for all)")
        _module_names(console, r.mapping)
    if r.optimizer_steps:
        diff = [s for s in r.optimizer_steps if not s.bitwise_equal]
        if diff:
            s0 = diff[0]
            last = r.optimizer_steps[-1]
            worst = f"worst {markup(str(s0.worst))}{_worst(s0)}"
            size = (f"{_unmeasured(s0)}; {worst}" if _unmeasured(s0) else
                    f"relative L2 {_fmt(s0.rel_l2)}, max abs {_fmt(s0.max_abs)}; {worst}; max rel "
                    f"{_fmt(s0.max_rel)}")
            console.print(f"optimizer steps: {r.optimizer_steps_total} compared (parameters after each "
                          f"step); parameters first "
                          f"differ after step {s0.step} ({size}); last step "
                          f"{last.step}: {_unmeasured(last) or f'relative L2 {_fmt(last.rel_l2)}, max abs {_fmt(last.max_abs)}'}")
        else:
            console.print(f"optimizer steps: {r.optimizer_steps_total} compared, parameters "
                          f"bitwise identical")
        und = next((s for s in r.optimizer_steps if s.undetermined), None)
        if und is not None:
            console.print(f"  undetermined from step {und.step}: {markup(', '.join(und.undetermined))} "
                          f"(they differ only where their grads are rounding noise, which the optimizer's "
                          f"normalisation makes steps of their own: not judged)")
        shf = next((s for s in r.optimizer_steps if s.shifted), None)
        if shf is not None:
            console.print(f"  grads from step {shf.step} computed from undetermined parameters: "
                          f"{markup(', '.join(shf.shifted))} (beyond tolerance by what those "
                          f"parameters shift: not judged; a port's backward differs at the first "
                          f"step already)")
        if verbose and diff:
            for s in r.optimizer_steps:
                console.print(f"  step {s.step:>5}  "
                              f"{'equal' if s.bitwise_equal else _unmeasured(s) or 'relative L2 ' + _fmt(s.rel_l2) + ', max abs ' + _fmt(s.max_abs) + ', max rel ' + _fmt(s.max_rel)}"
                              f"{'' if s.bitwise_equal else '  in ' + markup(str(s.worst)) + _worst(s)}")
    if r.env_diff:
        console.print("environment differences (a -> b):")
        limit = len(r.env_diff) if verbose else MAX_ENV_SHORT
        for e in r.env_diff[:limit]:
            console.print(f"  {markup(e['category']):<12} {markup(e['key'])}: {_fmt_env(e['a'])} -> "
                          f"{_fmt_env(e['b'])}")
        if len(r.env_diff) > limit:
            console.print(f"  ... {len(r.env_diff) - limit} more (--verbose or --json for all)")
    else:
        console.print("environment: no differences in the manifests")
    steps = next_steps(r)
    if steps:
        console.print("next steps:")
        for s in steps:
            console.print(f"  {markup(s)}")


def _fmt_env(v):
    """An environment value as markup, one line of at most 80 characters."""
    return markup("(unset)" if v is None else v, limit=80)


def _source_context(path, source, source_dir=None):
    from ..trace.reader import Trace
    from .source_context import source_context

    try:
        with Trace(path) as t:
            recorded, manifest = t.source_lines(source), t.manifest
    except Exception:  # context only: never fail the report over it
        recorded = manifest = None
    return source_context(source, recorded, source_dir, manifest)


def _module_names(console, mapping, limit=4):
    """Across frameworks: the naming rules under which the paired modules' paths agree
    (the mapping used, no --map needed), and the pairs whose values cross names."""
    rules, named, crossed = {}, set(), {}
    for m in mapping:
        if m.get("module_rule") and m.get("a_module") and m.get("b_module"):
            named.add((m["a_module"], m["b_module"]))
            for rule in str(m["module_rule"]).split("; "):
                rules[rule] = rules.get(rule, 0) + 1
        if m.get("names_cross"):
            crossed.setdefault((m.get("a_name_stack"), m.get("b_name_stack")), m["names_cross"])
    if named:
        console.print(f"modules paired by name: {len(named)} "
                      f"({markup(', '.join(sorted(rules)))})")
    for (ma, mb), text in list(crossed.items())[:limit]:
        console.print(f"  [bold yellow]names cross[/]: {markup(text)}  "
                      f"(a {markup(ma or '-')} <-> b {markup(mb or '-')})")
    if len(crossed) > limit:
        console.print(f"  ... {len(crossed) - limit} more module pairs across names (--json)")


def _extras(console, r, verbose=False):
    """The replay verdict and the chain origin -> outputs, when the result has them."""
    if r.explain is not None:
        head = r.explain.verdict or r.explain.summary
        console.print(f"[bold]replay verdict[/]: {markup(str(head))}")
        if r.explain.mechanism:   # diff/explain/mechanisms/
            console.print(f"[bold]mechanism[/]: {markup(r.explain.mechanism)}")
    if r.chain:
        # short: the hops with a role (origin, first beyond tolerance, last), the others
        # counted; verbose: every hop the result holds
        shown, skipped = [], 0
        for hop in r.chain:
            if isinstance(hop, Gap):
                if verbose:
                    shown.append(str(hop))
                else:
                    skipped += hop.hops
                continue
            if not verbose and not hop.role:
                skipped += 1
                continue
            if skipped:
                shown.append(f"({skipped} hops)")
                skipped = 0
            shown.append(f"{hop.a.op} #{hop.a.index}")  # escaped below
        if skipped:
            shown.append(f"({skipped} hops)")
        console.print("chain: " + " [dim]->[/] ".join(markup(n) for n in shown))
    for line in sources_lines(r.sources, limit=SOURCES_SHOWN):   # diff/explain/sources.py
        console.print(markup(line))
