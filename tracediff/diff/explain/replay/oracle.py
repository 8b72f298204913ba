"""The numpy extended-precision oracle of a float64 op: the op evaluated in `np.longdouble`
(x87 80-bit on x86-64), for the few ops numpy computes alike (`_UNARY`, `_BINARY`,
matrix products). A float32 or narrower op's oracle is the op itself run in float64
(`OpCall.run(upcast=True)`, calls.py); a float64 op has only this one, or none.
"""

import numpy as np

from .params import CannotReplay

_HIGH = {"float64", "complex128"}


# -- numpy extended-precision oracle (for float64 ops) ------------------------------------

def _dot_general_np(x, y, dimension_numbers=None, **_):
    (lc, rc), (lb, rb) = dimension_numbers
    if lb or rb:
        raise CannotReplay("batched dot_general has no numpy oracle")
    return np.tensordot(x, y, axes=(tuple(lc), tuple(rc)))


def _logistic(x, **_):
    return 1 / (1 + np.exp(-x))


_UNARY = {"tanh": np.tanh, "exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos,
          "tan": np.tan, "sqrt": np.sqrt, "expm1": np.expm1, "log1p": np.log1p, "neg": np.negative,
          "abs": np.abs, "sinh": np.sinh, "cosh": np.cosh, "arcsinh": np.arcsinh,
          "asinh": np.arcsinh, "atan": np.arctan, "asin": np.arcsin, "acos": np.arccos,
          "rsqrt": lambda x: 1 / np.sqrt(x), "square": np.square, "sigmoid": None,
          "logistic": None, "exp2": np.exp2, "reciprocal": lambda x: 1 / x}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "pow": np.power, "atan2": np.arctan2, "max": np.maximum, "min": np.minimum,
           "maximum": np.maximum, "minimum": np.minimum}


def numpy_oracle(framework, op, params, inputs):
    """The op evaluated by numpy in long double (complex: clongdouble), or None when
    there is no numpy equivalent here (or long double is no wider than float64)."""
    if np.finfo(np.longdouble).nmant <= np.finfo(np.float64).nmant:
        return None
    name = op.split("::", 1)[-1].split(".", 1)[0] if framework == "torch" else op

    def wide(x):
        x = np.asarray(x)
        if x.dtype.kind == "c":
            return x.astype(np.clongdouble)
        if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
            return x.astype(np.longdouble)
        return x

    xs = [wide(x) for x in inputs]
    try:
        with np.errstate(all="ignore"):
            if name in ("logistic", "sigmoid") and len(xs) == 1:
                return [_logistic(xs[0])]
            if name in _UNARY and _UNARY[name] is not None and len(xs) == 1:
                return [_UNARY[name](xs[0])]
            if name in _BINARY and len(xs) == 2 and not params.get("alpha", 1) != 1:
                return [_BINARY[name](xs[0], xs[1])]
            if framework == "jax" and name == "dot_general" and len(xs) == 2:
                return [_dot_general_np(*xs, **params)]
            if framework == "torch" and name in ("dot", "mm", "matmul", "mv", "bmm") and len(xs) == 2:
                return [np.matmul(xs[0], xs[1])]
            if framework == "torch" and name == "addmm" and len(xs) == 3:
                return [params.get("beta", 1) * xs[0] + params.get("alpha", 1) *
                        np.matmul(xs[1], xs[2])]
    except (CannotReplay, TypeError, ValueError):
        return None
    return None


def oracle_of_kind(dtype_name):
    """How the oracle of an op with outputs in this dtype is computed."""
    if dtype_name in _HIGH:
        return "longdouble"
    return "float64"
