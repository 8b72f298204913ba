"""The problems: a side's origin op (`Case`) rewritten in a form the hypotheses compute.

A matmul or a convolution becomes a `Dot` (one dot product per compared output position;
a convolution's input windows under the kernel, explain/convolution.py), a reduction
`Terms`, a division or a transcendental function an `Elementwise`. Large outputs are
compared on `MAX_ELEMENTS` evenly spaced positions, and the note says so. The op-name sets
here say which op is which problem.
"""

import dataclasses

import numpy as np

from .. import convolution as _conv

MAX_ELEMENTS = 512         # output elements compared per hypothesis (evenly spaced sample)


MATMUL_OPS = {"dot", "mm", "bmm", "addmm", "addmv", "mv", "matmul", "linear", "baddbmm",
              "dot_general"}
CONV_OPS = _conv.CONV_OPS
REDUCTION_OPS = {"reduce_sum", "sum"}
DIVISION_OPS = {"div", "div_", "true_divide"}
TRANSCENDENTAL_OPS = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "logistic", "sigmoid",
    "erf", "erfc", "erf_inv", "erfinv", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
    "cosh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "cbrt", "lgamma", "digamma", "gelu",
    "silu", "softplus", "reciprocal"}


@dataclasses.dataclass
class Case:
    """One side's origin op, as the hypotheses need it."""

    side: str
    framework: str
    op: str
    params: dict
    inputs: list                # recorded input arrays, in slot order
    outputs: list               # recorded output arrays (None where not stored)
    kernel: object = None       # inputs -> [outputs]: the op as this machine runs it
    wide: object = None         # inputs -> [outputs] in float64 (float32 ops) or long double
    expr: object = None         # Expr: the fused expression the op ends, or None
    backend: str = ""           # where the side ran it (the manifest's frameworks.jax.backend)
    matmul_precision: object = None   # the manifest's jax_default_matmul_precision


def base_name(op):
    """`aten::addmm.default` -> `addmm`; a JAX primitive name is its own base."""
    return op.split("::", 1)[-1].split(".", 1)[0]


def _positions(n):
    """Flat output indices compared: all of them, or MAX_ELEMENTS evenly spaced."""
    if n <= MAX_ELEMENTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, MAX_ELEMENTS).round().astype(np.int64))


# -- problems: the op rewritten in a form the hypotheses compute ----------------------------

@dataclasses.dataclass
class Dot:
    """out[p] = beta * bias[p] + alpha * sum_k a[p, k] * b[p, k] at the compared positions."""

    a: np.ndarray
    b: np.ndarray
    bias: object
    alpha: float
    beta: float
    out: str                 # output dtype name
    target: np.ndarray       # the recorded output at the compared positions
    positions: np.ndarray
    slots: tuple             # input slots holding the two matrices (for the kernel runs)
    case: Case
    sample: str = ""


@dataclasses.dataclass
class Terms:
    """out[p] = sum_k terms[p, k] (a reduction)."""

    terms: np.ndarray
    out: str
    target: np.ndarray
    sample: str = ""


@dataclasses.dataclass
class Elementwise:
    """An elementwise op (division, a transcendental function) on broadcast inputs."""

    name: str
    inputs: list
    out: str
    target: np.ndarray
    positions: np.ndarray
    case: Case
    sample: str = ""


def _sample_note(n, positions):
    return "" if len(positions) == n else f"on {len(positions)} of {n} elements"


def _matmul_operands(case):
    """(A (batch, M, K), B (batch, K, N), bias or None, alpha, beta, slots) or None."""
    x, p, name = [np.asarray(v) for v in case.inputs], case.params, base_name(case.op)
    alpha, beta = p.get("alpha", 1), p.get("beta", 1)
    if case.framework == "jax" and name == "dot_general" and len(x) == 2:
        (lc, rc), (lb, rb) = p["dimension_numbers"]
        lhs, rhs = x
        lfree = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
        rfree = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
        size = lambda arr, dims: int(np.prod([arr.shape[d] for d in dims], dtype=np.int64))  # noqa: E731
        nb, m, k, n = size(lhs, lb), size(lhs, lfree), size(lhs, lc), size(rhs, rfree)
        A = lhs.transpose(list(lb) + lfree + list(lc)).reshape(nb, m, k)
        B = rhs.transpose(list(rb) + list(rc) + rfree).reshape(nb, k, n)
        return A, B, None, 1, 1, (0, 1)
    if case.framework != "torch":
        return None
    if name == "dot" and len(x) == 2:
        return x[0][None, None, :], x[1][None, :, None], None, 1, 1, (0, 1)
    if name == "mv" and len(x) == 2:
        return x[0][None], x[1][None, :, None], None, 1, 1, (0, 1)
    if name == "mm" and len(x) == 2:
        return x[0][None], x[1][None], None, 1, 1, (0, 1)
    if name == "bmm" and len(x) == 2:
        return x[0], x[1], None, 1, 1, (0, 1)
    if name == "addmm" and len(x) == 3:
        return x[1][None], x[2][None], x[0], alpha, beta, (1, 2)
    if name == "addmv" and len(x) == 3:
        return x[1][None], x[2][None, :, None], x[0], alpha, beta, (1, 2)
    if name == "baddbmm" and len(x) == 3:
        return x[1], x[2], x[0], alpha, beta, (1, 2)
    if name == "linear" and len(x) in (2, 3):
        k = x[0].shape[-1]
        return x[0].reshape(1, -1, k), x[1].T[None], x[2] if len(x) == 3 else None, 1, 1, (0, 1)
    if name == "matmul" and len(x) == 2:
        a = x[0] if x[0].ndim > 1 else x[0][None, :]
        b = x[1] if x[1].ndim > 1 else x[1][:, None]
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        A = np.broadcast_to(a, batch + a.shape[-2:]).reshape(-1, *a.shape[-2:])
        B = np.broadcast_to(b, batch + b.shape[-2:]).reshape(-1, *b.shape[-2:])
        return A, B, None, 1, 1, (0, 1)
    return None


