"""Which layout of b's array compares with a's: the axis order (a reshape, a transpose, NCHW
against NHWC) under which two frameworks' values of one quantity agree best, judged on a
fixed sample of elements. Kept apart from the differ (`cross.py`) because it is a question
about two arrays alone, asked before any value is compared."""

import numpy as np

from . import graph as _graph

SAMPLE = 2048          # elements compared to choose a layout


def _as_f64(x):
    x = np.asarray(x)
    try:
        return x.astype(np.float64) if x.dtype.kind in "fiub" else None
    except (TypeError, ValueError):
        return None


def best_layout(xa, xb, same_shape_exact=False):
    """The axis order under which b's array agrees best with a's (see
    `graph.permutations_to`), judged on a sample of elements; None if none fits.
    `same_shape_exact`: two arrays of one shape keep it (None) unless it disagrees and
    another order agrees on every sampled element (a JAX einsum's `dot_general` that
    computes the attention output with its last two axes swapped, [b, h, d, q] against
    torch SDPA's [b, h, q, d] when d == q).
    Agreeing best: most elements close. Where under no order do most agree (the two differ: gelu
    against relu), a fraction of a few coincidences picks a layout at random (it compared
    NHWC with NCHW read as NHWC, 2.67 for 0.17): then the frameworks' convention that maps
    b's shape onto a's (channels first <-> last, the 2-D transpose), else the order with the
    smallest mean squared difference."""
    xa, xb = np.asarray(xa), np.asarray(xb)
    perms = _graph.permutations_to(xa.shape, xb.shape)
    if same_shape_exact:
        best = best_layout(xa, xb) if len(perms) > 1 else None
        if best is None or best == tuple(range(xa.ndim)) or \
                _sample_score(xa, xb, perms[0]) == 1.0 or _sample_score(xa, xb, best) < 1.0:
            return None
        return best
    if not perms:
        return None
    if len(perms) == 1:
        return perms[0]
    fa, coords = _sample(xa)
    best, best_score, nearest, nearest_sq = None, -1.0, None, np.inf
    for p in perms:
        fb = _laid_out(xb, xa.shape, coords, p)
        if fa is None or fb is None:
            return perms[0]
        close = _close(fa, fb)
        with np.errstate(invalid="ignore", over="ignore"):
            sq = float(np.nanmean(np.square(fa - fb))) if len(close) else 0.0
        score = float(close.mean()) if len(close) else 1.0
        if score > best_score:
            best, best_score = p, score
        if sq < nearest_sq:
            nearest, nearest_sq = p, sq
        if score == 1.0:
            break
    if best_score >= 0.5:
        return best
    return next((p for p in perms if _graph.conventional(p) and
                 [xa.shape[i] for i in p] == list(xb.shape)), nearest or best)


def _sample(xa):
    """(a's sampled elements as float64, or None; their coordinates): the `SAMPLE` elements
    (all of a small array) a layout is judged on, the same ones at every call."""
    n = xa.size
    idx = np.random.default_rng(0).choice(n, SAMPLE, replace=False) if n > SAMPLE else np.arange(n)
    return _as_f64(xa.reshape(-1)[idx]), np.unravel_index(idx, xa.shape)


def _laid_out(xb, shape_a, coords, p):
    """b's elements at a's sampled coordinates, b laid out by axis order `p` (float64, or
    None)."""
    flat = np.ravel_multi_index([coords[i] for i in p], [shape_a[i] for i in p])
    return _as_f64(np.asarray(xb).reshape(-1)[flat])


def _close(fa, fb):
    """Which sampled elements agree (rtol 1e-2: a layout, not a tolerance)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.isclose(fa, fb, rtol=1e-2, atol=1e-6, equal_nan=True)


def _sample_score(xa, xb, p):
    """The share of sampled elements of a that b, laid out by `p`, agrees with (rtol 1e-2)."""
    fa, coords = _sample(xa)
    fb = _laid_out(xb, xa.shape, coords, p)
    if fa is None or fb is None or not len(fa):
        return 1.0
    return float(_close(fa, fb).mean())
