"""Division and transcendental functions: the correctly rounded result, and division as a
multiplication by the reciprocal (a compiler's rewrite of division by a constant, fast
math). The exact result is the op computed wide (float64, or long double for float64
ops) and rounded once.
"""

import numpy as np

from .numerics import _cast, _wide_dtype
from .problems import Elementwise

def _h_reciprocal(prob):
    if not isinstance(prob, Elementwise) or prob.name != "division":
        return
    x, y = (v[prob.positions] for v in prob.inputs)
    with np.errstate(all="ignore"):
        if prob.out == "bfloat16":
            r = _cast(_cast(1.0 / y.astype(np.float64), "bfloat16").astype(np.float64) *
                      x.astype(np.float64), "bfloat16")
        else:
            one = np.ones((), x.dtype)
            r = x * (one / y)
    yield "x * (1/y), each rounded", _cast(r, prob.out)


def _elementwise_exact(prob, inputs):
    """The op on these (full) inputs, computed wide and rounded once, at the positions."""
    if prob.name == "division":
        x, y = (v[prob.positions] for v in inputs)
        wide = _wide_dtype(prob.out)
        with np.errstate(all="ignore"):
            if prob.out == "float64":
                return x / y   # IEEE division is correctly rounded
            return _cast(x.astype(wide) / y.astype(wide), prob.out)
    out = prob.case.wide([v.reshape(np.shape(prob.case.inputs[0])) if i == 0 else v
                          for i, v in enumerate(inputs)])
    return _cast(np.asarray(out[0]).reshape(-1)[prob.positions], prob.out)


def _h_correct(prob):
    if not isinstance(prob, Elementwise):
        return
    how = "IEEE division" if prob.name == "division" else \
        "evaluated in " + ("long double" if prob.out == "float64" else "float64")
    yield f"{how}, rounded once", _elementwise_exact(prob, prob.inputs)
