"""A value's mean and L2 from float32 sums on its device that neither overflow nor underflow.

float32 squares underflow below ~1e-19 and overflow above ~1.8e19, a sum of numbers near
float32's max overflows, and XLA:CPU and a TPU flush subnormal numbers to 0 in float
arithmetic, comparisons too: Adam's `exp_avg_sq` (at most ~1e-28) read L2 0.0 (issue 66).

Mean and L2: each number falls by its bits into one of three ranges, each summed scaled by
its own power of two (exact: only exponents change), in the digest's one reduction (no
pass for max|x| first), as Blue's algorithm (LAPACK 3.10's nrm2) does:

    small  |x| < 2^-63            x * 2^96, made from its bits (a subnormal too)
    mid    2^-63 <= |x| < 2^47    x
    big    2^47 <= |x|            x * 2^-96

For any count below 2^32 every scaled square is a normal float32 and no sum of them
passes 2^127; the numbers themselves are summed as small (x * 2^96) and the rest
(x * 2^-33). The host puts the five sums together in float64 (`finish`).

Min and max stay the device's float comparisons: a subnormal there compares as 0 (a
value of subnormals alone reads min and max 0 where its mean and L2 are right); ordering
the numbers' bits as integers instead cost XLA:CPU 6x a float min.
"""

import numpy as np

from ...trace import norms

UP, REST = 96, -33                           # small numbers * 2^UP; the others * 2^REST
_SMALL, _BIG = (127 - 63) << 23, (127 + 47) << 23   # |x|'s bits at 2^-63 and 2^47
_MANT = 1 << 23                               # |x|'s bits below it: subnormal or zero
TERMS = 5                                     # small sum, rest sum, three square sums


def terms(v, fin):
    """Traced: the TERMS float32 arrays of v's shape (float32 numbers; `fin`: which are
    finite) whose sums `finish` reads: small numbers scaled up, the rest scaled down, and
    the squares of the small, mid and big ones, each scaled by its range's power."""
    import jax.numpy as jnp
    from jax import lax

    f32 = jnp.float32
    bits = lax.bitcast_convert_type(v, jnp.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    small = mag < np.uint32(_SMALL)
    big = fin & (mag >= np.uint32(_BIG))
    mid = fin & ~small & ~big
    # a subnormal (or 0) is its mantissa times 2^-149: an integer below 2^23, exact in
    # float32, times 2^(UP - 149), a normal number; a normal small number times 2^UP
    sub = mag.astype(f32) * f32(2.0 ** (UP - 149))
    up = jnp.where(mag < np.uint32(_MANT), jnp.where(bits >= np.uint32(1 << 31), -sub, sub),
                   v * f32(2.0 ** UP))
    up = jnp.where(small, up, f32(0))
    down = jnp.where(big, v * f32(2.0 ** -UP), f32(0))
    rest = jnp.where(fin & ~small, v * f32(2.0 ** REST), f32(0))
    return [up, rest, up * up, jnp.where(mid, v * v, f32(0)), down * down]


def plain_terms(total, squares):
    """Traced: `terms`' TERMS sums from the plain sum and sum of squares of a value whose
    largest magnitude lies in `plain_range` (the rest sum rescaled: exact unless it is
    below 2^-93, nothing its mean can see beside its RMS)."""
    import jax.numpy as jnp

    zero = jnp.zeros((), jnp.float32)
    return [zero, total * jnp.float32(2.0 ** REST), zero, squares, zero]


def plain_range(n):
    """(lo, hi) as float32: a value of n float32 numbers whose largest magnitude lies
    within gets its plain float32 sums within eps of float64's (trace/norms.py); 0 is
    outside, since a flushed subnormal reads as 0."""
    lo, hi = norms.plain_range(np.float32, n)
    return np.float32(lo), np.float32(hi)


def finish(sums, finite):
    """(mean, L2) as float64 arrays from the TERMS float32 sums of each value (an (n,
    TERMS) array) and its count of finite numbers: NaN for a value with none."""
    f = np.asarray(sums, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (np.ldexp(f[:, 0], -UP) + np.ldexp(f[:, 1], -REST)) / finite
        l2 = np.sqrt(np.ldexp(f[:, 2], -2 * UP) + f[:, 3] + np.ldexp(f[:, 4], 2 * UP))
    return mean, l2

