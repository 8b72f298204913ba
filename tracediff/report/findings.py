"""A result in words, shared by the renderers: the typed result they take (never its JSON),
the culprit a report is about, an event's label, site and place, what its inputs say of
a finding, a finding's rows, the first parameter beyond tolerance, and the summary
paragraph. Trace strings go through the renderer's own `code` / `text` functions
(Markdown's by default), so no string from a trace is shown unescaped.
"""

from __future__ import annotations

from ..diff.compare.args import text as args_text
from ..diff.explain.verdict import meaningful_ulp
from ..diff.result import EventRef, Finding, LocateResult
from ..trace import sources
from ..untrusted import md_code, md_text
from .numbers import fmt, fmt_pct


def typed(obj, cls, optional=False):
    """`obj` when it is a `cls` (or None with `optional`); TypeError otherwise: renderers
    take the typed result, never its JSON (`json_report.build`) or another dict."""
    if isinstance(obj, cls) or (optional and obj is None):
        return obj
    raise TypeError(f"expected a {cls.__name__}{' or None' if optional else ''} (as "
                    f"tracediff.locate() returns), got {type(obj).__name__}")


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


def _default_tolerance(result):
    tol = result.tolerance or {}
    return tol.get("rtol") is None and tol.get("atol") is None
