"""The XLA programs that hash and summarise JAX values where they are (issue 37).

Traced code only, run inside a jitted program on the value's device: the words64 hash of
a value's exact bytes (`lanes`: trace/values.py's function, the one numpy computes for
values already on the host, so traces from two backends compare hash to hash) and its
statistics (`values.STAT_FIELDS`: mean and L2 as sums that cannot overflow or underflow,
digest_stats.py), packed into 12 uint32 words a value (`packed`), and the small values'
words end to end for one copy to the host (`fetch_parts`). Which values
take this path and what is read back lives in digest_results.py; device_digests.py runs
these programs for a recording.
"""

import numpy as np

from ...trace import values
from . import digest_stats


def _fmix32(x):
    x = x ^ (x >> 16)
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def words(x):
    """Traced: x's exact bytes as little-endian uint32 words, zero-padded (1-D)."""
    import jax.numpy as jnp
    from jax import lax

    dt = np.dtype(x.dtype)
    if dt.kind == "c":   # real and imaginary parts interleaved, as in memory
        part = np.dtype(np.float32) if dt.itemsize == 8 else np.dtype(np.float64)
        x = jnp.stack([jnp.real(x).astype(part), jnp.imag(x).astype(part)], axis=-1)
        dt = part
    if dt.kind == "b":
        x, dt = x.astype(jnp.uint8), np.dtype(np.uint8)
    flat = x.reshape(-1)
    size = dt.itemsize
    if size == 4:
        return lax.bitcast_convert_type(flat, jnp.uint32)
    if size == 8:
        return lax.bitcast_convert_type(flat, jnp.uint32).reshape(-1)
    narrow = jnp.uint16 if size == 2 else jnp.uint8
    u = lax.bitcast_convert_type(flat, narrow).astype(jnp.uint32)
    per = 4 // size
    pad = (-u.shape[0]) % per
    if pad:
        u = jnp.concatenate([u, jnp.zeros((pad,), jnp.uint32)])
    u = u.reshape(-1, per)
    out = u[:, 0]
    for k in range(1, per):
        out = out | (u[:, k] << (8 * size * k))
    return out


def _positions(shape, a, b):
    """Traced: i*a + b (mod 2^32) for the flat index i of each element of a 1-D or 2-D
    shape; for 2-D (rows, cols) as a row term plus a column term, i = r*cols + c, so an
    element costs one add instead of a multiply and an add (measured on a TPU v5e: the
    hash of 805 MB in 1.67 ms instead of 1.81, the memory's own pace)."""
    import jax.numpy as jnp
    from jax import lax

    if len(shape) == 1:
        return lax.iota(jnp.uint32, shape[0]) * np.uint32(a) + np.uint32(b)
    rows, cols = shape
    col = lax.iota(jnp.uint32, cols) * np.uint32(a) + np.uint32(b)
    row = lax.iota(jnp.uint32, rows) * np.uint32((cols * a) & 0xFFFFFFFF)
    return row[:, None] + col[None, :]


def _terms(w):
    """Traced: the two arrays of uint32 terms whose sums are the words64 lanes of words
    `w` (1-D, or (rows, cols) in memory order)."""
    one = _fmix32(w + _positions(w.shape, values._A1, values._B1))
    two = _fmix32((w ^ np.uint32(values._C2)) * np.uint32(values._M2) +
                  _positions(w.shape, values._A2, values._B2))
    return one, two


def lanes(x):
    """Traced: the two words64 lanes of x (uint32[2]), as values.words_lanes. A value of
    4-byte numbers is hashed in place (`_in_place`; two or more axes as (rows, last
    axis)): the same words in the same order, without flattening it (a copy on a TPU's
    tiled layout) or a multiply per position."""
    import jax.numpy as jnp
    from jax import lax

    pair = _in_place(x) if x.size else None
    w = words(x) if pair is None else pair[0]
    if w.size == 0:
        return jnp.zeros((2,), jnp.uint32)
    one, two = _terms(w)
    if one_pass():   # measured on a TPU v5e: 1.77 ms over 805 MB; one variadic: 4.55
        return jnp.stack([one.sum(dtype=jnp.uint32), two.sum(dtype=jnp.uint32)])
    add = (np.uint32(0), lax.add)   # XLA:CPU: 1.0 ms over 16 MB; two sums: 9.8
    return jnp.stack(_reduce([(one, add), (two, add)]))


