"""Exact arithmetic, rounding and comparing: the numerics every hypothesis is built from.

A float32 fused multiply-add is computed in float64 rounded to odd (correct for every
input), a float64 one by the Boldo-Melquiond emulation; `_cast` rounds to a dtype
(bfloat16 through ml_dtypes, never twice), `_round_mantissa` keeps TF32's or bfloat16's
mantissa bits; `distance` says whether a candidate equals the recorded output bit for bit,
and how many ULP of the output dtype apart it is otherwise.
"""

import numpy as np

from ...compare import values as compare

# -- exact arithmetic -----------------------------------------------------------------------

def _two_sum(a, b):
    s = a + b
    z = s - a
    return s, (a - (s - z)) + (b - z)


def _round_to_odd(s, e):
    """s + e (s = RN(s + e), e its exact error) rounded to odd in s's format: the
    intermediate that makes a second rounding to a narrower format correct."""
    inexact = (e != 0) & np.isfinite(s)
    t = np.where(inexact & ((e > 0) != (s > 0)), np.nextafter(s, np.zeros_like(s)), s)
    bits = t.view(np.uint64) | np.where(inexact, np.uint64(1), np.uint64(0))
    return bits.view(np.float64)


def fma32(a, b, c):
    """float32 fused multiply-add a*b + c rounded once, for arrays: the float32 product is
    exact in float64, the sum is rounded to odd there, then to nearest float32."""
    a, b, c = (np.asarray(v, np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        p = a * b
        s, e = _two_sum(p, c)
        return _round_to_odd(s, e).astype(np.float32)


def _split(x):
    c = 134217729.0 * x
    hi = c - (c - x)
    return hi, x - hi


def fma64(a, b, c):
    """float64 fused multiply-add rounded once (Boldo & Melquiond's emulation with
    rounding to odd: uh + ul = a*b and th + tl = c + uh exactly, RN(th + RO(tl + ul)))."""
    a, b, c = (np.asarray(v, np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        uh = a * b
        ah, al = _split(a)
        bh, bl = _split(b)
        ul = ((ah * bh - uh) + ah * bl + al * bh) + al * bl
        th, tl = _two_sum(c, uh)
        v = _round_to_odd(*_two_sum(tl, ul))
        out = th + v
        return np.where(np.isfinite(uh) & np.isfinite(out), out, a * b + c)


def _fma(acc):
    return fma32 if acc == np.float32 else fma64


# -- rounding and comparing -----------------------------------------------------------------

def _dtype_name(x):
    return np.asarray(x).dtype.name


def _wide_dtype(name):
    return np.longdouble if name == "float64" else np.float64


def _cast(x, name):
    """x in dtype `name` (bfloat16 through ml_dtypes), rounded to nearest."""
    x = np.asarray(x)
    if name == "bfloat16":
        import ml_dtypes

        return x.astype(np.float64).astype(ml_dtypes.bfloat16) if x.dtype.name != "bfloat16" \
            else x
    if x.dtype == np.longdouble and name != "float64":
        x = x.astype(np.float64)   # long double -> float64 -> float32 would round twice
    return x.astype(name)


def _round_mantissa(x, bits, truncate):
    """float32 values kept to `bits` explicit mantissa bits (TF32: 10, bfloat16: 7),
    rounded to nearest even or truncated; NaN and infinities unchanged."""
    x = np.ascontiguousarray(x, np.float32)
    drop = 23 - bits
    u = x.view(np.uint32)
    if not truncate:
        u = u + np.uint32((1 << (drop - 1)) - 1) + ((u >> np.uint32(drop)) & np.uint32(1))
    out = (u & np.uint32((0xFFFFFFFF << drop) & 0xFFFFFFFF)).view(np.float32)
    return np.where(np.isfinite(x), out, x)


def distance(candidate, target):
    """(bitwise, max ULP, elements that differ) of a candidate against the recorded
    values (same dtype)."""
    c, t = np.asarray(candidate).reshape(-1), np.asarray(target).reshape(-1)
    name = t.dtype.name
    if c.dtype != t.dtype:
        c = _cast(c, name)
    if c.shape != t.shape:
        return False, float("inf"), t.size
    bitwise = c.tobytes() == t.tobytes()
    u = compare.ulp_distance(c, t, name)
    if u is None:
        return bitwise, 0.0 if bitwise else float("inf"), 0 if bitwise else t.size
    with np.errstate(all="ignore"):
        nan_c, nan_t = np.isnan(c.astype(np.float64)), np.isnan(t.astype(np.float64))
    u = np.where(nan_c & nan_t, 0.0, np.where(nan_c ^ nan_t, np.inf, u))
    return bitwise, float(u.max()) if u.size else 0.0, int(np.count_nonzero(u))
