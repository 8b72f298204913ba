"""A value's mean and L2 norm where its sums or squares leave the range of their dtype.

A float's square leaves the range long before the float does: float32 squares underflow
below ~1e-19 and overflow above ~1.8e19 (float64's below ~1e-154 and above ~1.3e154), and a
sum of n numbers overflows where n * max|x| does. The stored L2 of Adam's `exp_avg_sq` (at
most 4.9e-28) read 0.0 (issue 66). So the sums run unscaled, in the value's dtype (fast),
only where its largest magnitude says they cannot lose anything (`plain`); any other value
is summed scaled by the power of two that brings its largest magnitude into [1/2, 1)
(exact), in the same dtype, and multiplied back in float64: the scaling of LAPACK's nrm2,
decided before the sums from max|x|, which a value's min and max give for free.
"""

import math

import numpy as np


def plain_range(dtype, n):
    """(lo, hi) for values of n numbers (n: a count or an array of them): one whose largest
    magnitude m lies in [lo, hi] gets its sum and sum of squares in `dtype` within eps of
    float64's. Below lo the squares that underflow (each below tiny, or flushed to 0)
    could add up to more than eps * m^2; above hi n * m^2 would overflow (a factor 2 kept
    free for rounding)."""
    fi = np.finfo(dtype)
    n = np.maximum(np.asarray(n, np.float64), 1)
    return np.sqrt(n * float(fi.tiny) / float(fi.eps)), np.sqrt(float(fi.max) / n) / 2


def plain(dtype, n, amax):
    """Is `plain_range` enough for n numbers of largest magnitude amax (or arrays of both)?"""
    lo, hi = plain_range(dtype, n)
    return ((amax >= lo) & (amax <= hi)) | (amax == 0)


_RANGES = {}   # dtype -> (tiny / eps, max): `plain_one`'s constants


def plain_one(dtype, n, amax):
    """`plain` of one value, in Python floats (~1 us where numpy's takes ~10, per value)."""
    got = _RANGES.get(dtype)
    if got is None:
        fi = np.finfo(dtype)
        got = _RANGES[dtype] = (float(fi.tiny) / float(fi.eps), float(fi.max))
    n = max(n, 1)
    return amax == 0 or math.sqrt(n * got[0]) <= amax <= math.sqrt(got[1] / n) / 2


def exponent(amax):
    """k with 2^(k-1) <= amax < 2^k: numbers divided by 2^k lie below 1 in magnitude."""
    return int(np.frexp(amax)[1])


def unscaled(tot, sq, n, k):
    """(mean, L2) as floats from the sum and the sum of squares of n numbers scaled by
    2^-k; an L2 beyond float64 (values near its max) is inf."""
    with np.errstate(over="ignore"):
        return float(np.ldexp(tot / n, k)), float(np.ldexp(np.sqrt(sq), k))


def scaled(x, k):
    """x * 2^-k in x's float dtype, exact wherever the product is a normal number: by one
    power of two where the dtype holds 2^-k, else by two (float32's 2^-148 is not one)."""
    fi = np.finfo(x.dtype)
    one = x.dtype.type
    if fi.minexp <= -k < fi.maxexp:
        return x * one(2.0 ** -k)
    half = -k // 2
    y = x * one(2.0 ** half)
    y *= one(2.0 ** (-k - half))
    return y


def mean_l2(x, amax, count=None):
    """(mean, L2) as float64 of a 1-D float32/float64 array of finite numbers whose
    largest magnitude is amax, summed in x's dtype (in SIMD lanes and a BLAS dot, as the
    plain path sums) on x * 2^-k (`exponent`): the largest scaled magnitude lies in
    [1/2, 1), well inside `plain_range` for any count, and what underflows lies far below
    eps of it. `count`: the numbers the mean is over (the finite ones, where x holds
    zeros in place of the others)."""
    n = x.size if count is None else count
    if not amax > 0 or not n:
        return (0.0 if n else float("nan")), 0.0
    k = exponent(amax)
    with np.errstate(under="ignore"):
        y = scaled(x, k)
    return unscaled(np.float64(np.einsum("i->", y)), np.float64(np.dot(y, y)), n, k)


def scale_where_needed(res, x, starts, counts, finite, amax):
    """Overwrite res[i, 2:4] (mean, L2) by `mean_l2` for each value i of a float64 batch
    (x holds the values back to back from `starts`, zeros in place of non-finite numbers;
    `finite`: each value's count of finite numbers) whose largest finite magnitude `amax`
    is beyond `plain`. A value's result depends on its own numbers alone, never on the
    batch it was reduced in."""
    for i in np.flatnonzero(~plain(np.float64, counts, amax)):
        s = int(starts[i])
        res[i, 2:4] = mean_l2(x[s:s + int(counts[i])], float(amax[i]), int(finite[i]))
