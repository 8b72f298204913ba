"""The JSON edge: the only place results become JSON (`tracediff locate --json`,
`tracediff explain --json`, `tracediff.to_json`).

`build(result)` of a `LocateResult`. Top-level fields: verdict ("match" | "diverged" |
"inconclusive": no divergence in what was compared, too little compared; exit code 3), coverage,
exit_code, traces {a, b}, warnings, tolerance, first_difference, first_beyond_tolerance,
replay_only, absorbed (only when a difference was overwritten before anything read it: the
first such, its note naming what wrote over it) with absorbed_total, near_zero (only when the tolerance search passed over rounding noise around
zero: the first such finding, its note saying why) with near_zero_total, alignment {events_a, events_b, matched, only_in_a, only_in_b,
anchors_matched, fallback_regions, gaps}, optimizer_steps (per compared step: step, a, b,
bitwise_equal, max_rel, max_abs, rel_l2, worst (the parameter with the largest relative L2 of
its own), worst_rel_l2, worst_max_abs, max_abs_is_lower_bound (no bytes: max_abs a lower
bound, max_rel and rel_l2 null); long runs keep the first 20, each new worst, the
last; across frameworks also beyond, first_beyond, undetermined and shifted), optimizer_steps_total, first_parameter
(across frameworks: the first parameter beyond tolerance by role, `ParamDivergence`), env_diff,
mapping, next_steps, levels; when computed:
explain (the replay verdict of the origin: verdict, event, summary, a_ulp_from_exact,
b_ulp_from_exact, exact_by, reproduced_here, likely_cause; mechanism, one line, when
hypotheses were tested), chain (links {a, b, metrics, input_rel, amplification, role} from the origin to the
outputs, collapsed to ~10, a `Gap` written as the string "... N more hops"), noise (the
--noise floor: nondeterministic_events, skipped).

A finding is null or {level, a, b, metrics, inputs_match, inputs_reason, inputs_bitwise,
introduced, local_error {a, b} (inputs within tolerance but not bitwise, replayed), origin, note,
call, paired_by, values, arguments_differ [{name, a, b}] (the op's non-tensor arguments
whose recorded values differ: "start" "8" vs "9") when some do, and device_note + devices [{slot, device, shard, replica,
differs}] when its values were recorded per device}; a and b hold index, op, name_stack,
source, step, kind, framework, phase, origin, node, call, shapes, dtypes, rank (the
trace's rank in a multi-process run, else null), device ("cpu:3") for an event tied
to one device, and lib_source (the library's file:line, beside source, the user's) for an
op that ran inside library code; metrics hold max_abs, max_rel,
max_ulp, mismatch_fraction, beyond_tolerance_fraction, within_tolerance. The results hold
real floats; non-finite ones are written as the strings "inf" / "nan" (`strict`) so the
output is strict JSON.

`analysis_json(analysis)` of an `Analysis`: verdict, traces, tolerance, origin, chain
(every hop), chain_info, replay (with `mechanism`, one line), mechanisms ({side, name,
bitwise, max_ulp, note} per hypothesis and side, best first), compiled_call, inner, environment, tolerance_origin,
steps, noise, summary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .._version import __version__
from ..diff.compare.levels import zoom_lines
from ..diff.result import Analysis, Gap, LocateResult, RanksResult, ReplicasResult
from ..shell import command, comment, with_comment
from .findings import typed

EVENT_FIELDS = ("index", "op", "name_stack", "source", "step", "kind", "framework", "phase",
                "origin", "node", "call", "shapes", "dtypes", "rank")
METRIC_FIELDS = ("max_abs", "max_rel", "max_ulp", "mismatch_fraction", "beyond_tolerance_fraction",
                 "within_tolerance", "rtol", "atol")
HOP_EVENT_FIELDS = ("index", "op", "name_stack", "source", "step", "kind", "framework", "origin",
                    "phase")
HOP_METRIC_FIELDS = ("max_rel", "max_abs", "max_ulp", "within_tolerance")
MAX_VALUES = 8


def strict(x):
    """Make a value strict JSON: non-finite floats as the strings "inf" / "-inf" / "nan"
    (the results hold real floats), numpy scalars as Python numbers, keys as strings."""
    if isinstance(x, dict):
        return {str(k): strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except (TypeError, ValueError):
            return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _plain(obj):
    """The fields of a flat result type, in their order, as a dict."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _trace_json(t):
    """A compared trace; `framework` only for a side of a cross-framework comparison."""
    out = _plain(t)
    if out.get("framework") is None:
        out.pop("framework", None)
    return out


