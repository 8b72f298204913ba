"""Rounding noise around zero: beyond tolerance by relative error alone, not a difference.

A value that is mathematically zero comes out as rounding noise (a gradient of ~1e-11
that cancels to nothing, both runs' digits random); it passes the tolerance only through
atol (compare/values.py). An op that divides by something as small (AdamW's
`exp_avg / (sqrt(exp_avg_sq) + eps)`) turns that noise into an output beyond tolerance,
and everything that reads it (the parameter, the next step's forward) carries it on.
None of it is a difference between the programs.

`judge(d, ea, eb, inputs)` decides, for a paired event beyond tolerance that reads some
differing input (an op whose inputs are bitwise equal introduced its difference and is
never noise), whether every output element beyond tolerance is noise:

* `ELEMENTWISE` ops: it sits where an input (same shape, or broadcast) is noise: within
  tolerance only by atol, with a relative difference beyond sqrt(rtol) (float32: 3.2e-3:
  half its digits are rounding residue), or the noise of an earlier op judged so;
* `CONTRACTIONS` (addmm, mm, bmm, mv, dot): |a - b| is within tolerance of the magnitudes
  that produced the element (|bias| + |x| @ |w|, from a's inputs): a value tiny against
  them, its inputs' rounding cancelled to near zero;
* data movement (`args.DATA_MOVEMENT`, equal arguments): it moves noise and makes none;
* an optimizer snapshot: each differing tensor is a value judged noise.

Values judged noise are remembered by their two content hashes, so a snapshot of the same
tensor, or an op reading it, is judged the same way. Any input beyond tolerance that is
not noise makes the event a real (inherited) difference.
"""

from __future__ import annotations

import numpy as np

from ...trace import schema
from ...trace.values import has_bytes as comparable, parse_shape
from . import args as _args
from . import values as compare


# ops whose output element i reads input element i (same shape, or broadcast): the only
# ones whose outputs are judged element by element against their inputs' noise
ELEMENTWISE = frozenset("""
    add sub rsub mul div addcdiv addcmul lerp neg abs exp expm1 log log1p sqrt rsqrt pow
    tanh sigmoid logistic relu gelu silu elu leaky_relu clamp clamp_min clamp_max maximum
    minimum max min where select_n sign reciprocal square sin cos erf sgn
    threshold_backward gelu_backward tanh_backward sigmoid_backward silu_backward
    integer_pow
""".split())
# contractions judged against the magnitudes that produce each output element
# (|bias| + |x| @ |w|), without alpha/beta/other parameters
CONTRACTIONS = frozenset("addmm mm bmm mv dot".split())


def _read(d, side, row):
    reader = d.ra if side == "a" else d.rb
    return np.asarray(reader.read(row))


def _tol(d, row):
    return compare.tolerance(d.ta.string(row["dtype"]), d.rtol, d.atol)


def _masks(d, ra, rb):
    """(beyond, noise) flat bool masks of a value pair: elements beyond tolerance, and
    noise near zero: within tolerance only by atol, their relative difference beyond
    sqrt(rtol) (float32: 3.2e-3; half the digits differ: what is left is the rounding of a
    cancellation); None when the values cannot be read as floats of one shape."""
    dt = d.ta.string(ra["dtype"])
    if not (comparable(ra) and comparable(rb)) or not compare.is_floating(dt) or \
            dt.startswith("complex") or dt != d.tb.string(rb["dtype"]):
        return None
    xa, xb = _read(d, "a", ra), _read(d, "b", rb)
    if xa.shape != xb.shape:
        return None
    r, t = _tol(d, ra)
    with np.errstate(all="ignore"):
        pa, pb = xa.astype(np.float64).ravel(), xb.astype(np.float64).ravel()
        diff = np.abs(pa - pb)
        scale = np.maximum(np.abs(pa), np.abs(pb))
        same = (pa == pb) | (np.isnan(pa) & np.isnan(pb))
        beyond = ~same & ~(np.isfinite(diff) & (diff <= t + r * scale))
        # within tolerance only through atol, and half its digits or more differ
        noise = ~same & ~beyond & (diff > np.sqrt(r) * scale)
    return beyond, noise


def _key(ra, rb):
    return int(ra["hash"]), int(rb["hash"])


def _shape(d, row):
    return tuple(parse_shape(d.ta.string(row["shape"])))


def _numel(d, row):
    return int(np.prod(_shape(d, row)))


def _to_output(mask, in_shape, out_shape):
    """An input's element mask in the output's shape (the same shape, or broadcast);
    None when it does not broadcast."""
    if tuple(in_shape) == tuple(out_shape):
        return mask
    try:
        return np.broadcast_to(mask.reshape(in_shape), out_shape).ravel()
    except ValueError:
        return None


class NearZero:
    """The judgements of one comparison: the noise masks of values judged noise (by
    their two content hashes), the first event judged noise and how many were."""

    def __init__(self):
        self.by_hash = {}      # (hash a, hash b) -> flat bool mask of noise elements
        self.first = None      # (ea, eb, reason)
        self.count = 0

    def taint(self, ra, rb):
        return self.by_hash.get(_key(ra, rb))


