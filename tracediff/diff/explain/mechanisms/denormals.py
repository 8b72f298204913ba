"""Denormals flushed to zero (FTZ/DAZ): the hypothesis for any problem whose inputs or
result hold subnormal values, tried only where they do."""

import numpy as np

from .elementwise import _elementwise_exact
from .expression import Expr
from .numerics import _cast
from .problems import Dot, Elementwise, Terms
from .summation import _dot_ab, _wide_dot

def _flush(x):
    """Subnormal values of a float array replaced by zero of the same sign."""
    x = np.asarray(x)
    name = x.dtype.name
    if name == "bfloat16":
        import ml_dtypes

        tiny = float(ml_dtypes.finfo(ml_dtypes.bfloat16).tiny)
    elif x.dtype.kind == "f":
        tiny = float(np.finfo(x.dtype).tiny)
    else:
        return x
    with np.errstate(all="ignore"):
        small = np.abs(x.astype(np.float64)) < tiny
    return np.where(small, (x * 0).astype(x.dtype), x)


def _has_subnormals(*arrays):
    for x in arrays:
        x = np.asarray(x)
        if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
            if not np.array_equal(_flush(x), x, equal_nan=True):
                return True
    return False


def _h_flush(prob):
    if isinstance(prob, Elementwise):
        if not _has_subnormals(*prob.inputs, prob.target):
            return
        cand = _flush(_elementwise_exact(prob, [_flush(v) for v in prob.inputs]))
        yield "inputs and result flushed to zero when subnormal", cand
    elif isinstance(prob, (Dot, Terms)):
        a, b = _dot_ab(prob)
        if not _has_subnormals(a, *(() if b is None else (b,)), prob.target):
            return
        fb = None if b is None else _flush(b)
        yield ("inputs and result flushed to zero when subnormal, summed wide",
               _flush(_cast(_wide_dot(prob, _flush(a), fb), prob.out)))
    elif isinstance(prob, Expr):
        leaves = prob.leaves()
        if not _has_subnormals(*leaves, prob.target):
            return
        flushed = prob.with_leaves([_flush(x) for x in leaves])
        yield ("operands and result flushed to zero when subnormal",
               _flush(_cast(flushed.evaluate("separate"), prob.out)))