def event_json(e, fields=EVENT_FIELDS):
    out = {k: getattr(e, k) for k in fields}
    if getattr(e, "device", ""):   # only for an event tied to one device
        out["device"] = e.device
    if "source" in fields and getattr(e, "lib_source", ""):   # only for an op run in a library
        out["lib_source"] = e.lib_source
    return out


def metrics_json(m, fields=METRIC_FIELDS):
    return {k: getattr(m, k) if m is not None else None for k in fields}


def call_json(c):
    if c is None:
        return None
    out = {"a": c.a, "b": c.b, "op": c.op}
    if c.probe_a is not None or c.probe_b is not None:
        out.update(probe_a=c.probe_a, probe_b=c.probe_b)
    return out


def value_json(v):
    e = {"key": v.key, "a": None if v.a is None else _plain(v.a),
         "b": None if v.b is None else _plain(v.b), "compared": v.compared}
    if v.metrics is not None:
        m = metrics_json(v.metrics, ("bitwise_equal", *METRIC_FIELDS))
        for k in ("dtype_mismatch", "shape_mismatch"):
            if getattr(v.metrics, k) is not None:
                m[k] = getattr(v.metrics, k)
        e["metrics"] = m
    return e


def finding_json(f):
    if f is None:
        return None
    return {
        "level": f.level,
        "a": event_json(f.a),
        "b": event_json(f.b),
        "metrics": metrics_json(f.metrics),
        "inputs_match": f.inputs_match,
        "inputs_reason": f.inputs_reason,
        "inputs_bitwise": f.inputs_bitwise,
        "introduced": f.introduced,
        **({"local_error": {"a": f.local_error[0], "b": f.local_error[1]}}
           if f.local_error else {}),
        "origin": f.origin,
        "note": f.note,
        "call": call_json(f.call),
        "paired_by": f.pair_by,
        "layer": f.layer,
        "optimizer": f.optimizer,
        "values": [value_json(v) for v in f.values[:MAX_VALUES]],
        "values_total": len(f.values),
        # the op's non-tensor arguments that differ (diff/compare/args.py), only when some do
        **({"arguments_differ": [_plain(x) for x in f.arguments]} if f.arguments else {}),
        # per-device copies (only when recorded per device, capture/jax/devices.py)
        **({"device_note": f.device_note,
            "devices": [_plain(d) for d in f.devices]} if f.devices or f.device_note else {}),
        **({"dtype_note": f.dtype_note} if f.dtype_note else {}),
    }


def hop_json(h):
    """One hop of the chain; a `Gap` is the string "... N more hops"."""
    if isinstance(h, Gap):
        return str(h)
    return {"a": event_json(h.a, HOP_EVENT_FIELDS), "b": {"index": h.b},
            "metrics": metrics_json(h.metrics, HOP_METRIC_FIELDS), "input_rel": h.input_rel,
            "amplification": h.amplification, "role": h.role}


def replay_json(r):
    """locate's "explain": the short replay verdict (only "verdict" when none was made)."""
    out = {"verdict": r.verdict}
    if r.event is not None:
        out.update(event=r.event, event_index=r.event_index, event_index_b=r.event_index_b,
                   replayable=r.replayable, summary=r.summary)
    for k in ("a_ulp_from_exact", "b_ulp_from_exact", "exact_by", "reproduced_here",
              "mechanism", "likely_cause", "compiled_call"):
        if getattr(r, k) is not None:
            out[k] = getattr(r, k)
    return out


def levels_json(lv):
    if lv is None:
        return None
    return {"a": _plain(lv.a), "b": _plain(lv.b),
            "compared_without_bytes": lv.compared_without_bytes, "decided": lv.decided,
            "not_decided": lv.not_decided,
            "zoom": [{"a": _plain(z.a), "b": _plain(z.b), "then": z.then, "step": z.step,
                      "title": z.title} for z in lv.zoom]}


def coverage_json(c):
    """What the comparison compared (diff/coverage.py): a, b, bar, sufficient, reasons,
    unpaired, next_step."""
    if c is None:
        return None
    return {"a": _plain(c.a), "b": _plain(c.b), "bar": c.bar, "sufficient": c.sufficient,
            "reasons": list(c.reasons), "unpaired": [_plain(u) for u in c.unpaired],
            "next_step": c.next_step}


