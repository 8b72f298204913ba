"""The JSON form of a `locate` result (the contract of `tracediff locate --json`).

Top-level fields: verdict ("match" | "diverged"), exit_code, traces {a, b},
warnings, tolerance, first_difference, first_beyond_tolerance, replay_only,
alignment {events_a, events_b, matched, only_in_a, only_in_b, anchors_matched,
fallback_regions, gaps}, optimizer_steps (per compared step: step, a, b, bitwise_equal,
max_rel, max_abs, worst; long runs keep the first 20, each new worst, the last),
optimizer_steps_total, env_diff, mapping, next_steps; when computed: explain (the
replay verdict of the origin: verdict, event, summary, a_ulp_from_exact, b_ulp_from_exact,
exact_by, reproduced_here, likely_cause), chain (links {a, b, metrics, input_rel,
amplification, role} from the origin to the outputs, collapsed to ~10 with "... N more
hops" strings), noise (the --noise floor: nondeterministic_events, skipped).

A finding is null or {level, a, b, metrics, inputs_match, inputs_reason, origin, note,
call, paired_by, values}; a and b hold index, op, name_stack, source, step, kind,
framework, phase, origin, node, call, shapes, dtypes; metrics hold max_abs, max_rel,
max_ulp, mismatch_fraction, beyond_tolerance_fraction, within_tolerance. Non-finite
numbers are the strings "inf" / "nan" so the output is strict JSON.
"""

import math

from .._version import __version__
from ..diff.levels import zoom_lines
from ..shell import command, comment, with_comment

EVENT_FIELDS = ("index", "op", "name_stack", "source", "step", "kind", "framework", "phase",
                "origin", "node", "call", "shapes", "dtypes")
METRIC_FIELDS = ("max_abs", "max_rel", "max_ulp", "mismatch_fraction", "beyond_tolerance_fraction",
                 "within_tolerance", "rtol", "atol")
MAX_VALUES = 8


def _clean(x):
    """Make a value strict-JSON (non-finite floats as strings, numpy scalars as Python)."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except (TypeError, ValueError):
            return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def finding_json(f):
    if f is None:
        return None
    metrics = {k: f.metrics.get(k) for k in METRIC_FIELDS} if f.metrics else \
        {k: None for k in METRIC_FIELDS}
    values = []
    for v in f.values[:MAX_VALUES]:
        e = {"key": v["key"], "a": v["a"], "b": v["b"], "compared": v["compared"]}
        if v.get("metrics"):
            e["metrics"] = {k: v["metrics"].get(k) for k in
                            ("bitwise_equal", *METRIC_FIELDS, "dtype_mismatch", "shape_mismatch")
                            if k in v["metrics"]}
        values.append(e)
    return {
        "level": f.level,
        "a": {k: f.a.get(k) for k in EVENT_FIELDS},
        "b": {k: f.b.get(k) for k in EVENT_FIELDS},
        "metrics": metrics,
        "inputs_match": f.inputs_match,
        "inputs_reason": f.inputs_reason,
        "origin": f.origin,
        "note": f.note,
        "call": f.call,
        "paired_by": f.pair_by,
        "layer": getattr(f, "layer", None),
        "values": values,
        "values_total": len(f.values),
    }


def next_steps(r):
    out = []
    f = r.first_beyond_tolerance or r.first_difference
    if f is not None:
        out.append(command("tracediff", "show", r.path_a, f.a["index"]))
        out.append(command("tracediff", "show", r.path_b, f.b["index"]))
        if f.call:
            out.append(with_comment(command("tracediff", "show", r.path_a, f.call["a"]),
                                    "the enclosing compiled call"))
    if r.first_beyond_tolerance is None and r.first_difference is not None:
        out.append(comment("differences stay within tolerance; tighten with --rtol/--atol to "
                           "localise them"))
    if f is not None:
        pair = (r.path_a,) if r.path_a == r.path_b else (r.path_a, r.path_b)  # one trace
        out.append(with_comment(command("tracediff", "explain", *pair),
                                "origin, chain, replay verdict, causes"))
        ex = getattr(r, "explain", None) or {}
        if ex.get("event_index") is not None and ex.get("replayable"):
            out.append(with_comment(command("tracediff", "repro", r.path_b, ex["event_index_b"],
                                            "-o", "repro/"),
                                    "a standalone script for the bug report"))

    out += zoom_lines(r)  # two-level search: record the divergent step at full level
    return out


def build(r):
    """Plain dict (JSON-ready) of a `LocateResult`."""
    out = {
        "tracediff_version": __version__,
        "verdict": r.verdict,
        "exit_code": r.exit_code,
        "traces": r.traces,
        "warnings": list(r.warnings),
        "tolerance": r.tolerance,
        "first_difference": finding_json(r.first_difference),
        "first_beyond_tolerance": finding_json(r.first_beyond_tolerance),
        "replay_only": finding_json(r.replay_only),
        "alignment": {**r.alignment, "gaps": r.gaps},
        "optimizer_steps": r.optimizer_steps,
        "optimizer_steps_total": r.optimizer_steps_total,
        "env_diff": r.env_diff,
        "mapping": r.mapping,
        "next_steps": next_steps(r),
        "levels": getattr(r, "levels", None),
    }
    # root cause (diff/explain.py): short replay verdict of the origin, the chain from the
    # origin to the outputs, the noise floor; present only when computed
    for key in ("explain", "chain", "noise"):
        if getattr(r, key, None) is not None:
            out[key] = getattr(r, key)
    return _clean(out)