def _numbers(x):
    """Traced: x's numbers as float32 (complex: its real and imaginary parts, on a last
    axis of 2)."""
    import jax.numpy as jnp

    if np.dtype(x.dtype).kind == "c":
        return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1).astype(jnp.float32)
    return x.astype(jnp.float32)


def _in_place(x):
    """Traced: (words, numbers) of a non-empty value whose every number is one 4-byte word
    (4-byte reals and integers, complex64's parts), both of one shape: 1-D, or (rows,
    last axis) in memory order; else None (narrower elements share a word)."""
    import jax.numpy as jnp
    from jax import lax

    dt = np.dtype(x.dtype)
    if dt.kind == "c" and dt.itemsize == 8:
        x = _numbers(x)            # the float32 parts, interleaved as in memory
    elif not (dt.itemsize == 4 and dt.kind in "fiu"):
        return None
    x = x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(-1)
    return lax.bitcast_convert_type(x, jnp.uint32), x.astype(jnp.float32)


def _reduce(pairs, together=True):
    """Traced: reductions over all axes of same-shaped operands, `pairs` = [(operand,
    (identity, combine))]. `together`: one variadic reduction, which reads the value once
    for all of them, in two stages where it has two or more axes (over all but the last
    axis, then over that one), so that no float sum runs in a chain longer than the
    number of rows or columns even where the reduction is sequential (XLA:CPU's: an L2
    norm 1.4% off over 16 M numbers in one stage, where locate's bounds allow ~eps *
    sqrt n: diff/compare/levels.py; a 1-D value is reduced in one stage). Otherwise
    each float reduction alone: XLA:CPU vectorises a lone float sum, min or max, not one
    inside a variadic reduction (the hash and unmasked statistics of 16 MB there: 1.2 ms
    apart, 7.0 in one stage)."""
    from jax import lax

    def variadic(ops, dims):
        return lax.reduce(tuple(ops), tuple(p[1][0] for p in rest),
                          lambda a, b: tuple(p[1][1](x, y) for p, x, y in zip(rest, a, b)),
                          dims)

    ndim = pairs[0][0].ndim
    alone = [not together and p[0].dtype == np.float32 for p in pairs]
    rest = [p for p, a in zip(pairs, alone) if not a]
    got = ()
    if rest and together and ndim >= 2 and any(p[0].dtype == np.float32 for p in rest):
        got = variadic(variadic([p[0] for p in rest], tuple(range(ndim - 1))), (0,))
    elif rest:
        got = variadic([p[0] for p in rest], tuple(range(ndim)))
    got = iter(got)
    return tuple(lax.reduce(p[0], p[1][0], p[1][1], tuple(range(ndim))) if a else next(got)
                 for p, a in zip(pairs, alone))


def one_pass():
    """Are a value's hash and statistics reduced together (`_reduce`)? On an accelerator,
    not on XLA:CPU."""
    import jax

    return jax.default_backend() != "cpu"


def _digest(x, masked, together):
    """Traced: (x's WORDS words: the two words64 lanes and `stat_words`; may these stand?)
    of a non-empty value; `together`: in one pass over its memory where its numbers are
    its words (`_in_place`; measured on a TPU v5e over 805 MB in one stage, with one sum
    of the numbers and one of their squares: 1.93 ms, against 2.85 in separate
    reductions, masked 2.17; with digest_stats.py's five sums and `_reduce`'s two stages
    not yet measured there)."""
    import jax.numpy as jnp
    from jax import lax

    add = (np.uint32(0), lax.add)
    pair = _in_place(x)
    if pair is None:   # narrow elements: the hash over words, the statistics over numbers
        hashed, v = [], _numbers(x)
        hash_lanes = lanes(x)
    else:
        w, v = pair
        hashed = list(zip(_terms(w), (add, add)))
    got = _reduce(hashed + stat_parts(v, masked), together)
    if hashed:
        hash_lanes, got = jnp.stack(got[:2]), got[2:]
    words, stand = stat_words(got, v.size, masked)
    return jnp.concatenate([hash_lanes, words]), stand