def next_steps(r):
    out = []
    f = r.first_beyond_tolerance or r.first_difference
    if f is not None:
        out.append(command("tracediff", "show", r.path_a, f.a.index))
        out.append(command("tracediff", "show", r.path_b, f.b.index))
        if f.call is not None:
            out.append(with_comment(command("tracediff", "show", r.path_a, f.call.a),
                                    "the enclosing compiled call"))
    if r.first_beyond_tolerance is None and r.first_difference is not None:
        out.append(comment("differences stay within tolerance; tighten with --rtol/--atol to "
                           "localise them"))
    if f is not None:
        pair = (r.path_a,) if r.path_a == r.path_b else (r.path_a, r.path_b)  # one trace
        out.append(with_comment(command("tracediff", "explain", *pair),
                                "origin, chain, replay verdict, causes"))
        ex = r.explain
        if ex is not None and ex.event_index is not None and ex.replayable:
            out.append(with_comment(command("tracediff", "repro", r.path_b, ex.event_index_b,
                                            "-o", "repro/"),
                                    "a standalone script for the bug report"))

    out += zoom_lines(r)  # two-level search: record the divergent step at full level
    return out


def build(r: LocateResult) -> dict:
    """Plain dict (strict JSON) of a `LocateResult`: what `tracediff locate --json` prints."""
    typed(r, LocateResult)
    out = {
        "tracediff_version": __version__,
        "verdict": r.verdict,
        "exit_code": r.exit_code,
        "traces": {k: _trace_json(t) for k, t in r.traces.items()},
        "warnings": list(r.warnings),
        "tolerance": r.tolerance,
        "first_difference": finding_json(r.first_difference),
        "first_beyond_tolerance": finding_json(r.first_beyond_tolerance),
        "replay_only": finding_json(r.replay_only),
        **({"near_zero": finding_json(r.near_zero), "near_zero_total": r.near_zero_total}
           if r.near_zero is not None else {}),
        **({"absorbed": finding_json(r.absorbed), "absorbed_total": r.absorbed_total}
           if r.absorbed is not None else {}),
        "alignment": {**r.alignment, "gaps": r.gaps},
        "optimizer_steps": [{k: (_plain(v) if k == "first_beyond" and v is not None else v)
                             for k, v in _plain(s).items()
                             if v is not None or k not in ("compared", "by", "beyond",
                                                           "first_beyond", "undetermined",
                                                           "shifted")}
                            for s in r.optimizer_steps],
        "first_parameter": _plain(r.first_parameter) if r.first_parameter is not None else None,
        "optimizer_steps_total": r.optimizer_steps_total,
        "env_diff": r.env_diff,
        "mapping": r.mapping,
        "next_steps": next_steps(r),
        "levels": levels_json(r.levels),
        "coverage": coverage_json(r.coverage),
    }
    # root cause (diff/explain/analysis.py): short replay verdict of the origin, the chain from the
    # origin to the outputs, the noise floor; present only when computed
    if r.explain is not None:
        out["explain"] = replay_json(r.explain)
    if r.chain is not None:
        out["chain"] = [hop_json(h) for h in r.chain]
    if r.noise is not None:
        out["noise"] = _plain(r.noise)
    if r.structural is not None:   # an op only one run has (diff/align/structure.py)
        out["structural"] = structural_json(r.structural)
    if r.sources is not None:      # every source, ranked (diff/explain/sources.py)
        out["sources"] = sources_json(r.sources)
    if r.nonfinite is not None:    # where each side's NaN or Inf came from (diff/nonfinite/)
        out["nonfinite"] = {"only_in": r.nonfinite_only,
                            **{k: nonfinite_json(v) for k, v in r.nonfinite.items()}}
    return strict(out)


def nonfinite_json(nf) -> Optional[dict]:
    """`first_nonfinite` (info --json, and each side in locate's `nonfinite`): where a
    trace's NaN or Inf came from (`NonFinite`), or None when every value is finite."""
    if nf is None:
        return None
    o = nf.origin
    out = {"event": o.index, "op": o.op, "step": o.step, "phase": o.phase, "kind": nf.made,
           "module": o.name_stack, "source": o.source, "event_kind": o.kind,
           "framework": o.framework, "inputs_finite": nf.inputs_finite,
           **{k: getattr(nf, k) for k in ("kept", "received", "mechanism", "element", "nan", "inf",
                                          "elements", "nan_mechanism", "absorbed", "level",
                                          "events_nonfinite", "note", "zoom")},
           "inputs": [_plain(v) for v in nf.inputs],
           "nan_at": event_json(nf.nan_at, HOP_EVENT_FIELDS) if nf.nan_at else None,
           "chain": [{"event": c.event.index, "op": c.event.op, "made": c.made}
                     for c in nf.chain],
           "kept_at": event_json(nf.kept_at, HOP_EVENT_FIELDS) if nf.kept_at else None,
           "first_absorbed": event_json(nf.first_absorbed, HOP_EVENT_FIELDS)
           if nf.first_absorbed else None}
    for k in ("lib_source", "device"):
        if getattr(o, k):
            out[k] = getattr(o, k)
    if o.rank is not None:
        out["rank"] = o.rank
    return strict(out)


