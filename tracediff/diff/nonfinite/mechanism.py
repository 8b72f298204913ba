"""How an op made NaN or Inf, in words, from the values it read: a log or square root of a
negative number, a division by zero, an overflow past the dtype's largest finite value,
0 × Inf, Inf − Inf.

Where the bytes were stored the words name the element: the first non-finite output
element and what the op read there ("at [9]: log(-0.4228)"); at `--level stats` they rest
on the inputs' minimum, maximum and counts ("input min -0.42"), which prove a domain error
or an overflow but can only say a divisor's range holds zero.
"""

import math

import numpy as np

LOG = {"log", "log2", "log10"}
SQRT = {"sqrt"}
RSQRT = {"rsqrt"}
RECIPROCAL = {"reciprocal"}
DIVIDE = {"div", "true_divide", "divide", "floor_divide", "addcdiv", "rem", "fmod", "remainder"}
POWER = {"pow", "integer_pow", "float_power"}
EXPONENTIAL = {"exp": math.log, "expm1": math.log, "exp2": math.log2,
               "cosh": lambda m: math.log(2 * m), "sinh": lambda m: math.log(2 * m)}
DOMAIN_ONE = {"acos", "asin", "atanh", "erfinv", "erf_inv", "arccos", "arcsin", "arctanh"}
GAMMA = {"lgamma", "digamma", "polygamma", "mvlgamma"}
CAST = {"convert_element_type", "to_copy", "to", "copy", "type_as", "half", "bfloat16",
        "reduce_precision"}
PRODUCT = {"mul", "dot_general", "mm", "matmul", "bmm", "addmm", "baddbmm", "addbmm", "linear",
           "conv", "convolution", "conv_general_dilated", "einsum", "prod", "reduce_prod",
           "addcmul", "mv", "dot", "vdot", "square", "outer", "addmv"}
SUM = {"add", "sub", "add_any", "sum", "reduce_sum", "mean", "cumsum", "rsub", "subtract",
       "cumlogsumexp", "logsumexp"}
SOFTMAX = {"softmax", "log_softmax", "safe_softmax"}
FILL = {"masked_fill", "fill", "full", "full_like", "index_fill", "index_put", "scatter",
        "new_full", "masked_scatter", "where", "select_n", "broadcast_in_dim", "pad"}
NORM = {"native_layer_norm", "layer_norm", "native_batch_norm", "batch_norm", "group_norm",
        "native_group_norm", "rms_norm", "instance_norm", "var", "std", "var_mean"}

# the largest finite value of each float dtype a trace names
LARGEST = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
           "float64": 1.7976931348623157e308, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0,
           "complex64": 3.4028234663852886e38, "complex128": 1.7976931348623157e308}


def base_name(op):
    """`aten::_foreach_div_.ScalarList` -> "div"; `aten::log.default` -> "log"; JAX
    primitives as they are."""
    name = op.split("::", 1)[-1].split(".", 1)[0]
    if name.startswith("_foreach_"):
        name = name[len("_foreach_"):]
    return name.strip("_")


def _g(x):
    if x is None:
        return "?"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.4g}"


def describe(op, params, made, out_dtype, inputs, arrays, out_array):
    """(mechanism, element): the words for how `op` made `made` ("NaN", "Inf", "NaN and
    Inf") from `inputs` ([NonFiniteValue], their `element` filled in here where `arrays`
    and `out_array` give the bytes)."""
    name = base_name(op)
    element = _elements(name, inputs, arrays, out_array)
    finite_in = all(v.finite is not False for v in inputs)
    words = (_from_finite if finite_in else _from_nonfinite)(name, params, made, out_dtype, inputs)
    return words, element


# -- the element where it happened ------------------------------------------------------------

def _elements(name, inputs, arrays, out):
    """Fill each input's `element` with its value at the first non-finite output element
    (elementwise ops: the input broadcast to the output's shape); "at [i]: op(x, y)"."""
    if out is None or not np.issubdtype(np.asarray(out).dtype, np.inexact) and \
            np.asarray(out).dtype.kind not in "fcV":
        return ""
    try:
        y = np.asarray(out).astype(np.complex128 if np.iscomplexobj(out) else np.float64)
    except (TypeError, ValueError):
        return ""
    bad = np.flatnonzero(~np.isfinite(y.reshape(-1)))
    if not len(bad):
        return ""
    idx = int(bad[0])
    shown = []
    for v, x in zip(inputs, arrays):
        if x is None:
            continue
        try:
            xb = np.broadcast_to(np.asarray(x).astype(np.float64), y.shape)
        except (TypeError, ValueError):
            return ""      # not elementwise: no one element to name
        v.element = float(xb.reshape(-1)[idx])
        shown.append(_g(v.element))
    if not shown:
        return ""
    where = "at [" + ", ".join(str(int(i)) for i in np.unravel_index(idx, y.shape)) + "]: " \
        if y.ndim else ""
    return f"{where}{name}({', '.join(shown)}) = {_g(y.reshape(-1)[idx])}"


