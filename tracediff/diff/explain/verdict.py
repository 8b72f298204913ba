"""The replay verdict: which machine computed the origin op right.

The origin op is re-executed here from each side's recorded inputs (`explain/replay/`: an
allow-list of ops, parameters parsed as literals), in its own dtype (does this machine
reproduce a, b, neither?) and in higher precision (float64 for float32/16 ops; numpy long
double for float64 ops), and each side's recorded output is measured in ULP from that
oracle. Kept apart from the analysis that uses it because the reproducer (`explain/repro.py`)
reads inputs the same way.
"""

from __future__ import annotations

import os

import numpy as np

from ...trace import schema
from ..compare import args as _args
from ..compare import values as compare
from .mechanisms import dispatch as _mechanisms
from .mechanisms.summary import summary as mechanisms_line
from .replay.calls import build_call, recorded_output_size
from .replay.oracle import numpy_oracle
from .replay.params import CannotReplay
from ..differ import comparable
from ..engine.inputs import input_value_row
from ..result import FromOracle, Oracle, ReplayRun, SideReplay
from .causes import op_class

MAX_REPLAY_BYTES = 64 << 20
# the metric that decides which side is closer to the exact result (ReplayRun.closer_by):
# the total absolute error over every element, so one bad element does not outweigh many
CLOSER_BY = "total absolute error"
# ULP counts are shown only while the two values agree to this relative difference: beyond
# it (14.0 vs 0.0 is 1.1e9 ULP) a count of representable numbers says nothing rel does not
ULP_MAX_REL = 1e-2
# a side whose op ran on another backend than this machine's: no "reproduces" claim
OTHER_BACKEND = "computed on another backend"


def _side(d, side):
    return (d.ta, d.sa, d.ra) if side == "a" else (d.tb, d.sb, d.rb)


def event_inputs(d, side, ev):
    """Array inputs of event `ev` of one side, in slot order (raises CannotReplay)."""
    t, s, reader = _side(d, side)
    return trace_inputs(t, s, reader, ev)


def trace_inputs(t, s, reader, ev):
    """Array inputs of event `ev` of trace `t` (Side `s`, ValueReader `reader`)."""
    arrays, total = [], 0
    for r in t.input_rows(ev):
        slot, p, ps = int(r["slot"]), int(r["producer"]), int(r["producer_slot"])
        if slot != len(arrays):
            raise CannotReplay(f"input slot {len(arrays)} is not recorded")
        if p == schema.PRODUCER_LITERAL:
            row = s.value_row(ev, slot, schema.ROLE_IN)   # stored since tracediff 0.1 (JAX)
            if row is None or not comparable(row):
                raise CannotReplay(f"input {slot} is a literal of the program; its "
                                   f"value is not recorded")
            arrays.append(reader.read(row))
            continue
        if p == schema.PRODUCER_CONST:
            raise CannotReplay(f"input {slot} is a closed-over constant; its value is "
                               f"not recorded")
        if p < 0:
            raise CannotReplay(f"input {slot} has an unknown producer")
        row = input_value_row(s, t, ev, p, ps)
        if row is None or not comparable(row):
            raise CannotReplay(f"input {slot} (from event {p}) was not stored")
        total += int(row["nbytes"])
        if total > MAX_REPLAY_BYTES:
            raise CannotReplay("inputs larger than 64 MB are not replayed")
        arrays.append(reader.read(row))
    return arrays


def event_outputs(d, side, ev):
    t, _, reader = _side(d, side)
    rows = t.value_rows(ev, schema.ROLE_OUT)
    rows = rows[np.argsort(rows["slot"], kind="stable")]
    return [reader.read(r) if comparable(r) else None for r in rows]


def _bits_equal(x, y):
    if x is None or y is None:
        return False
    x, y = np.asarray(x), np.asarray(y)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _real_parts(x):
    x = np.asarray(x)
    if x.dtype.kind == "c":
        return [x.real, x.imag]
    return [x]


