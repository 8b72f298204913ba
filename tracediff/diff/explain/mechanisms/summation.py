"""Summation order, FMA and accumulation width: how a matmul, a convolution or a reduction
may have added its products.

The variants re-run the sum in order, pairwise (numpy's order), over SIMD lanes, or in
k-blocks, with or without fused multiply-adds, with the bias added first or last; the
hypotheses `fma`, `separate_multiply_add`, `summation_order` and `float64_accumulation`
report the best variant of each. A fused expression of a compiled probe (`Expr`) is
contracted or evaluated op by op for `fma` and `separate_multiply_add`.
"""

import numpy as np

from .expression import Expr
from .numerics import _cast, _fma, _wide_dtype
from .problems import Dot

MAX_LOOP_WORK = 1 << 21    # elements x steps of the Python-loop variants (FMA, lanes)


# -- summation variants ---------------------------------------------------------------------

def _products(a, b, acc):
    with np.errstate(all="ignore"):
        return a.astype(acc) * b.astype(acc) if b is not None else a.astype(acc)


def _sequential(a, b, acc, fma, init=None):
    """sum_k a[:, k] * b[:, k] in order, in dtype `acc`, starting from `init`."""
    p, k = a.shape
    if fma and b is not None:
        s = np.zeros(p, acc) if init is None else init.astype(acc)
        f = _fma(acc)
        for j in range(k):
            s = f(a[:, j], b[:, j], s)
        return s.astype(acc)
    terms = _products(a, b, acc)
    if init is not None:
        terms = np.concatenate([init.astype(acc)[:, None], terms], axis=1)
    with np.errstate(all="ignore"):
        return np.cumsum(terms, axis=1, dtype=acc)[:, -1]   # add.accumulate: in order


def _pairwise(a, b, acc, init=None):
    """numpy's pairwise summation (8 partial sums, blocks of 128)."""
    terms = _products(a, b, acc)
    if init is not None:
        terms = np.concatenate([init.astype(acc)[:, None], terms], axis=1)
    with np.errstate(all="ignore"):
        return np.add.reduce(np.ascontiguousarray(terms), axis=1)


def _lanes(a, b, acc, fma, width, halves):
    """k split over `width` SIMD lanes (lane l sums k = l, l + width, ...), the lanes then
    added by halves (the usual horizontal reduction) or in order."""
    p, k = a.shape
    pad = (-k) % width
    a = np.concatenate([a, np.zeros((p, pad), a.dtype)], axis=1).reshape(p, -1, width)
    b = None if b is None else \
        np.concatenate([b, np.zeros((p, pad), b.dtype)], axis=1).reshape(p, -1, width)
    with np.errstate(all="ignore"):
        if fma and b is not None:
            lanes = np.zeros((p, width), acc)
            f = _fma(acc)
            for j in range(a.shape[1]):
                lanes = f(a[:, j], b[:, j], lanes)
        else:
            lanes = np.cumsum(_products(a, b, acc), axis=1, dtype=acc)[:, -1, :]
        if halves:
            while lanes.shape[1] > 1:
                h = lanes.shape[1] // 2
                lanes = lanes[:, :h] + lanes[:, h:]
            return lanes[:, 0]
        return np.cumsum(lanes, axis=1, dtype=acc)[:, -1]


def _blocked(a, b, acc, fma, block, init=None):
    """k in blocks of `block`, each summed in order from zero and then added to the
    result (a GEMM's k-blocking: C += A_block @ B_block)."""
    p, k = a.shape
    total = np.zeros(p, acc) if init is None else init.astype(acc)
    with np.errstate(all="ignore"):
        for s in range(0, k, block):
            total = total + _sequential(a[:, s:s + block], None if b is None else
                                        b[:, s:s + block], acc, fma)
    return total


def _acc_dtype(out):
    return np.float64 if out == "float64" else np.float32