# -- from finite inputs: the origin -----------------------------------------------------------

def _lo(v):
    return v.element if v.element is not None else v.min


def _hi(v):
    return v.element if v.element is not None else v.max


def _least(v):
    """The evidence of a domain error: the input's minimum (its element where known alone)."""
    return f"input min {_g(v.min)}" if v.min is not None else f"input {_g(v.element)}"


def _largest(v):
    """The evidence of an overflow: the input's largest magnitude."""
    if v.min is None or v.max is None:
        return f"input {_g(v.element)}"
    return f"input max {_g(v.max)}" if abs(v.max) >= abs(v.min) else f"input min {_g(v.min)}"


def _range(v):
    return f"input min {_g(v.min)}, max {_g(v.max)}" if v.min is not None else \
        f"input {_g(v.element)}"


def _from_finite(name, params, made, out_dtype, inputs):
    x = inputs[0] if inputs else None
    nan = "NaN" in made
    if name in FILL:
        value = _argument(params, ("value=", "fill_value="))
        return (f"{name} writes {value if value else 'a non-finite value'} given as an argument "
                f"(a mask's fill value), not computed from its inputs")
    if x is None:
        return f"{name} made {made} (no recorded input)"
    if name in LOG:
        return (f"{name} of a negative number: {_least(x)}" if nan else
                f"{name} of zero: {_range(x)}")
    if name == "log1p":
        return (f"log1p of a number below -1: {_least(x)}" if nan else
                f"log1p of -1: {_range(x)}")
    if name in SQRT:
        return f"square root of a negative number: {_least(x)}"
    if name in RSQRT:
        return (f"rsqrt of a negative number: {_least(x)}" if nan else
                f"rsqrt of zero: {_range(x)}")
    if name in RECIPROCAL:
        return f"reciprocal of zero: {_range(x)}"
    if name in DIVIDE:
        return _division(name, made, inputs)
    if name in POWER:
        return _power(name, params, made, inputs, out_dtype)
    if name in EXPONENTIAL:
        return _overflow_exp(name, x, out_dtype)
    if name in DOMAIN_ONE or name in ("acosh", "arccosh"):
        bound = "below 1" if "cosh" in name else "outside [-1, 1]"
        return f"{name} of a number {bound}: {_range(x)}"
    if name in GAMMA:
        return f"{name} at a pole (zero or a negative integer): {_range(x)}"
    if name in CAST:
        return _cast(x, out_dtype)
    if name in NORM:
        return f"{name} of values with zero variance (a constant row) and no epsilon: {_range(x)}"
    big = max((abs(_lo(v) or 0.0) for v in inputs), default=0.0)
    big = max([big] + [abs(_hi(v) or 0.0) for v in inputs])
    limit = LARGEST.get(out_dtype)
    what = f"overflow: the result passes {out_dtype}'s largest finite value ({_g(limit)})" \
        if limit else "overflow"
    if name in PRODUCT | SUM:
        tail = ", then Inf − Inf" if nan else ""
        return f"{what}{tail}: inputs up to {_g(big)} in magnitude"
    return f"{name} made {made} from finite inputs (inputs up to {_g(big)} in magnitude)"


def _division(name, made, inputs):
    slot = 2 if name == "addcdiv" and len(inputs) > 2 else 1
    num = inputs[1 if name == "addcdiv" and len(inputs) > 2 else 0]
    den = inputs[slot] if len(inputs) > slot else None
    if den is None:   # a division by a scalar argument
        return f"division by zero ({made})"
    if "NaN" in made and _zero_at(num):
        return f"0 / 0: {_zero_words(den)}, and the numerator is 0 there"
    return f"division by zero: {_zero_words(den)}"