def oracle_distance(recorded, oracle):
    """{max_ulp (integer, to the rounded oracle), max_ulp_exact (|x - exact| in units of
    the last place), max_rel, sum_abs} of a recorded output against a high-precision
    result, in the recorded dtype."""
    rec = np.asarray(recorded)
    name = rec.dtype.name
    if not compare.is_floating(name) or rec.shape != np.asarray(oracle).shape:
        return None
    out = {"max_ulp": 0.0, "max_ulp_exact": 0.0, "mean_ulp_exact": 0.0, "max_rel": 0.0,
           "sum_abs": 0.0}
    for r, o in zip(_real_parts(rec), _real_parts(np.asarray(oracle))):
        part = r.dtype.name
        with np.errstate(all="ignore"):
            rounded = o.astype(np.float64).astype(r.dtype) if part == "bfloat16" else o.astype(r.dtype)
            both_nan = np.isnan(r.astype(np.float64)) & np.isnan(o.astype(np.float64))
            u = compare.ulp_distance(r.reshape(-1), rounded.reshape(-1), part)
            u = np.where(both_nan.reshape(-1), 0.0, u)
            wide = o.astype(np.float64).astype(np.longdouble) if o.dtype.name == "bfloat16" \
                else o.astype(np.longdouble)
            err = np.abs(r.astype(np.float64).astype(np.longdouble) - wide)
            err = np.where(both_nan, 0, err)
            if part in ("float16", "float32", "float64"):
                spacing = np.abs(np.spacing(np.abs(rounded))).astype(np.longdouble)
                exact = np.where(spacing > 0, err / spacing, 0)
            else:
                exact = None
            scale = np.abs(wide)
            rel = np.where(err == 0, 0, err / np.where(scale == 0, 1, scale))
        if u.size:
            out["max_ulp"] = max(out["max_ulp"], float(np.nanmax(u)) if not np.isnan(u).all()
                                 else float("inf"))
            out["max_rel"] = max(out["max_rel"], float(np.max(rel)))
            out["sum_abs"] += float(np.sum(err))
            out["max_ulp_exact"] = None if exact is None or out["max_ulp_exact"] is None else \
                max(out["max_ulp_exact"], float(np.max(exact)))
            out["mean_ulp_exact"] = None if exact is None or out["mean_ulp_exact"] is None else \
                max(out["mean_ulp_exact"], float(np.mean(exact)))
    return out


def fused_matmul_member(d, side, ev):
    """The matmul inside a cross-framework unit that `ev` ends (Flax's `dot_general + add`
    paired with torch's `addmm`): the event to replay for that side, or None. Replaying the
    unit's last op (the bias `add`) says nothing of how the matmul rounded."""
    g = getattr(d, "ga" if side == "a" else "gb", None)
    if g is None or not hasattr(g, "unit_of"):
        return None
    k = int(g.unit_of[ev]) if 0 <= ev < len(g.unit_of) else -1
    if k < 0:
        return None
    unit = g.units[k]
    t = d.ta if side == "a" else d.tb
    if len(unit.events) < 2 or op_class(t.event(ev)["op"]) == "matmul":
        return None
    members = [int(e) for e in unit.events if op_class(t.event(int(e))["op"]) == "matmul"]
    return members[0] if len(members) == 1 else None