def nonfinite_ranks_json(r) -> dict:
    """`info DIR --json`: each rank's `first_nonfinite` and the rank it started on."""
    return strict({"first_rank": r.first_rank, "note": r.note,
                   "ranks": {str(k): {"path": r.paths.get(k),
                                      "first_nonfinite": nonfinite_json(nf)}
                             for k, nf in sorted(r.ranks.items())}})


def sources_json(srcs) -> dict:
    """The sources of a difference (`Sources`), every field."""
    return {**{k: v for k, v in _plain(srcs).items() if k != "sources"},
            "sources": [_plain(s) for s in srcs.sources]}


def structural_json(st) -> dict:
    """Plain dict of a `Structural` (an op only one run has)."""
    return {"side": st.side, "text": st.text, "first": st.first, "event": event_json(st.event),
            "gap": dict(st.gap), "consumers": [event_json(e) for e in st.consumers]}


# -- tracediff explain --json ---------------------------------------------------------------

ORIGIN_A_FIELDS = ("index", "op", "kind", "origin", "name_stack", "source", "step", "framework",
                   "phase")
ORIGIN_B_FIELDS = ("index", "op", "kind", "framework")


def _chain_info(c):
    if c.error is not None:
        return {"error": c.error}
    out = {"reaches_target": c.reaches_target, "hops_total": c.hops_total, "last": c.last}
    if c.strongest is not None:
        out["strongest"] = _plain(c.strongest)
    return out


def _side_replay(s):
    out = {"op": s.op, "replayed": s.replayed, "reproduced_here": s.reproduced_here,
           "reason": s.reason}
    if s.returned_zero is not None:
        out["returned_zero"] = s.returned_zero
    if s.from_oracle is not None:
        out["from_oracle"] = _plain(s.from_oracle)
    return out


def replay_run_json(r):
    """explain's "replay": the full replay of the origin."""
    out = {"event": {"a": r.a_index, "b": r.b_index, "op": r.op, "op_b": r.op_b},
           "replayed": r.replayed}
    if r.a is not None:
        out["a"], out["b"] = _side_replay(r.a), _side_replay(r.b)
    if not r.replayed:
        out["reason"] = r.reason
    else:
        if r.oracle_note is not None:
            out["oracle_note"] = r.oracle_note
        out["oracle"] = None if r.oracle is None else {
            "computed_by": r.oracle.computed_by, "from": r.oracle.side, "op": r.oracle.op}
        if r.oracle is not None and r.oracle.expression:   # a fused expression's exact value
            out["oracle"]["expression"] = True
        if r.closer is not None:
            out["closer"] = r.closer
            out["closer_by"] = r.closer_by
        out["reproduces"] = r.reproduces
        out["machine"] = r.machine
        if r.mechanism:
            out["mechanism"] = r.mechanism
    out["verdict"] = r.verdict
    return out


def _compiled_call(cc):
    out = {"call": cc.call, "event": cc.event}
    if cc.probe is not None:
        out.update(probe=cc.probe, narrowed_to={"op": cc.narrowed_op, "event": cc.narrowed_event})
    out.update(explanation=cc.explanation, narrow=cc.narrow)
    return out


def _cause(c):
    out = {"key": c.key, "a": c.a, "b": c.b, "reason": c.reason, "rank": c.rank}
    if c.note is not None:
        out["note"] = c.note
    if c.device:
        out["device"] = True
    return out


def _step(s):
    out = _plain(s.optimizer) if s.optimizer is not None else {"step": s.step}
    if s.loss is not None:
        out["loss"] = _plain(s.loss)
    return out


