"""Values whose sums or squares leave their dtype's range, and the float64 truth of their
mean and L2 (issue 66), for the host's statistics (tests/test_fast_capture.py) and the
device's (tests/test_jax_digest.py): computed without numpy's sums, so that a mistake
shared by tracediff's paths cannot hide in the reference."""

import math
from fractions import Fraction

import numpy as np

from tracediff.trace import values


def float_dtypes():
    """(dtype, finfo) of each float dtype a recorded value may have."""
    import ml_dtypes

    return [(np.dtype(np.float16), np.finfo(np.float16)),
            (np.dtype(ml_dtypes.bfloat16), ml_dtypes.finfo(ml_dtypes.bfloat16)),
            (np.dtype(np.float32), np.finfo(np.float32)),
            (np.dtype(np.float64), np.finfo(np.float64))]


def hostile_values(kinds, rng):
    """(what, array) for every float dtype, one value below and one above
    values.WHOLE_VALUE_BYTES (a batch's arithmetic, and a large value's own): `kinds` of
    magnitudes among tiny (normal numbers whose squares underflow the dtype: float32's
    ~4e-29), subnormal, huge (whose squares overflow it: float32's ~8e28), near_max (whose
    sum overflows it) and mixed (huge, tiny and subnormal side by side)."""
    out = []
    for dt, fi in float_dtypes():
        tiny, huge = float(fi.tiny) ** 0.75, float(fi.max) ** 0.75
        sub, mant = float(fi.smallest_subnormal), 2 ** (fi.nmant - 1)
        for n in (1000, values.WHOLE_VALUE_BYTES // dt.itemsize + 100):
            signs = rng.choice([-1.0, 1.0], n)
            spread = rng.uniform(0.5, 2.0, n)
            made = {"tiny": signs * spread * tiny, "huge": signs * spread * huge,
                    "subnormal": signs * sub * rng.integers(1, mant, n),
                    "near_max": float(fi.max) * rng.uniform(0.5, 1.0, n)}
            mixed = made["huge"].copy()
            mixed[1::3], mixed[2::3] = made["tiny"][1::3], made["subnormal"][2::3]
            made["mixed"] = mixed
            for kind in kinds:
                x = made[kind].astype(dt)
                assert np.isfinite(x.astype(np.float64)).all() and (x != 0).all()
                out.append((f"{dt.name} n={n} {kind}", x))
    return out


def float32_tolerances(n, chain=False):
    """(mean's, L2's) relative tolerance for sums of n numbers in float32: the rounding
    locate allows for (diff/compare/levels.py: 1e-6 * log2 n, eps * sqrt n more for the
    L2); `chain`: summed in one sequential chain (XLA:CPU's one pass over a 1-D value),
    whose rounding only the bound of any order of additions holds, (n - 1) * 2^-24."""
    if chain:
        return (n - 1) * 2.0 ** -24, (n - 1) * 2.0 ** -25
    rtol = 1e-6 * max(1.0, math.log2(n))
    return rtol, rtol + 2.0 ** -23 * math.sqrt(n)


def assert_float64_truth(got_mean, got_l2, x, what, tol=(1e-5, 1e-5)):
    """mean and L2 of x's numbers against float64 truth computed without numpy's sums:
    the exact rational mean rounded once, math.hypot (scaled, within an ULP): within `tol`
    (relative; the mean's of the RMS), never 0 or inf where the truth is not."""
    v = np.asarray(x, np.float64).reshape(-1).tolist()
    n = len(v)
    mean = float(sum(map(Fraction, v)) / n)
    l2 = math.hypot(*v)
    assert (got_l2 == 0) == (l2 == 0) and math.isinf(got_l2) == math.isinf(l2), \
        (what, got_l2, l2)
    if math.isfinite(l2):
        assert abs(got_l2 - l2) <= tol[1] * l2, (what, got_l2, l2)
    rms = l2 / math.sqrt(n) if math.isfinite(l2) else abs(mean)
    assert math.isfinite(got_mean) and abs(got_mean - mean) <= tol[0] * rms, \
        (what, got_mean, mean)
    assert mean == 0 or got_mean != 0, (what, got_mean, mean)