def replay_verdict(d, ea: int, eb: int) -> ReplayRun:
    """Re-execute the op of a paired event on this machine; see the module docstring. Where
    a side's event ends a fused unit around one matmul, the matmul is what is replayed, and
    the unit's output is what is measured against the exact result."""
    ends = {"a": ea, "b": eb}
    ea = fused_matmul_member(d, "a", ea) or ea
    eb = fused_matmul_member(d, "b", eb) or eb
    ev = {"a": d.ta.event(ea), "b": d.tb.event(eb)}
    res = ReplayRun(a_index=ea, b_index=eb, op=ev["a"]["op"], op_b=ev["b"]["op"], verdict="")
    if ev["a"]["kind"] == "call" or ev["b"]["kind"] == "call":
        res.reason = ("a compiled jit call is not replayed as one op: its equations are "
                      "(see the chain and the note on compiled-call divergences)")
        res.verdict = f"not replayed: {ev['a']['op']} is a compiled call"
        return res
    sides = {}
    cross = getattr(d, "cross_outputs", None)   # eager vs torch.compile (pairing/compiled.py)
    for side, e, idx in (("a", ev["a"], ea), ("b", ev["b"], eb)):
        info = {"op": e["op"], "framework": e["framework"]}
        decomposed = cross(side, idx) if cross is not None else None
        if decomposed is not None:
            # several replayed ops standing for the other side's one op: not replayed as
            # one, judged against that op's high-precision result
            info.update(recorded=decomposed, reason="a torch.compile decomposition of the "
                        "other side's op: judged against that op's high-precision result")
            sides[side] = info
            continue
        try:
            if e["kind"] not in ("eqn", "eager", "op"):
                raise CannotReplay(f"a {e['kind']} event is not an op")
            inputs = event_inputs(d, side, idx)
            call = build_call(e["framework"], e["op"], e["params"], len(inputs),
                              recorded_output_size(_side(d, side)[0], idx))
            recorded = event_outputs(d, side, idx)
            info.update(call=call, inputs=inputs, recorded=recorded, n_inputs=len(inputs))
            if ends[side] != idx:   # a fused unit's matmul: the unit's output is measured
                info["unit_output"] = event_outputs(d, side, ends[side])
            try:
                here = call.run(inputs)
            except CannotReplay:
                raise
            except Exception as exc:
                raise CannotReplay(f"running it here failed ({type(exc).__name__}: "
                                           f"{str(exc).splitlines()[0][:120] if str(exc) else ''})")
            info["here"] = here
            info["reproduced"] = len(here) == len(recorded) and all(
                _bits_equal(h, r) for h, r in zip(here, recorded))
            there, mine = recorded_backend(_side(d, side)[0], e["framework"]), \
                replay_backend(e["framework"])
            if there and mine and there != mine:
                # computed on another backend: replaying it here says nothing of that machine
                info["reproduced"] = None
                info["reason"] = (f"{OTHER_BACKEND} ({there}); this machine replays on {mine}: "
                                  f"not the backend that computed it")
        except CannotReplay as exc:
            info["reason"] = str(exc)
        except Exception as exc:  # a damaged value, an odd op: never fail the report
            info["reason"] = f"cannot replay: {type(exc).__name__}: {str(exc)[:120]}"
        sides[side] = info
    ok = [s for s in ("a", "b") if "call" in sides[s] and "here" in sides[s]]
    for side in ("a", "b"):
        s = sides[side]
        setattr(res, side, SideReplay(op=s["op"], replayed="here" in s,
                                      reproduced_here=s.get("reproduced"), reason=s.get("reason")))
    if not ok:
        res.reason = sides["a"].get("reason") or sides["b"].get("reason")
        res.verdict = f"cannot replay {ev['a']['op']}: {res.reason}"
        return res
    res.replayed = True
    # the oracle: from the side whose op covers most of the computation (most inputs)
    # (a fused unit's replayed matmul computes part of the unit: never the oracle's source)
    whole = [s for s in ok if "unit_output" not in sides[s]]
    if not whole:
        res.reason = "both sides replayed the matmul of a fused unit: no exact unit output"
        res.verdict = f"cannot judge {ev['a']['op']}: {res.reason}"
        return res
    src = max(whole, key=lambda s: (sides[s]["n_inputs"], s == "a"))
    S = sides[src]
    dtypes = [np.asarray(r).dtype.name for s in ok for r in sides[s]["recorded"] if r is not None]
    if not any(_args.judged_by_float64(ev[s]["op"], dtypes) for s in ok):
        return _not_judged(d, res, ea, eb, sides, dtypes)
    out_dtype = next((np.asarray(r).dtype.name for r in S["recorded"] if r is not None), "")
    oracle, how = None, None
    # mechanisms (diff/explain/mechanisms/): candidate numerics re-run on each side's inputs; a
    # fused (compiled-probe) origin is judged against its whole expression, exactly
    cases = _mechanisms.cases(d, {"a": ea, "b": eb}, sides, event_inputs)
    expr = getattr(cases.get(src), "expr", None)
    try:
        if expr is not None and out_dtype in ("float16", "bfloat16", "float32", "float64"):
            shape = np.shape(next(r for r in S["recorded"] if r is not None))
            oracle = [np.broadcast_to(expr.exact(), shape)]
            how = "numpy long double" if out_dtype == "float64" else "float64"
        elif out_dtype in ("float64", "complex128"):
            oracle = numpy_oracle(S["framework"], S["op"], S["call"].params, S["inputs"])
            how = "numpy long double" if oracle is not None else None
            if oracle is None:
                res.oracle_note = (f"{S['op']} already computes in {out_dtype} and has no "
                                   f"extended-precision implementation here")
        elif compare.is_floating(out_dtype):
            oracle, how = S["call"].run(S["inputs"], upcast=True), "float64"
    except Exception as exc:
        res.oracle_note = f"the high-precision run failed ({type(exc).__name__})"
        oracle = None
    res.oracle = Oracle(computed_by=how, side=src, op=S["op"]) if how else None
    if res.oracle is not None and expr is not None:   # the exact value of the expression
        res.oracle.op, res.oracle.expression = expr.text(), True
    if oracle is not None:
        for side in ("a", "b"):
            mine = getattr(res, side)
            rec = sides[side].get("unit_output") or sides[side].get("recorded") or \
                event_outputs(d, side, ea if side == "a" else eb)
            dist = [oracle_distance(r, o) if r is not None else None
                    for r, o in zip(rec, oracle)]
            dist = [x for x in dist if x is not None]
            if all(r is not None and np.asarray(r).size and not np.any(np.asarray(r))
                   for r in rec) and any(np.any(np.asarray(o)) for o in oracle):
                mine.returned_zero = True
            if dist:
                mine.from_oracle = FromOracle(
                    max_ulp=max(x["max_ulp"] for x in dist),
                    max_ulp_exact=None if any(x["max_ulp_exact"] is None for x in dist)
                    else max(x["max_ulp_exact"] for x in dist),
                    mean_ulp_exact=None if any(x["mean_ulp_exact"] is None for x in dist)
                    else max(x["mean_ulp_exact"] for x in dist),
                    max_rel=max(x["max_rel"] for x in dist),
                    sum_abs=sum(x["sum_abs"] for x in dist))
        fa, fb = res.a.from_oracle, res.b.from_oracle
        if fa and fb:
            res.closer_by = CLOSER_BY
            if fa.sum_abs == fb.sum_abs:
                res.closer = "equal"
            else:
                res.closer = "a" if fa.sum_abs < fb.sum_abs else "b"
    res.reproduces = _reproduces(res)
    res.machine = _machine(sides[src]["framework"])
    res.mechanisms = _mechanisms.hypotheses(cases)
    res.mechanism = mechanisms_line(res.mechanisms, {s: sides[s]["op"] for s in ("a", "b")},
                                    cases)
    res.verdict = _verdict_text(res)
    return res