def analysis_json(an: Optional[Analysis]) -> dict:
    """Plain dict (strict JSON) of an `Analysis`: what `tracediff explain --json` prints
    ({} when no analysis could be made)."""
    typed(an, Analysis, optional=True)
    if an is None:
        return {}
    out = {"verdict": an.verdict, "traces": {k: _trace_json(t) for k, t in an.traces.items()},
           "tolerance": an.tolerance, "coverage": coverage_json(an.coverage)}
    if an.structural is not None:
        out["structural"] = structural_json(an.structural)
    f = an.origin
    if an.origin_write:   # the origin is the structural write (`Analysis.origin_write`)
        env = an.environment
        out.update(origin={"write": True, "side": an.structural.side,
                           an.structural.side: event_json(an.structural.event)},
                   chain=[hop_json(h) for h in an.chain.hops], chain_info=_chain_info(an.chain),
                   environment={"op_class": env.op_class, "causes": [],
                                "none_found": env.none_found},
                   summary=an.summary, steps=[_step(s) for s in an.steps])
        if an.sources is not None:
            out["sources"] = sources_json(an.sources)
        return strict(out)
    if f is None:
        out.update(origin=None, summary=an.summary, steps=[_step(s) for s in an.steps])
        return strict(out)
    out["origin"] = {"a": event_json(f.a, ORIGIN_A_FIELDS), "b": event_json(f.b, ORIGIN_B_FIELDS),
                     "level": f.level, "inputs_match": f.inputs_match,
                     "inputs_reason": f.inputs_reason, "inputs_bitwise": f.inputs_bitwise,
                     "introduced": f.introduced, "note": f.note, "call": call_json(f.call),
                     "metrics": metrics_json(f.metrics, HOP_METRIC_FIELDS)}
    out["chain"] = [hop_json(h) for h in an.chain.hops]
    out["chain_info"] = _chain_info(an.chain)
    out["replay"] = replay_run_json(an.replay)
    out["mechanisms"] = [_plain(m) for m in an.mechanisms]   # diff/explain/mechanisms/
    if an.compiled_call is not None:
        out["compiled_call"] = _compiled_call(an.compiled_call)
    if an.inner is not None:
        out["inner"] = _plain(an.inner)
    env = an.environment
    out["environment"] = {"op_class": env.op_class, "causes": [_cause(c) for c in env.causes],
                          "none_found": env.none_found}
    to = an.tolerance_origin
    if to is not None:
        out["tolerance_origin"] = {
            "index": to.a.index, "op": to.a.op, "step": to.a.step, "source": to.a.source,
            "inputs_reason": to.inputs_reason, "inputs_bitwise": to.inputs_bitwise,
            **({"local_error": {"a": to.local_error[0], "b": to.local_error[1]}}
               if to.local_error else {}),
            "max_rel": to.metrics.max_rel if to.metrics is not None else None}
    out["steps"] = [_step(s) for s in an.steps]
    out["noise"] = _plain(an.noise) if an.noise is not None else None
    out["summary"] = an.summary
    if an.sources is not None:
        out["sources"] = sources_json(an.sources)
    return strict(out)


# -- many ranks: `tracediff locate DIR_A DIR_B --json`, `tracediff replicas --json` ----------

def rank_json(s) -> dict:
    """One rank's summary (`RankSummary`) or spread (`Spread`); `device` only where the
    rank's first divergence is on a known device."""
    out = _plain(s)
    if not out.get("device"):
        out.pop("device", None)
    return out


def ranks_build(rr: RanksResult) -> dict:
    """`locate DIR_A DIR_B --json`: the JSON of the first rank's `LocateResult` (the
    contract of `build`, its events carrying `rank`), plus `first_rank`, `ranks` (every
    rank's summary), `spread` (how the divergence reached the other ranks) and
    `ranks_note`; `verdict` and `exit_code` are those of the whole comparison."""
    typed(rr, RanksResult)
    out = build(rr.result)
    out.update(verdict=rr.verdict, exit_code=rr.exit_code, first_rank=rr.first_rank,
               ranks=[rank_json(s) for s in rr.ranks],
               spread=[rank_json(s) for s in rr.spread], ranks_note=rr.note or None)
    return strict(out)


def replicas_build(r: ReplicasResult) -> dict:
    """`tracediff replicas --json`: verdict ("consistent" | "diverged" | "nothing_to_compare": nothing
    to compare, exit code 2), exit_code,
    first ({device, rank, step, op, source, event, name_stack, phase} or null), checked
    (replicated values compared), ranks, reference_rank, departed (ranks), devices,
    note."""
    typed(r, ReplicasResult)
    return strict({"tracediff_version": __version__, "verdict": r.verdict,
                   "exit_code": r.exit_code,
                   "first": _plain(r.first) if r.first is not None else None,
                   "checked": r.checked, "ranks": list(r.ranks),
                   "reference_rank": r.reference_rank, "departed": list(r.departed),
                   "devices": list(r.devices), "note": r.note or None})