def _finish(values, prob, acc, bias_at):
    """Scale by alpha, add the bias last when `bias_at == "last"`, round to the output."""
    with np.errstate(all="ignore"):
        v = values.astype(acc)
        if getattr(prob, "alpha", 1) != 1:
            v = v * acc(prob.alpha)
        bias = getattr(prob, "bias", None)
        if bias is not None and bias_at == "last":
            b = bias.astype(acc)
            v = v + (b * acc(prob.beta) if prob.beta != 1 else b)
        return _cast(v, prob.out)


def _bias_places(prob):
    if getattr(prob, "bias", None) is None:
        return [("none", None)]
    places = [("last", None)]
    if prob.alpha == 1:
        b = prob.bias.astype(_acc_dtype(prob.out))
        places.insert(0, ("first", b * b.dtype.type(prob.beta) if prob.beta != 1 else b))
    return places


_BIAS_WORDS = {"first": ", bias added first", "last": ", bias added last", "none": ""}


def _order_variants(prob, a, b, fma_choices, orders):
    """(note, candidate) for each summation order in `orders` x FMA choice x bias place."""
    acc = _acc_dtype(prob.out)
    k = a.shape[1]
    loop_ok = a.size * 4 <= MAX_LOOP_WORK
    for place, init in _bias_places(prob):
        bw = _BIAS_WORDS[place]
        for fma in fma_choices:
            fw = ", products fused into the sum (FMA)" if fma else ""
            if fma and not loop_ok:
                continue
            if "sequential" in orders:
                yield (f"k summed in order{fw}{bw}",
                       _finish(_sequential(a, b, acc, fma, init), prob, acc, place))
            if "pairwise" in orders and not fma:
                yield (f"k summed pairwise (numpy's order){bw}",
                       _finish(_pairwise(a, b, acc, init), prob, acc, place))
            if "lanes" in orders and place != "first" and loop_ok:
                for width in (4, 8, 16):
                    if width >= k:
                        continue
                    for halves in (True, False):
                        yield (f"k over {width} SIMD lanes, lanes added "
                               f"{'by halves' if halves else 'in order'}{fw}{bw}",
                               _finish(_lanes(a, b, acc, fma, width, halves), prob, acc, place))
            if "blocked" in orders:
                for block in (64, 128, 256):
                    if block >= k:
                        continue
                    yield (f"k in blocks of {block}, each summed in order{fw}{bw}",
                           _finish(_blocked(a, b, acc, fma, block, init), prob, acc, place))


def _wide_dot(prob, a, b):
    wide = _wide_dtype(prob.out)
    with np.errstate(all="ignore"):
        v = np.sum(a.astype(wide) * (b.astype(wide) if b is not None else 1), axis=1)
        v = v * wide(prob.alpha) if getattr(prob, "alpha", 1) != 1 else v
        if getattr(prob, "bias", None) is not None:
            v = v + prob.bias.astype(wide) * wide(prob.beta)
    return v


def _dot_ab(prob):
    return (prob.a, prob.b) if isinstance(prob, Dot) else (prob.terms, None)


def _h_fma(prob):
    if isinstance(prob, Dot):
        yield from _order_variants(prob, prob.a, prob.b, (True,), ("sequential",))
    elif isinstance(prob, Expr):
        for note, cand in prob.contracted():
            yield note, cand


def _h_separate(prob):
    if isinstance(prob, Dot):
        yield from _order_variants(prob, prob.a, prob.b, (False,), ("sequential",))
    elif isinstance(prob, Expr) and prob.has_contraction():
        yield "every operation rounded", _cast(prob.evaluate("separate"), prob.out)


def _h_order(prob):
    a, b = _dot_ab(prob)
    orders = ("pairwise", "lanes", "blocked") if isinstance(prob, Dot) else \
        ("sequential", "pairwise", "lanes", "blocked")
    yield from _order_variants(prob, a, b, (False, True) if b is not None else (False,),
                               orders)


def _h_wide(prob):
    a, b = _dot_ab(prob)
    wide = "long double" if prob.out == "float64" else "float64"
    yield f"products and sums in {wide}, rounded once", _cast(_wide_dot(prob, a, b), prob.out)