def stat_parts(v, masked):
    """Traced: [(operand, (identity, combine))] whose reductions `stat_words` reads, of
    float32 numbers v. Unmasked: a plain sum, sum of squares, min and max, which stand
    only where every number is finite (a finite sum proves it: an infinity or NaN stays
    one through any order of additions) and the largest magnitude lies in
    `digest_stats.plain_range`; masked: the definitions of values.segment_stats (min and
    max without NaNs, mean and L2 over the finite numbers, NaN and Inf counts) from
    `digest_stats.terms`, right for any finite number (min and max: of the numbers as the
    device compares them, where a flushed subnormal is 0)."""
    import jax.numpy as jnp
    from jax import lax

    u32 = jnp.uint32
    add = (np.uint32(0), lax.add)
    fadd = (np.float32(0), lax.add)
    low, high = (np.float32(np.inf), lax.min), (np.float32(-np.inf), lax.max)
    if not masked:
        return [(v, fadd), (v * v, fadd), (v, low), (v, high)]
    nan, fin = jnp.isnan(v), jnp.isfinite(v)
    return [(t, fadd) for t in digest_stats.terms(v, fin)] + [
        (jnp.where(nan, jnp.inf, v), low), (jnp.where(nan, -jnp.inf, v), high),
        (nan.astype(u32), add), (fin.astype(u32), add)]


def stat_words(got, n, masked):
    """Traced: (the WORDS - 2 words of the statistics of n numbers from the reductions of
    `stat_parts`: min, max and the TERMS sums of digest_stats.py as float32 bit patterns,
    NaN, Inf and finite counts; may they stand?)."""
    import jax.numpy as jnp
    from jax import lax

    u32 = jnp.uint32
    if masked:
        sums, (mn, mx, n_nan, n_fin) = got[:digest_stats.TERMS], got[digest_stats.TERMS:]
        all_nan = n_nan == n
        mn, mx = jnp.where(all_nan, jnp.nan, mn), jnp.where(all_nan, jnp.nan, mx)
        counts = jnp.stack([n_nan, np.uint32(n) - n_fin - n_nan, n_fin])
        stand = jnp.bool_(True)
    else:
        total, squares, mn, mx = got
        sums = digest_stats.plain_terms(total, squares)
        counts = jnp.array([0, 0, n], u32)
        lo, hi = digest_stats.plain_range(n)
        amax = jnp.maximum(-mn, mx)
        stand = jnp.isfinite(total) & (amax >= lo) & (amax <= hi)
    floats = lax.bitcast_convert_type(jnp.stack([mn, mx, *sums]), u32)
    return jnp.concatenate([floats, counts]), stand


def stat_words_of(x):
    """Traced: `stat_words` of a non-empty real value (masked; xla_stats.py), its numbers
    as float32 in place (1-D, or rows by its last axis: `_reduce`'s two stages)."""
    v = x.astype(np.float32)
    v = v.reshape(-1, v.shape[-1]) if v.ndim >= 2 else v.reshape(-1)
    return stat_words(_reduce(stat_parts(v, True), one_pass()), v.size, True)[0]


# the words of a value with no bytes: hash lanes 0, NaN statistics, no NaN, Inf or finite
EMPTY_WORDS = [0, 0] + [0x7FC00000] * (2 + digest_stats.TERMS) + [0, 0, 0]

_SHARED = {}   # (what, together) -> jitted digest of one value, called inside the programs


