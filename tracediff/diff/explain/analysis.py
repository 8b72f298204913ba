"""Root cause of a divergence: the whole of `tracediff explain`, and locate's short form.

`analyse(result, differ, event=None)` returns an `Analysis`; `short(analysis)` is the part
`locate` adds to its own result (`explain`: a `Replay`, `chain`: the chain collapsed).
It puts together what the modules beside it compute:

* origin: the event to explain (EVENT, or the first bitwise difference when its inputs
  match, else the first difference beyond tolerance when its inputs do: the op that
  introduced it). Never a view (`align.structure.is_view`: it only reinterprets bytes);
  an in-place write only one run executed (`p.to_local().mul_`, the structural first
  difference) is the origin itself: the script's own op changed the values (issue 51).
* chain (`explain/chain.py`): dataflow path origin -> first beyond tolerance -> last differing
  event, with the amplification at each hop.
* replay (`explain/verdict.py`): the origin op re-executed here from each side's inputs; which
  side is closer to the exact result, which one this machine reproduces; the mechanism
  hypotheses (`explain/mechanisms/`) that name how each side computed its value.
* compiled call / inner structure: a divergence no single replayed equation explains,
  and how the equations inside a jit origin pair up.
* environment (`explain/causes.py`): the manifest differences that can change this kind of op.
* steps (`explain/steps.py`): parameters and loss per optimizer step.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from ...errors import TraceError
from ...shell import command
from . import chain as _chain
from ..align.structure import is_inplace_write, is_view
from ..compare import levels as _levels
from .causes import bf16_pass_cause, environment
from .replay.params import parse_params
from ..result import (Analysis, Causes, Chain, CompiledCall, Finding, Inner, LocateResult,
                      Replay)
from .steps import steps_table
from .verdict import fmt, local_errors, meaningful_ulp, replay_verdict


def _culprit(result):
    """The origin to explain: the first bitwise difference when it is introduced there
    (inputs bitwise equal), else the first difference beyond tolerance when it is (its
    inputs bitwise equal too: inputs within tolerance that differ bitwise carry a
    difference in, `Finding.introduced`), else the first difference. Never a view whose
    arguments are equal: it moves the bytes it is given, what wrote them changed the values
    (None: only such views)."""
    f, fd = result.first_beyond_tolerance, result.first_difference
    ordered = [x for x in (fd, f) if x is not None and x.introduced] + [fd, f]
    return next((x for x in ordered if x is not None and not _reinterprets(x)), None)


def _reinterprets(f: Finding) -> bool:
    """A view that only reinterprets what it reads: its arguments are equal on both sides
    (a slice that starts elsewhere selects other values: it is an origin)."""
    return is_view(f.a.op) and not f.arguments


def _view_text(result) -> str:
    """Why there is no origin where the values first differ at a view."""
    v = result.first_difference or result.first_beyond_tolerance
    return (f"the values first differ at {v.a.op} (a #{v.a.index}, step {v.a.step}), a view "
            f"that only reinterprets the bytes it is given: they were changed before it, by a "
            f"write (an in-place op) the trace does not show as differing")


def with_local_error(d, f: Optional[Finding]) -> Optional[Finding]:
    """The finding with `local_error` (`verdict.local_errors`) where its inputs are within
    tolerance but differ bitwise: how much of its difference the op adds itself."""
    if f is None or f.inputs_match is not True or f.inputs_bitwise is not False or \
            f.local_error is not None:
        return f
    try:
        local = local_errors(d, f.a.index, f.b.index)
    except Exception:   # never fail the analysis over it
        local = None
    return f if local is None else dataclasses.replace(f, local_error=local)


def structural_text(st) -> str:
    """One sentence on a structural first difference (`Structural`): which run executed
    which op where, and what it feeds."""
    e = st.event
    other = "a" if st.side == "b" else "b"
    feeds = ", ".join(f"{c.op} ({st.side} #{c.index})" for c in st.consumers[:3])
    return (f"the first difference is structural: {st.text} (step {e.step}, {st.side} "
            f"#{e.index}), an op the run recorded as {other} did not execute; it changes the "
            f"inputs of {feeds or 'what follows'}")


# no origin and too little compared (diff/coverage.py): nothing is claimed to match
INCONCLUSIVE = ("every compared value is bitwise identical, but too little was compared for "
                "a match: nothing to explain")


def analyse(result: LocateResult, d, event: Optional[int] = None) -> Analysis:
    """The full analysis of a located result (see the module docstring); `event`: an
    event of trace a to explain instead of the origin."""
    out = Analysis(verdict=result.verdict, traces=result.traces, tolerance=result.tolerance,
                   structural=result.structural if event is None else None,
                   coverage=result.coverage)
    if event is not None:
        if not 0 <= event < len(d.ta):
            raise TraceError(f"no event {event} in trace a (it has events 0 to {len(d.ta) - 1})")
        eb = int(d.al.a2b[event])
        if eb < 0:
            raise TraceError(f"event {event} of a has no counterpart in b (the runs executed "
                             f"different ops there); pick a paired event")
        f = d.finding(event, eb, "bitwise")
        f.note = "chosen on the command line"
    elif result.structural is not None and is_inplace_write(result.structural.event.op):
        return _write_origin(out, result, d)
    else:
        f = _culprit(result)
    if f is None:
        out.summary = _view_text(result) if result.verdict == "diverged" and (
            result.first_difference or result.first_beyond_tolerance) else \
            structural_text(out.structural) + "; every compared value is bitwise " \
            "identical: no op's values to replay" if out.structural is not None else \
            INCONCLUSIVE if result.verdict == "inconclusive" else \
            "the traces match bitwise: nothing to explain"
        out.steps = steps_table(d, result)
        return out
    ea, eb = f.a.index, f.b.index
    out.origin = f = with_local_error(d, f)
    fb = result.first_beyond_tolerance
    target = fb.a.index if fb is not None else None
    try:
        out.chain = _chain.build(d, ea, target)
    except Exception as exc:  # never fail the analysis over the chain
        out.chain = Chain(error=f"{type(exc).__name__}: {exc}"[:200])
    out.replay = rv = replay_verdict(d, ea, eb)
    out.mechanisms = rv.mechanisms   # diff/explain/mechanisms/: how each side computed its value
    if f.compiled:
        step = int(f.a.step)
        probe = command("tracediff", "record", "--probe", _levels.probe_pattern(f.a.op),
                        "--steps", f"{step}:{step + 1}")
        out.compiled_call = CompiledCall(
            call=f.a.op, event=ea,
            explanation="the compiled outputs differ while every replayed equation matches: "
                        "the difference comes from how the program was compiled (fusion, "
                        "algebraic rewrites, fast math), not from any single op",
            narrow=f"record the call's compiled probe on both machines ({probe} ..., the "
                   f"commands are in locate's next steps) and locate again: it names "
                   f"the equation whose compiled value differs"
                   if f.compiled == "replay matches" else
                   "done: the call's compiled probe was recorded on both sides and matches, so "
                   "the difference lies in how the whole program was fused, not in any one "
                   "equation's compiled value")
    elif f.call is not None and f.call.probe_a is not None:
        alone = {"a": "b's", "b": "a's"}.get(rv.reproduces)
        out.compiled_call = CompiledCall(
            call=f.call.op, event=f.call.a, probe=f.call.probe_a,
            narrowed_op=f.a.op, narrowed_event=ea,
            explanation=f"every replayed equation of {f.call.op} matches; its compiled "
                        f"probe narrows the difference to {f.a.op} (a #{ea}), whose "
                        f"compiled value differs while its inputs match" +
                        (f". Run alone, {f.a.op} gives {rv.reproduces}'s value here: "
                         f"{alone} compiled program computes it differently (fused with "
                         f"its neighbours, e.g. a multiply-add contracted into one FMA, "
                         f"or vectorised code that rounds differently)" if alone else ""),
            narrow="done: the probe values are compiled intermediates (origin probe)")
    if f.a.kind in ("eqn", "call") and f.a.op.startswith("jit:"):
        out.inner = _inner_structure(d, ea, eb)
    env_op, env_fw = f.a.op, f.a.framework
    if rv.oracle is not None and rv.oracle.side == "b":   # b's op covers more (addmm vs add)
        env_op, env_fw = f.b.op, f.b.framework
    out.environment = environment(result.env_diff, env_op, env_fw, f.inputs_match, rv,
                                  out.inner)
    _device_numerics(out.environment, d, rv)
    if fb is not None and fb.a.index != ea and fb.inputs_match is True and \
            not is_view(fb.a.op):   # a view magnifies nothing
        out.tolerance_origin = with_local_error(d, fb)
    out.steps = steps_table(d, result)
    out.noise = result.noise
    out.summary = _summary(out, f)
    return out


def _write_origin(out: Analysis, result: LocateResult, d) -> Analysis:
    """The origin is an in-place write only one run executed (`result.structural`): the
    script's own op changed the values, so there is nothing to replay and no environment
    cause; the chain follows what it changed from the first value difference."""
    st = out.structural
    out.origin_write = True
    first = result.first_difference or result.first_beyond_tolerance
    fb = result.first_beyond_tolerance
    out.chain = Chain()
    if first is not None:
        try:
            out.chain = _chain.build(d, first.a.index, fb.a.index if fb is not None else None,
                                     role="first_difference")
        except Exception as exc:  # never fail the analysis over the chain
            out.chain = Chain(error=f"{type(exc).__name__}: {exc}"[:200])
    out.environment = Causes(op_class="in-place write", none_found=(
        f"none from the environment: {st.event.op} is the script's own write, executed only "
        f"in {st.side}"))
    out.steps = steps_table(d, result)
    e = st.event
    words = [f"{e.op} ({st.side} #{e.index}, step {e.step}" +
             (f", rank {e.rank}" if e.rank is not None else "") +
             (f", {e.source}" if e.source else "") +
             f") changed the values: an in-place write only {st.side} executed"]
    if fb is not None:
        m = fb.metrics
        rel = fmt(m.max_rel if m is not None else None)
        words.append(f"what it wrote is beyond tolerance (max rel {rel}), first read through "
                     f"{fb.a.op} (a #{fb.a.index}, step {fb.a.step}), a view of it"
                     if is_view(fb.a.op) else
                     f"the first difference beyond tolerance follows at {fb.a.op} (a "
                     f"#{fb.a.index}, step {fb.a.step}), max rel {rel}")
    strongest = out.chain.strongest if out.chain is not None else None
    if strongest:
        words.append(f"{strongest.op} (a #{strongest.index}) amplified a "
                     f"{fmt(strongest.input_rel)} difference to {fmt(strongest.output_rel)}")
    out.summary = ". ".join(words) + "."
    return out


def _device_numerics(causes, d, rv):
    """Put the accelerator's bf16 pass first among the causes where the manifests cannot
    show it as a difference (both frameworks in one trace: one environment)."""
    if any(c.key == "frameworks.jax.backend" for c in causes.causes):
        return
    sides = {}
    for side, t, idx in (("a", d.ta, rv.a_index), ("b", d.tb, rv.b_index)):
        e = t.event(idx)
        jax_manifest = ((t.manifest or {}).get("frameworks") or {}).get("jax") or {}
        try:
            params = parse_params(e["params"])
        except Exception:   # unparseable parameters: the op's own precision is unknown
            params = {}
        sides[side] = (e["framework"], str(jax_manifest.get("backend") or "")
                       if e["framework"] == "jax" else "", e["op"], params,
                       jax_manifest.get("jax_default_matmul_precision"))
    cause = bf16_pass_cause(sides)
    if cause is not None:
        causes.causes.insert(0, cause)
        causes.none_found = None


def _inner_structure(d, ea, eb):
    """How the equations inside a (nested) jit origin pair up: unpaired ones mean the
    function's jaxpr differs between the runs (another library version's implementation)."""
    def descendants(side, ev):
        out, frontier = [], np.array([ev])
        for _ in range(32):
            kids = np.flatnonzero(np.isin(side.parent, frontier))
            kids = kids[kids != ev]
            if not len(kids):
                break
            out.append(kids)
            frontier = kids
        return np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)

    in_a, in_b = descendants(d.sa, ea), descendants(d.sb, eb)
    only_a = int(np.count_nonzero(d.al.a2b[in_a] < 0)) if len(in_a) else 0
    only_b = int(np.count_nonzero(d.al.b2a[in_b] < 0)) if len(in_b) else 0
    paired = in_a[d.al.a2b[in_a] >= 0] if len(in_a) else in_a
    diff = _chain.differing_mask(d)
    differing = sum(1 for e in paired.tolist() if diff[e])
    if only_a or only_b:
        text = (f"its equations differ between the runs ({len(in_a)} in a, {len(in_b)} in b; "
                f"{only_a} only in a, {only_b} only in b): the function itself is implemented "
                f"differently")
    elif differing:
        text = f"{differing} of its {len(in_a)} equations differ (see the chain)"
    else:
        text = (f"all {len(in_a)} equations inside it pair up and match: the difference comes "
                f"from how it was compiled")
    return Inner(equations_a=int(len(in_a)), equations_b=int(len(in_b)), only_in_a=only_a,
                 only_in_b=only_b, differing=differing, text=text)


def _differ_by(m):
    """abs and rel first; the ULP count only where it means something."""
    if m is None:
        return "not compared"
    u = meaningful_ulp(m)
    return (f"max abs {fmt(m.max_abs)}, max rel {fmt(m.max_rel)}" +
            (f", {fmt(u)} ULP" if u is not None else ""))


def _summary(out: Analysis, f: Finding) -> str:
    e = f.a
    where = f"{e.op} (a #{e.index}, step {e.step}" + (f", {e.source}" if e.source else "") + ")"
    words = []
    if f.introduced:
        words.append(f"{where} introduced the difference: its inputs are bitwise equal and "
                     f"its outputs differ ({_differ_by(f.metrics)})")
    elif f.inputs_match is True:
        words.append(f"{where} differs; its inputs are within tolerance but differ bitwise, "
                     f"so it carries a difference it did not start ({_differ_by(f.metrics)})")
    elif f.inputs_match is False:
        words.append(f"{where} differs but inherits the difference from its inputs")
    else:
        words.append(f"{where} differs; whether it introduced the difference is unknown "
                     f"({f.inputs_reason})")
    to = out.tolerance_origin
    if to is not None:
        le = to.local_error
        own = (f" (its own local error a {fmt(le[0])} / b {fmt(le[1])}, from float64 on "
               f"each side's inputs)" if le else "")
        words.append(f"it first exceeds tolerance at {to.a.op} (a #{to.a.index}, step "
                     f"{to.a.step}), whose inputs are within tolerance: it reaches "
                     f"{fmt(to.metrics.max_rel if to.metrics is not None else None)}{own}")
    chain = out.chain
    st = chain.strongest
    if st:
        words.append(f"{st.op} (a #{st.index}) amplified a {fmt(st.input_rel)} "
                     f"difference to {fmt(st.output_rel)}")
    if chain.reaches_target is False:
        words.append("the first difference beyond tolerance is not reached from it through "
                     "the recorded dataflow")
    if out.inner:
        words.append(f"{e.op}: {out.inner.text}")
    rv = out.replay
    if rv.verdict:
        words.append(f"replay: {rv.verdict}")
    if out.compiled_call:
        cc = out.compiled_call
        words.append(f"compiled-call divergence: every replayed equation of {cc.call} "
                     f"matches" + (f"; the compiled probe narrows it to {e.op}"
                                   if cc.probe is not None else ""))
    env = out.environment
    if env.causes:
        c = env.causes[0]
        words.append(f"most likely cause: {c.key} ({short_value(c.a)} vs {short_value(c.b)})")
    return ". ".join(words) + "."


def short_value(v) -> str:
    """An environment value in one short line (60 characters at most)."""
    s = "(unset)" if v is None else str(v)
    return s if len(s) <= 60 else s[:57] + "..."


def short(analysis: Analysis) -> tuple:
    """(Replay, [Hop | Gap]) for a `locate` result; (None, None) with no origin."""
    if analysis is None or analysis.origin is None:
        return None, None
    rv = analysis.replay
    o = analysis.origin.a
    op, index = (rv.op, rv.a_index) if rv.a_index != o.index else (o.op, o.index)
    ex = Replay(verdict=f"{op} (a #{index}): {rv.verdict or analysis.summary}",
                event=f"{op} (a #{index})", event_index=index,
                event_index_b=analysis.origin.b.index, replayable=bool(rv.replayed),
                summary=analysis.summary)
    for side in ("a", "b"):
        s = getattr(rv, side)
        fo = s.from_oracle if s is not None else None
        if fo:
            setattr(ex, f"{side}_ulp_from_exact", fo.max_ulp)
    if rv.oracle:
        ex.exact_by = rv.oracle.computed_by
    if rv.reproduces:
        ex.reproduced_here = rv.reproduces
    if rv.mechanism:   # diff/explain/mechanisms/: which candidate numerics reproduce each side
        ex.mechanism, ex.mechanisms = rv.mechanism, list(rv.mechanisms)
    causes = analysis.environment.causes
    if causes:
        ex.likely_cause = f"{causes[0].key}: {causes[0].reason}"
    if analysis.compiled_call:
        ex.compiled_call = analysis.compiled_call.explanation
    return ex, _chain.collapse(analysis.chain.hops)