def local_errors(d, ea: int, eb: int):
    """[a, b]: each side's max relative error from the float64 replay of its op on its own
    recorded inputs: what the op itself adds, apart from what its inputs carry; None where
    a side cannot be replayed (not allow-listed, inputs not stored, not floating)."""
    out = []
    for side, idx in (("a", ea), ("b", eb)):
        t = _side(d, side)[0]
        e = t.event(idx)
        try:
            if e["kind"] not in ("eqn", "eager", "op"):
                return None
            inputs = event_inputs(d, side, idx)
            call = build_call(e["framework"], e["op"], e["params"], len(inputs),
                              recorded_output_size(t, idx))
            recorded = event_outputs(d, side, idx)
            if not any(r is not None and compare.is_floating(np.asarray(r).dtype.name)
                       for r in recorded):
                return None
            exact = call.run(inputs, upcast=True)
        except Exception:   # not replayable here: no local error to tell
            return None
        dist = [oracle_distance(r, o) for r, o in zip(recorded, exact) if r is not None]
        dist = [x for x in dist if x is not None]
        if not dist:
            return None
        out.append(max(x["max_rel"] for x in dist))
    return out


def _not_judged(d, res, ea, eb, sides, dtypes):
    """The verdict of an op that rounds nothing (a selection, view, copy or conversion;
    an integer op, `args.judged_by_float64`): no float64 comparison, no numeric
    mechanisms; what changed is its arguments, when they differ, or its inputs."""
    op = res.op
    what = ("selects, moves or converts values and rounds nothing"
            if _args.base_name(op) in _args.DATA_MOVEMENT else "computes on integers, exactly")
    diffs = d.arguments(ea, eb)
    text = f"not judged against float64: {op} {what}"
    if diffs:
        text += f"; the op's arguments differ: {_args.text(diffs)}"
    res.not_judged = text
    res.reproduces = _reproduces(res)
    res.machine = _machine(sides["a" if "call" in sides["a"] else "b"]["framework"])
    res.verdict = _verdict_text(res)
    return res