def _shared(what, together=None):
    """Traced: one value's digest as a nested jitted function (`masked`: its WORDS words by
    the masked pass; `lanes`: its hash alone). Inside a program each call is a call of
    one function per dtype and shape, traced and lowered once, where the digest written
    out for each of a step's ~200 values was traced and lowered ~200 times (a values
    program of a 512-wide MLP step: 6.3 s to lower and 3.4 MB of text, 0.2 s and 1.2 MB
    so; XLA inlines the calls before it compiles, so the compiled program is the same)."""
    fn = _SHARED.get((what, together))
    if fn is None:
        import jax

        fn = _SHARED[(what, together)] = jax.jit(
            lanes if what == "lanes" else lambda x: _digest(x, True, together)[0])
    return fn


def packed(xs, with_stats, inside=False, together=None):
    """Traced: one uint32 vector, WORDS (or 2) words per value of xs (`_digest`;
    `together`: `one_pass()` where not given). Reduced together (an accelerator), the
    statistics are the masked ones; apart (XLA:CPU, which vectorises a lone unmasked
    reduction), the unmasked ones when they stand for every value of the batch (all
    finite, of magnitudes their plain sums keep: `_digest`), else, by one `lax.cond`, the
    masked ones.
    `inside`: xs are intermediates of the program being traced (a values program),
    summarised by the masked pass alone: a conditional over them would take them all as
    operands, written out to memory, where XLA otherwise fuses their reductions into the
    equations that make them."""
    import jax.numpy as jnp
    from jax import lax

    xs = list(xs)
    if not xs:
        return jnp.zeros((0,), jnp.uint32)
    if not with_stats:
        return jnp.stack([_shared("lanes")(x) for x in xs]).reshape(-1)
    together = one_pass() if together is None else together
    full = [x for x in xs if x.size]
    if not full:
        rows = []
    elif inside or together:
        # the masked pass alone: on a TPU v5e it compiled and ran faster than both
        # branches of the finiteness `cond` below (64 MB: 1.55 s and 0.22 ms, against
        # 2.46 s and 0.33 ms; 16 MB: 2.03 s and 0.17 ms, against 3.04 s and 0.48 ms); the
        # same statistics where every number is finite
        row = _shared("masked", together)
        rows = [row(x) for x in full]
    else:
        quick = [_digest(x, False, together) for x in full]
        stand = jnp.stack([ok for _, ok in quick]).all()
        rows = lax.cond(stand, lambda xs: jnp.stack([r for r, _ in quick]),
                        lambda xs: jnp.stack([_digest(x, True, together)[0] for x in xs]),
                        full)
    empty = jnp.array(EMPTY_WORDS, jnp.uint32)
    out, k = [], 0                                                    # lanes; NaN statistics
    for x in xs:
        if x.size:
            out.append(rows[k])
            k += 1
        else:
            out.append(empty)
    return jnp.stack(out).reshape(-1)


def fetch_parts(xs, small):
    """Traced: (the words64 lanes of xs, the words of those marked in `small` end to end
    or None), for `DeviceDigests.fetched`."""
    return packed(xs, False), join([x for x, j in zip(xs, small) if j])


def join(xs, stack=False):
    """Traced: the words of xs end to end (one uint32 vector) in `join_groups`' order, or
    None for no value. `stack`: a group's values of whole words stacked first, their words
    taken at once (the same bytes: a stack's memory is its values' end to end); only where
    xs are a program's arguments, never its intermediates, which XLA could compute again
    inside the stacking fusion with other rounding (seen on XLA:CPU)."""
    import jax.numpy as jnp

    from .digest_results import join_groups

    if not xs:
        return None
    parts = []
    for group in join_groups([(x.shape, x.dtype) for x in xs]):
        x = xs[group[0]]
        if stack and len(group) > 1 and x.size * np.dtype(x.dtype).itemsize % 4 == 0:
            parts.append(words(jnp.stack([xs[i] for i in group])))
        else:
            parts.extend(words(xs[i]) for i in group)
    return jnp.concatenate(parts)
