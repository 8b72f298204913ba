"""What differs at a source's worst event, for naming its mechanism (explain/sources.py):
the op's arguments or shapes (the program asked for another computation), values that are
not a rounding apart (one side non-finite, or only the sign of zero), the outputs' dtype
(autocast, a cast), a TPU's bf16 pass, and the replay hypothesis that reproduces a side."""

import re

import numpy as np

from ...trace import schema
from ..compare import args as _args
from ..compare import dtypes as _dtypes
from .replay.params import parse_params
from .mechanisms.precision import ran_as_bf16_pass
from .verdict import event_outputs


_WIDTH = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
# arguments that name where an op runs, not what it computes
_PLACEMENT = re.compile(r"device|sharding|layout|pin_memory|memory_format|memory_kind")


# the limits of each float dtype, as a program writes them into an argument (a mask's fill
# value `torch.finfo(dtype).min`): max, smallest normal, eps
_LIMITS = {"float64": (1.7976931348623157e308, 2.2250738585072014e-308, 2.220446049250313e-16),
           "float32": (3.4028234663852886e38, 1.1754943508222875e-38, 1.1920928955078125e-07),
           "bfloat16": (3.3895313892515355e38, 1.1754943508222875e-38, 0.0078125),
           "float16": (65504.0, 6.103515625e-05, 0.0009765625)}


def arguments(d, ea, eb):
    """"other=2.0 vs 3.0, shape=[3] vs [4]": the paired ops' recorded arguments or output
    shapes that differ (placement aside), "" where none does. Where the outputs' dtypes
    differ, arguments that only follow the dtype (the dtype itself, a fill value that is
    the dtype's min) are the change of dtype, not another computation: not counted."""
    da, db = _out_dtypes(d.ta, ea), _out_dtypes(d.tb, eb)
    diffs = [x for x in _args.differing(d.ta.string(d.ta.events[ea]["params"]),
                                        d.tb.string(d.tb.events[eb]["params"]))
             if not _PLACEMENT.search(x.name)
             and not (da != db and _follows_dtype(x, set(da) | set(db)))]
    words = [f"{x.name}={x.a if x.a is not None else '-'} vs {x.b if x.b is not None else '-'}"
             for x in diffs]
    sa, sb = _out_shapes(d.ta, ea), _out_shapes(d.tb, eb)
    if sa != sb:
        words.append(f"shape={sa} vs {sb}")
    return ", ".join(words)


def _follows_dtype(x, dtypes) -> bool:
    """Is this differing argument the dtype itself, or a limit of the two sides' dtypes
    (finfo max, min, tiny or eps) on both sides?"""
    if "dtype" in x.name or any(str(v).replace("torch.", "") in dtypes for v in (x.a, x.b)):
        return True
    limits = {v for dt in dtypes for v in _LIMITS.get(dt, ())}
    try:
        return all(abs(float(v)) in limits for v in (x.a, x.b))
    except (TypeError, ValueError):   # not numbers: a real argument
        return False


def _out_shapes(t, ev):
    rows = t.value_rows(ev, schema.ROLE_OUT)
    return [t.value_meta(r)["shape"] for r in rows[np.argsort(rows["slot"], kind="stable")]]


def value_words(d, ea, eb):
    """Words for outputs whose difference is not a rounding: one side non-finite where the
    other is a number, or outputs equal but for the sign of zero; "" otherwise."""
    try:
        oa, ob = event_outputs(d, "a", ea), event_outputs(d, "b", eb)
    except Exception:   # values not stored (stats level): nothing more to say
        return ""
    for x, y in zip(oa, ob):
        if x is None or y is None or np.shape(x) != np.shape(y) or \
                np.asarray(x).dtype.kind not in "fc" or np.asarray(y).dtype.kind not in "fc":
            continue
        fa, fb = np.isfinite(x), np.isfinite(y)
        if (fa & ~fb).any() or (fb & ~fa).any():
            side = "b" if (fa & ~fb).any() else "a"
            bad = y if side == "b" else x
            what = "NaN" if np.isnan(bad).any() else "Inf"
            return (f"{side} makes {what} where {'a' if side == 'b' else 'b'} makes finite "
                    f"numbers")
        same = np.array_equal(x, y, equal_nan=True)
        if same and np.asarray(x).tobytes() != np.asarray(y).tobytes():
            return "the outputs differ only in the sign of zero (0.0 against -0.0)"
    return ""


def _out_dtypes(t, ev):
    rows = t.value_rows(ev, schema.ROLE_OUT)
    return [t.string(r["dtype"]) for r in rows[np.argsort(rows["slot"], kind="stable")]]


def _in_dtypes(d, ea, eb):
    """The dtypes of the paired events' dataflow inputs, a's and b's (None: not known)."""
    out_a, out_b = [], []
    try:
        pairs = d.input_pairs(ea, eb)
    except Exception:   # a differ without dataflow pairing (two frameworks): none known
        return [], []
    for _, ra, rb in pairs:
        out_a.append(d.ta.string(ra["dtype"]) if ra is not None else None)
        out_b.append(d.tb.string(rb["dtype"]) if rb is not None else None)
    return out_a, out_b


def dtype_change(d, ea, eb):
    """(note, narrower side) when the paired outputs differ in dtype (autocast on one
    side, or a cast in the program), or their inputs do (a program's own bf16 operands
    with `preferred_element_type=float32`): the dtype, not a kernel, makes the
    difference; ("", "") otherwise."""
    da, db = _out_dtypes(d.ta, ea), _out_dtypes(d.tb, eb)
    note = _dtypes.dtype_note(d.ta, d.tb, ea, eb, da, db)
    if not note:
        ia, ib = _in_dtypes(d, ea, eb)
        known = [(x, y) for x, y in zip(ia, ib) if x and y and x != y and
                 _WIDTH.get(x) and _WIDTH.get(y)]
        if not known:
            return "", ""
        x, y = known[0]
        return (f"inputs {x} vs {y}, outputs {da[0] if da else '?'}",
                "a" if _WIDTH[x] < _WIDTH[y] else "b")
    x, y = next((x, y) for x, y in zip(da, db) if x != y)
    return note, "a" if _WIDTH.get(x, 4) < _WIDTH.get(y, 4) else "b"


def bf16_side(d, ea, eb):
    """The side whose matmul or convolution ran as a bf16 pass on a TPU (default
    precision) while the other's did not; "" when not that."""
    bf16 = {}
    for side, t, ev in (("a", d.ta, ea), ("b", d.tb, eb)):
        e = t.event(ev)
        if e["framework"] != "jax":
            bf16[side] = False
            continue
        jax_manifest = ((t.manifest or {}).get("frameworks") or {}).get("jax") or {}
        try:
            params = parse_params(e["params"])
        except Exception:   # unparseable: the op's precision is unknown, default assumed
            params = {}
        bf16[side] = bool(ran_as_bf16_pass(str(jax_manifest.get("backend") or ""), e["op"],
                                           params,
                                           jax_manifest.get("jax_default_matmul_precision")))
    if bf16["a"] != bf16["b"]:
        return "a" if bf16["a"] else "b"
    return ""


def best_hypothesis(rv, side):
    """The hypothesis that reproduces the culprit side bitwise (or, for both sides, either),
    from a replay verdict's mechanisms; None when none does."""
    if rv is None or not rv.mechanisms:
        return None
    sides = ("a", "b") if side in ("both", "") else (side,)
    for s in sides:
        mine = [mm for mm in rv.mechanisms if mm.side == s]
        if mine and mine[0].bitwise:
            return mine[0].name
    return None