def judge(d, ea, eb, pairs_in):
    """The reason event ea (paired with eb, beyond tolerance) is rounding noise around
    zero, or None. `pairs_in`: [(slot, row_a, row_b)] of its inputs (`Differ.input_pairs`)."""
    if d.ulp is not None:
        return None
    state = d.near_zero_state
    outs = [(k, ra, rb) for k, ra, rb in d._out_pairs(ea, eb)]
    if not outs or any(ra is None or rb is None for _, ra, rb in outs):
        return None
    beyond_out = []
    for k, ra, rb in outs:
        if int(ra["hash"]) == int(rb["hash"]):
            continue
        masks = _masks(d, ra, rb)
        if masks is None:
            return None
        beyond_out.append((k, ra, rb, masks))
    if not beyond_out:
        return None
    kind = int(d.sa.kind[ea])
    if kind == schema.KIND_OPTIM:
        # a snapshot reads nothing: each differing tensor must be a value judged noise
        for _, ra, rb, (beyond, _) in beyond_out:
            m = state.taint(ra, rb)
            if beyond.any() and (m is None or m.size != beyond.size or (beyond & ~m).any()):
                return None
        return _remember(state, beyond_out, "its tensors beyond tolerance are the noise "
                                            "around zero of earlier ops")
    if kind not in (schema.KIND_OP, schema.KIND_EAGER):
        return None
    op = d.ta.string(d.ta.events[ea]["op"])
    base = _args.base_name(op)
    moves = base in _args.DATA_MOVEMENT and not d.arguments(ea, eb)
    contracts = base in CONTRACTIONS and not d.ta.string(d.ta.events[ea]["params"])
    if not (moves or contracts or base in ELEMENTWISE):
        return None   # its outputs do not read its inputs element for element
    noisy_inputs, covered, reads, arrays = [], {}, False, []
    for slot, ra, rb in pairs_in:
        if ra is not None and rb is None and not _numel(d, ra):
            continue   # an empty value (a cache before its first entry) with no counterpart
        if ra is None or rb is None:
            return None
        if contracts:
            arrays.append(_read(d, "a", ra))
        if int(ra["hash"]) == int(rb["hash"]):
            continue
        reads = True
        masks = _masks(d, ra, rb)
        if masks is None:
            return None
        beyond, noise = masks
        taint = state.taint(ra, rb)
        if taint is not None and taint.size == noise.size:
            noise = noise | taint
        if (beyond & ~noise).any():
            return None   # a real difference beyond tolerance reaches it: inherited
        if not noise.any():
            continue
        noisy_inputs.append(slot)
        if moves or contracts:
            continue   # moved values / judged by the magnitudes of the contraction
        for k, ra_o, _, _ in beyond_out:
            mapped = _to_output(noise, _shape(d, ra), _shape(d, ra_o))
            if mapped is None:
                if beyond.any():
                    return None   # noise it does not read element for element: unknown
                continue
            covered[k] = mapped if k not in covered else (covered[k] | mapped)
    if not reads:
        return None   # its inputs are bitwise equal: it introduced the difference
    if contracts:
        if len(beyond_out) != 1:
            return None
        _, ra_o, rb_o, (beyond, _) = beyond_out[0]
        scale = _contraction_scale(base, arrays)
        if scale is None or scale.size != beyond.size:
            return None
        xa, xb = _read(d, "a", ra_o).astype(np.float64).ravel(), \
            _read(d, "b", rb_o).astype(np.float64).ravel()
        r, t = _tol(d, ra_o)
        with np.errstate(all="ignore"):
            if (beyond & ~(np.abs(xa - xb) <= t + r * scale)).any():
                return None   # beyond tolerance of the magnitudes that produced it
        return _remember(state, beyond_out, (
            "its outputs differ beyond tolerance only where they are tiny against the "
            "magnitudes that produced them (|a - b| within tolerance of |bias| + |x| @ |w|): "
            "its differing inputs' rounding, cancelled to near zero"))
    if not noisy_inputs:
        return None   # its inputs carry no noise: the difference is its own
    if not moves:
        for k, _, _, (beyond, _) in beyond_out:
            m = covered.get(k)
            if m is None or m.size != beyond.size or (beyond & ~m).any():
                return None
    words = ", ".join(f"input {s}" for s in noisy_inputs[:3])
    return _remember(state, beyond_out, (
        f"{'it moves' if moves else 'its outputs differ beyond tolerance only where'} "
        f"{words} {'which carries' if moves else 'carries'} rounding noise around zero "
        f"(values within tolerance only by atol, or an earlier op's noise)"))


def _contraction_scale(base, xs):
    """The magnitudes that produce each output element of a contraction, flat:
    |bias| + |x| @ |w| (addmm), |x| @ |w| (mm, bmm, mv, dot); None for other arities."""
    xs = [np.abs(np.asarray(x, dtype=np.float64)) for x in xs]
    with np.errstate(all="ignore"):
        if base == "addmm" and len(xs) == 3:
            return (xs[0] + xs[1] @ xs[2]).ravel()
        if base in ("mm", "bmm", "mv", "dot") and len(xs) == 2:
            return np.atleast_1d(np.matmul(xs[0], xs[1])).ravel()
    return None


def _remember(state, beyond_out, reason):
    for _, ra, rb, (beyond, noise) in beyond_out:
        prev = state.taint(ra, rb)
        mask = beyond | noise
        state.by_hash[_key(ra, rb)] = mask if prev is None or prev.size != mask.size \
            else (prev | mask)
    return reason