def _is_float(x):
    return np.asarray(x).dtype.kind == "f" or np.asarray(x).dtype.name == "bfloat16"


def matmul_problem(case):
    out = np.asarray(case.outputs[0])
    ops = _matmul_operands(case)
    if ops is None:
        return None
    A, B, bias, alpha, beta, slots = ops
    if not (_is_float(A) and _is_float(B)) or A.shape[-1] != B.shape[-2] or A.shape[-1] == 0:
        return None
    nb, m, k = A.shape
    n = B.shape[-1]
    if B.shape[0] != nb or nb * m * n != out.size:
        return None
    pos = _positions(out.size)
    bt, mm, nn = pos // (m * n), (pos // n) % m, pos % n
    full_bias = None
    if bias is not None:
        try:
            full_bias = np.broadcast_to(np.asarray(bias), out.shape).reshape(-1)[pos]
        except ValueError:
            return None
    return Dot(a=A[bt, mm, :], b=B[bt, :, nn].reshape(len(pos), k), bias=full_bias,
               alpha=float(alpha), beta=float(beta), out=out.dtype.name,
               target=out.reshape(-1)[pos], positions=pos, slots=slots, case=case,
               sample=_sample_note(out.size, pos))


def conv_problem(case):
    """The convolution as a `Dot` at sampled output positions: each one the input window
    under the kernel against that output feature's weights (explain/convolution.py)."""
    out = np.asarray(case.outputs[0])
    x = [np.asarray(v) for v in case.inputs]
    if len(x) not in (2, 3) or not (_is_float(x[0]) and _is_float(x[1])) or \
            x[0].ndim != x[1].ndim or x[0].ndim < 3 or out.ndim != x[0].ndim:
        return None
    name = base_name(case.op)
    try:
        if case.framework == "jax" and name == "conv_general_dilated" and len(x) == 2:
            geo = _conv.jax_geometry(case.params, x[0].ndim)
        elif case.framework == "torch" and name in _conv.TORCH_CONVS:
            geo = _conv.torch_geometry(name, case.params, x[0].ndim, x[1].shape)
        else:
            return None
    except (TypeError, ValueError, KeyError):
        return None
    if geo is None:
        return None
    pos = _positions(out.size)
    ops = _conv.operands(geo, x[0], x[1], out.shape, pos)
    if ops is None:
        return None
    bias = None
    if len(x) == 3:   # torch's bias: one value per output feature (axis 1)
        feat = np.unravel_index(pos, out.shape)[1]
        if x[2].shape != (out.shape[1],):
            return None
        bias = x[2][feat]
    a, b = ops
    return Dot(a=a, b=b, bias=bias, alpha=1.0, beta=1.0, out=out.dtype.name,
               target=out.reshape(-1)[pos], positions=pos, slots=(0, 1), case=case,
               sample=_sample_note(out.size, pos))


def reduction_problem(case):
    if len(case.inputs) != 1:
        return None
    x, out, p = np.asarray(case.inputs[0]), np.asarray(case.outputs[0]), case.params
    if not _is_float(x):
        return None
    if case.framework == "jax":
        axes = p.get("axes")
    else:
        axes = p.get("dim", p.get("_pos1"))
        if axes is None and base_name(case.op) == "sum" and "dtype" not in p:
            axes = tuple(range(x.ndim))
    if axes is None:
        return None
    axes = tuple(int(a) % max(x.ndim, 1) for a in (axes if isinstance(axes, (list, tuple))
                                                   else [axes]))
    keep = [d for d in range(x.ndim) if d not in axes]
    k = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
    terms = x.transpose(keep + list(axes)).reshape(-1, k)
    if terms.shape[0] != out.size or k == 0:
        return None
    pos = _positions(out.size)
    return Terms(terms=terms[pos], out=out.dtype.name, target=out.reshape(-1)[pos],
                 sample=_sample_note(out.size, pos))


def elementwise_problem(case, name):
    out = np.asarray(case.outputs[0])
    xs = [np.asarray(v) for v in case.inputs]
    if name == "division":
        p = case.params
        if p.get("rounding_mode") is not None:
            return None
        if len(xs) == 1 and isinstance(p.get("other"), (int, float)):
            xs.append(np.asarray(p["other"], dtype=xs[0].dtype))
        if len(xs) != 2:
            return None
    elif len(xs) != 1 or case.wide is None:
        return None
    if not all(_is_float(x) for x in xs):
        return None
    try:
        xs = [np.broadcast_to(x, out.shape).reshape(-1) for x in xs]
    except ValueError:
        return None
    pos = _positions(out.size)
    return Elementwise(name=name, inputs=xs, out=out.dtype.name, target=out.reshape(-1)[pos],
                       positions=pos, case=case, sample=_sample_note(out.size, pos))