def _reproduces(res):
    """both / a / b / neither / None: which sides this machine reproduces bitwise. A side
    computed on another backend (`OTHER_BACKEND`) is never claimed either way: only what
    the other side says is."""
    ra, rb = res.a.reproduced_here, res.b.reproduced_here
    other = [s for s in ("a", "b") if (getattr(res, s).reason or "").startswith(OTHER_BACKEND)]
    if other:
        return "a" if ra else "b" if rb else None
    return ("both" if ra and rb else "a" if ra else "b" if rb else
            "neither" if ra is False or rb is False else None)


def recorded_backend(trace, framework):
    """The backend a side's JAX ops ran on (the manifest's frameworks.jax.backend), or None."""
    if framework != "jax":
        return None
    jax_manifest = ((getattr(trace, "manifest", None) or {}).get("frameworks") or {}).get("jax")
    backend = (jax_manifest or {}).get("backend") if isinstance(jax_manifest, dict) else None
    return str(backend) if backend else None


def replay_backend(framework):
    """The backend this machine replays JAX ops on, or None."""
    if framework != "jax":
        return None
    try:
        import jax

        return jax.default_backend()
    except Exception:  # no JAX here: nothing replayed on it
        return None


def _machine(framework):
    """What this machine replays with (for the verdict's 'this machine')."""
    import platform

    out = {"host": platform.node(), "numpy": np.__version__}
    try:
        if framework == "jax":
            import jax

            out["jax"] = jax.__version__
            out["backend"] = jax.default_backend()
            out["XLA_FLAGS"] = os.environ.get("XLA_FLAGS")
        elif framework == "torch":
            import torch

            out["torch"] = torch.__version__
            out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:  # informative only
        pass
    return out


def fmt(x) -> str:
    """A number in the verdict's prose: '-', 'inf', '0', an integer, or 3 digits."""
    if x is None:
        return "-"
    x = float(x)
    if not np.isfinite(x):
        return "inf" if x > 0 else "nan"
    if x == 0:
        return "0"
    if x.is_integer() and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.3g}"