def _zero_at(v):
    """The numerator is 0 where the output is NaN: its element, or all of it."""
    if v.element is not None:
        return v.element == 0
    return v.min == 0 and v.max == 0


def _zero_words(v):
    """What the trace knows of a divisor's zeros."""
    if v.zeros:
        return f"the divisor holds {v.zeros} zero{'s' if v.zeros > 1 else ''}"
    if v.min is not None and v.max is not None:
        if v.min == 0 and v.max == 0:
            return "the divisor is all zeros"
        if v.min == 0 or v.max == 0:
            return f"the divisor holds 0 (min {_g(v.min)}, max {_g(v.max)})"
        if v.min < 0 < v.max:
            return f"the divisor's range holds 0 (min {_g(v.min)}, max {_g(v.max)})"
        return f"divisor min {_g(v.min)}, max {_g(v.max)}"
    return "the divisor's values were not recorded"


def _argument(params, keys):
    """The text of the first of `keys` ("value=") in an op's recorded params, or ""."""
    for key in keys:
        head, sep, tail = params.partition(key)
        if sep and (not head or head.endswith(", ")):
            return tail.split(",", 1)[0].strip()
    return ""


def _exponent(name, params, inputs):
    if len(inputs) > 1:
        return _lo(inputs[1])
    try:
        return float(_argument(params, ("y=", "exponent=")))
    except ValueError:
        return None


def _power(name, params, made, inputs, out_dtype=""):
    x = inputs[0]
    p = _exponent(name, params, inputs)
    ptxt = f", exponent {_g(p)}" if p is not None else ""
    if "NaN" in made:
        return f"a negative number to a fractional power: {_range(x)}{ptxt}"
    if p is not None and p < 0 and (_lo(x) or 0) <= 0 <= (_hi(x) or 0):
        return f"zero to a negative power: {_range(x)}{ptxt}"
    limit = LARGEST.get(out_dtype)
    past = f": the result passes {out_dtype}'s largest finite value {_g(limit)}" if limit else ""
    return f"overflow in {name}{past}: {_largest(x)}{ptxt}"


def _overflow_exp(name, x, out_dtype):
    limit = LARGEST.get(out_dtype)
    if not limit:
        return f"{name} overflows: {_largest(x)}"
    edge = EXPONENTIAL[name](limit)
    return (f"{name} overflows {out_dtype}: {_largest(x)}, above {_g(edge)}, where {name} "
            f"passes {out_dtype}'s largest finite value {_g(limit)}")


def _cast(x, out_dtype):
    limit = LARGEST.get(out_dtype)
    big = max(abs(_lo(x) or 0.0), abs(_hi(x) or 0.0))
    if limit:
        return (f"a cast to {out_dtype} overflows: {_largest(x)}, beyond {out_dtype}'s largest "
                f"finite value {_g(limit)}" if big > limit else
                f"a cast to {out_dtype} overflows: values up to {_g(big)}")
    return f"a cast to {out_dtype} overflows: {_range(x)}"


# -- from non-finite inputs: where Inf turns into NaN -----------------------------------------

def _has_inf(v):
    return bool(v.inf) or (v.element is not None and math.isinf(v.element))


def _has_zero(v):
    if v.element is not None:
        return v.element == 0
    return bool(v.zeros) or v.min == 0 or v.max == 0 or \
        (v.min is not None and v.max is not None and v.min < 0 < v.max)


def _from_nonfinite(name, params, made, out_dtype, inputs):
    if any(v.nan for v in inputs) and all(not v.inf for v in inputs):
        return f"{name} read NaN and passed it on"
    infs = [v for v in inputs if _has_inf(v)]
    if name in PRODUCT:
        others = [v for v in inputs if v not in infs or len(infs) > 1]
        if any(_has_zero(v) for v in others) or len(inputs) == 1:
            return "0 × Inf: a product of Inf and zero"
        return f"{name} of Inf makes NaN (0 × Inf inside the op)"
    if name in SUM:
        return "Inf − Inf: infinities of opposite sign added"
    if name in DIVIDE:
        return "Inf / Inf" if len(infs) > 1 or (len(inputs) > 1 and _has_inf(inputs[-1])) \
            else "0 / 0 or Inf / Inf"
    if name in SOFTMAX:
        return "Inf − Inf in the softmax: a row whose largest element is Inf, or every element -Inf"
    if name in NORM:
        return f"{name} of values holding Inf: Inf − Inf in its mean"
    return f"{name} of Inf makes NaN"