def meaningful_ulp(m):
    """The max ULP of a `Metrics` where a reader can use it, else None: floating values,
    finite, and close (max rel <= ULP_MAX_REL); abs and rel say the rest."""
    if m is None or m.max_ulp is None or m.max_rel is None:
        return None
    if not (np.isfinite(m.max_ulp) and np.isfinite(m.max_rel)) or \
            (m.max_abs is not None and not np.isfinite(m.max_abs)):
        return None
    return m.max_ulp if m.max_rel <= ULP_MAX_REL else None


def ulp_text(f: FromOracle) -> str:
    """How far one side is from the exact result, in ULP (by max rel alone when the
    values are far apart: `ULP_MAX_REL`)."""
    if f.max_rel == 0:
        return "0 ULP (exact)"
    if not f.max_rel <= ULP_MAX_REL:
        return f"max rel {fmt(f.max_rel)}"
    if f.max_ulp_exact is not None and f.max_ulp < 1e4:
        return f"max {f.max_ulp_exact:.2f} ULP, mean {f.mean_ulp_exact:.2f} ULP"
    return f"up to {fmt(f.max_ulp)} ULP"


def _worst_ulp(f: FromOracle) -> float:
    """The worst element's ULP as `ulp_text` shows it."""
    if f.max_ulp_exact is not None and f.max_ulp < 1e4:
        return f.max_ulp_exact
    return f.max_ulp


def _verdict_text(res):
    parts = [res.not_judged] if res.not_judged else []
    fa, fb = res.a.from_oracle, res.b.from_oracle
    if fa and fb:
        oracle = res.oracle
        ref = f"{oracle.computed_by if oracle is not None else None} result"
        if oracle is not None and oracle.expression:   # a fused op: its whole expression
            ref = (f"exact value of {oracle.op} (in {oracle.computed_by}, from the "
                   f"fused expression's original operands)")
        if res.closer == "equal":
            parts.append(f"a and b are equally far from the {ref} "
                         f"({fmt(fa.max_ulp)} ULP)")
        else:
            win, lose = res.closer, "b" if res.closer == "a" else "a"
            fw, fl = getattr(res, win).from_oracle, getattr(res, lose).from_oracle
            # the metric that decided first, then the per-element view, and where that
            # view points the other way, said so (never "b is closer" beside a larger max)
            def rel(f):
                return "" if not 0 < f.max_rel <= ULP_MAX_REL else f" (max rel {fmt(f.max_rel)})"

            zero = f" ({lose} returned 0)" if getattr(res, lose).returned_zero else ""
            text = (f"{win} is closer to the {ref} by {res.closer_by or CLOSER_BY} "
                    f"(sum of |x - exact| over the elements: {win} {fmt(fw.sum_abs)}, "
                    f"{lose} {fmt(fl.sum_abs)}): {lose} is off by "
                    f"{ulp_text(fl)}{rel(fl)}{zero}, {win} by {ulp_text(fw)}{rel(fw)}")
            if _worst_ulp(fw) > _worst_ulp(fl) or fw.max_rel > fl.max_rel:
                text += (f", although {win}'s worst element is further off than {lose}'s "
                         f"(more elements of {lose} are off, or by more in total)")
            parts.append(text)
    elif res.oracle_note:
        parts.append(f"no exact reference ({res.oracle_note})")
    rep = res.reproduces
    if rep == "a":
        parts.append("this machine reproduces a bitwise, not b")
    elif rep == "b":
        parts.append("this machine reproduces b bitwise, not a")
    elif rep == "both":
        parts.append("this machine reproduces both from their own inputs")
    elif rep == "neither":
        parts.append("this machine reproduces neither a nor b")
    for side in ("a", "b"):   # a side computed on another backend: no claim, and why
        mine = getattr(res, side)
        if mine is not None and mine.replayed and mine.reproduced_here is None and mine.reason:
            parts.append(f"{side}: {mine.reason}")
    return "; ".join(parts) if parts else "replayed, no verdict"
