"""Mechanism hypotheses: which candidate numerics reproduce each side of a divergence.

The replay verdict (explain/replay/, explain/verdict.py) says whether *this machine* reproduces a or b.
A mechanism says *how* a side computed its value: candidate numerics of the origin op are
re-executed here, in numpy, on each side's own recorded inputs, and each candidate is
compared with that side's recorded output, bitwise or in ULP of the output dtype:

    b's aten::addmm is reproduced bitwise by TF32-rounded inputs (an Ampere GPU ...)

Data-driven: `FAMILIES` maps each op family (matmul, convolution, reduction, division,
transcendental, fused expression) to the hypotheses that apply to it, and `HYPOTHESES`
maps each hypothesis name to its description and the function that yields its candidate
results (one per variant: summation order, where the bias is added, rounding mode); the
best variant of each hypothesis is reported. Adding a hypothesis is one function and
one row in each table. docs/root-cause.md describes each one.

Honest by construction: a hypothesis is reported as `bitwise` only when its candidate
equals the recorded output bit for bit on every compared element (all of them, or an
evenly spaced sample of `MAX_ELEMENTS` for large outputs: the note says so); otherwise
`max_ulp` says how close it came, and "no hypothesis reproduces it" is a valid answer.
Exact arithmetic where it matters: a float32 fused multiply-add is computed in float64
rounded to odd (correct for every input), a float64 one by the Boldo-Melquiond
emulation; products of TF32/bfloat16/float16-rounded float32 operands are exact in
float32, as on the hardware.

`expression` finds the fused expression a compiled-probe op ends (`t * rate + offset`
for the probed `add`): the XLA program may have computed it as one fused operation, so
its exact reference is the expression evaluated from its original operands
(`Expr.exact`), not the last op applied to the already rounded product.
"""

import dataclasses

import numpy as np

from ...trace import schema
from ..compare import values as compare
from . import convolution as _conv
from .replay.calls import JaxCall
from .replay.oracle import numpy_oracle
from .replay.params import Named
from ..result import Mechanism

MAX_ELEMENTS = 512         # output elements compared per hypothesis (evenly spaced sample)
MAX_LOOP_WORK = 1 << 21    # elements x steps of the Python-loop variants (FMA, lanes)
MAX_EXPR_NODES = 8         # ops of a fused expression followed back from the origin

# -- the tables -----------------------------------------------------------------------------

# name -> (what it is, where it happens): the terminal line is "reproduced bitwise by <what>"
DESCRIPTIONS = {
    "tf32_inputs": "TF32-rounded inputs (an Ampere or newer NVIDIA GPU with allow_tf32, or "
                   "matmul precision 'high')",
    "bf16_inputs": "a bf16 pass: inputs rounded to bfloat16, products accumulated in float32 "
                   "(a TPU's float32 matmul or convolution at default precision, matmul precision "
                   "'medium', autocast)",
    "fp16_inputs": "float16-rounded inputs (a half-precision matmul, autocast)",
    "reciprocal_multiply": "division as multiplication by the reciprocal, x * (1/y) (a compiler "
                           "rewrite of division by a constant, fast math)",
    "fma": "fused multiply-add, rounded once (an FMA instruction: AVX2/AVX-512/NEON kernels, "
           "or a compiler contracting a*b+c)",
    "separate_multiply_add": "separate multiply and add, each product rounded (no FMA: an "
                             "SSE-only code path, XLA_FLAGS=--xla_cpu_max_isa=SSE4_2, "
                             "MKL_CBWR=COMPATIBLE, an older CPU)",
    "summation_order": "another summation order (SIMD lanes, blocking by k, pairwise)",
    "float64_accumulation": "accumulation in higher precision, rounded once",
    "correctly_rounded": "the correctly rounded result (IEEE division and square root, a "
                         "correctly rounded math library)",
    "flush_denormals": "denormals flushed to zero (FTZ/DAZ: fast-math flags, some BLAS and "
                       "GPU defaults)",
}

# family -> hypotheses tried, most specific first (ties in ULP keep this order)
FAMILIES = {
    "matmul": ("tf32_inputs", "bf16_inputs", "fp16_inputs", "fma", "separate_multiply_add",
               "summation_order", "float64_accumulation", "flush_denormals"),
    # a convolution as dot products at sampled output positions (explain/convolution.py)
    "convolution": ("tf32_inputs", "bf16_inputs", "fp16_inputs", "float64_accumulation"),
    "reduction": ("summation_order", "float64_accumulation", "flush_denormals"),
    "division": ("reciprocal_multiply", "correctly_rounded", "flush_denormals"),
    "expression": ("fma", "separate_multiply_add", "flush_denormals"),
    "transcendental": ("correctly_rounded", "flush_denormals"),
}

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
ARITH_OPS = {"add", "sub", "mul", "neg"}   # ops a fused expression is followed through


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


# -- exact arithmetic -----------------------------------------------------------------------

def _two_sum(a, b):
    s = a + b
    z = s - a
    return s, (a - (s - z)) + (b - z)


def _round_to_odd(s, e):
    """s + e (s = RN(s + e), e its exact error) rounded to odd in s's format: the
    intermediate that makes a second rounding to a narrower format correct."""
    inexact = (e != 0) & np.isfinite(s)
    t = np.where(inexact & ((e > 0) != (s > 0)), np.nextafter(s, np.zeros_like(s)), s)
    bits = t.view(np.uint64) | np.where(inexact, np.uint64(1), np.uint64(0))
    return bits.view(np.float64)


def fma32(a, b, c):
    """float32 fused multiply-add a*b + c rounded once, for arrays: the float32 product is
    exact in float64, the sum is rounded to odd there, then to nearest float32."""
    a, b, c = (np.asarray(v, np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        p = a * b
        s, e = _two_sum(p, c)
        return _round_to_odd(s, e).astype(np.float32)


def _split(x):
    c = 134217729.0 * x
    hi = c - (c - x)
    return hi, x - hi


def fma64(a, b, c):
    """float64 fused multiply-add rounded once (Boldo & Melquiond's emulation with
    rounding to odd: uh + ul = a*b and th + tl = c + uh exactly, RN(th + RO(tl + ul)))."""
    a, b, c = (np.asarray(v, np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        uh = a * b
        ah, al = _split(a)
        bh, bl = _split(b)
        ul = ((ah * bh - uh) + ah * bl + al * bh) + al * bl
        th, tl = _two_sum(c, uh)
        v = _round_to_odd(*_two_sum(tl, ul))
        out = th + v
        return np.where(np.isfinite(uh) & np.isfinite(out), out, a * b + c)


def _fma(acc):
    return fma32 if acc == np.float32 else fma64


# -- rounding and comparing -----------------------------------------------------------------

def _dtype_name(x):
    return np.asarray(x).dtype.name


def _wide_dtype(name):
    return np.longdouble if name == "float64" else np.float64


def _cast(x, name):
    """x in dtype `name` (bfloat16 through ml_dtypes), rounded to nearest."""
    x = np.asarray(x)
    if name == "bfloat16":
        import ml_dtypes

        return x.astype(np.float64).astype(ml_dtypes.bfloat16) if x.dtype.name != "bfloat16" \
            else x
    if x.dtype == np.longdouble and name != "float64":
        x = x.astype(np.float64)   # long double -> float64 -> float32 would round twice
    return x.astype(name)


def _round_mantissa(x, bits, truncate):
    """float32 values kept to `bits` explicit mantissa bits (TF32: 10, bfloat16: 7),
    rounded to nearest even or truncated; NaN and infinities unchanged."""
    x = np.ascontiguousarray(x, np.float32)
    drop = 23 - bits
    u = x.view(np.uint32)
    if not truncate:
        u = u + np.uint32((1 << (drop - 1)) - 1) + ((u >> np.uint32(drop)) & np.uint32(1))
    out = (u & np.uint32((0xFFFFFFFF << drop) & 0xFFFFFFFF)).view(np.float32)
    return np.where(np.isfinite(x), out, x)


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


def _positions(n):
    """Flat output indices compared: all of them, or MAX_ELEMENTS evenly spaced."""
    if n <= MAX_ELEMENTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, MAX_ELEMENTS).round().astype(np.int64))


def distance(candidate, target):
    """(bitwise, max ULP, elements that differ) of a candidate against the recorded
    values (same dtype)."""
    c, t = np.asarray(candidate).reshape(-1), np.asarray(target).reshape(-1)
    name = t.dtype.name
    if c.dtype != t.dtype:
        c = _cast(c, name)
    if c.shape != t.shape:
        return False, float("inf"), t.size
    bitwise = c.tobytes() == t.tobytes()
    u = compare.ulp_distance(c, t, name)
    if u is None:
        return bitwise, 0.0 if bitwise else float("inf"), 0 if bitwise else t.size
    with np.errstate(all="ignore"):
        nan_c, nan_t = np.isnan(c.astype(np.float64)), np.isnan(t.astype(np.float64))
    u = np.where(nan_c & nan_t, 0.0, np.where(nan_c ^ nan_t, np.inf, u))
    return bitwise, float(u.max()) if u.size else 0.0, int(np.count_nonzero(u))


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


# -- hypotheses: name -> candidates ---------------------------------------------------------

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


def _rounded_inputs(prob, rounders):
    """Both matrix operands rounded; products are then exact in float32 (at most 11 + 11
    significant bits), so only the summation order matters: in order, pairwise, SIMD
    lanes, k-blocks, or this machine's own kernel run on the rounded inputs."""
    if not isinstance(prob, Dot) or prob.out != "float32" or \
            _dtype_name(prob.a) != "float32" or _dtype_name(prob.b) != "float32":
        return
    for mode, fn in rounders:
        a, b = fn(prob.a), fn(prob.b)
        words = f"inputs {mode}"
        yield f"{words}, summed in float64", _cast(_wide_dot(prob, a, b), prob.out)
        for note, cand in _order_variants(prob, a, b, (False,),
                                          ("sequential", "pairwise", "lanes", "blocked")):
            yield f"{words}, {note}", cand
        kernel = prob.case.kernel
        if kernel is not None:
            ins = list(prob.case.inputs)
            for s in prob.slots:
                ins[s] = fn(np.asarray(ins[s])).reshape(np.shape(ins[s]))
            try:
                out = np.asarray(kernel(ins)[0]).reshape(-1)[prob.positions]
            except Exception:   # the kernel refuses the input: that variant is skipped
                continue
            yield f"{words}, this machine's {prob.case.op} kernel", _cast(out, prob.out)
            if mode == "rounded to bfloat16" and prob.case.framework == "jax":
                # the op itself on bfloat16 operands, accumulating in float32 (its
                # preferred_element_type): XLA's own bf16 pass, as a TPU runs it
                import ml_dtypes

                for s in prob.slots:
                    ins[s] = np.asarray(ins[s]).astype(ml_dtypes.bfloat16)
                try:
                    params = dict(prob.case.params or {})
                    params["preferred_element_type"] = Named("np_dtype", "float32")
                    call = JaxCall(prob.case.op, params, len(ins))
                    out = np.asarray(call.run(ins)[0]).reshape(-1)[prob.positions]
                except Exception:   # the op refuses bfloat16 operands: skipped
                    continue
                yield (f"{words}, this machine's {prob.case.op} on bfloat16 operands (float32 "
                       f"accumulation)"), _cast(out, prob.out)


def _h_tf32(prob):
    yield from _rounded_inputs(prob, (
        ("rounded to TF32 (10-bit mantissa, to nearest)", lambda x: _round_mantissa(x, 10, False)),
        ("truncated to TF32 (10-bit mantissa)", lambda x: _round_mantissa(x, 10, True))))


def _h_bf16(prob):
    yield from _rounded_inputs(prob, (
        ("rounded to bfloat16", lambda x: _round_mantissa(x, 7, False)),))


def _h_fp16(prob):
    yield from _rounded_inputs(prob, (
        ("rounded to float16", lambda x: np.asarray(x, np.float32).astype(np.float16)
         .astype(np.float32)),))


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


HYPOTHESES = {
    "tf32_inputs": _h_tf32,
    "bf16_inputs": _h_bf16,
    "fp16_inputs": _h_fp16,
    "reciprocal_multiply": _h_reciprocal,
    "fma": _h_fma,
    "separate_multiply_add": _h_separate,
    "summation_order": _h_order,
    "float64_accumulation": _h_wide,
    "correctly_rounded": _h_correct,
    "flush_denormals": _h_flush,
}


# -- fused expressions (compiled probes) ----------------------------------------------------

class Expr:
    """An elementwise expression (add/sub/mul/neg) over recorded arrays: the fused
    computation a compiled-probe op ends. `args` are Expr nodes or leaves
    (array, producer event)."""

    def __init__(self, op, args, event):
        self.op, self.args, self.event = op, args, event
        self.out = ""
        self.target = None

    def nodes(self):
        return 1 + sum(a.nodes() for a in self.args if isinstance(a, Expr))

    def leaves(self):
        out = []
        for a in self.args:
            out += a.leaves() if isinstance(a, Expr) else [a[0]]
        return out

    def with_leaves(self, values):
        it = iter(values)

        def rebuild(node):
            args = [rebuild(a) if isinstance(a, Expr) else (next(it), a[1]) for a in node.args]
            e = Expr(node.op, args, node.event)
            e.out, e.target = node.out, node.target
            return e

        return rebuild(self)

    def text(self):
        def arg(a):
            return a.text() if isinstance(a, Expr) else (f"#{a[1]}" if a[1] >= 0 else "literal")
        return f"{self.op}({', '.join(arg(a) for a in self.args)})"

    def has_contraction(self):
        return any(node.op in ("add", "sub") and any(isinstance(a, Expr) and a.op == "mul"
                                                      for a in node.args)
                   for node in self._all())

    def _all(self):
        yield self
        for a in self.args:
            if isinstance(a, Expr):
                yield from a._all()

    def evaluate(self, mode, dtype=None, contract_right=False):
        """mode "separate": every op rounded to its dtype; "fma": each add/sub of a mul
        rounded once (fused); "exact": in float64 (long double for float64) throughout."""
        dtype = dtype or self.out or "float32"
        wide = _wide_dtype(dtype)
        with np.errstate(all="ignore"):
            if mode == "fma" and self.op in ("add", "sub") and len(self.args) == 2:
                order = (1, 0) if contract_right else (0, 1)
                for i in order:
                    m, other = self.args[i], self.args[1 - i]
                    if isinstance(m, Expr) and m.op == "mul" and len(m.args) == 2:
                        x, y = (self._val(v, mode, dtype, contract_right) for v in m.args)
                        c = self._val(other, mode, dtype, contract_right)
                        if self.op == "sub":
                            if i == 0:
                                c = -c
                            else:
                                x = -x
                        f = fma32 if dtype == "float32" else fma64 if dtype == "float64" else None
                        if f is None:
                            break
                        return f(*np.broadcast_arrays(x, y, c))
            vals = [self._val(a, mode, dtype, contract_right) for a in self.args]
            if mode == "exact":
                vals = [np.asarray(v).astype(wide) for v in vals]
            else:
                vals = [_cast(v, dtype) for v in vals]
            fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply}.get(self.op)
            r = np.negative(vals[0]) if self.op == "neg" else fn(*vals)
            return r if mode == "exact" else _cast(r, dtype)

    def _val(self, a, mode, dtype, contract_right):
        if isinstance(a, Expr):
            return a.evaluate(mode, dtype, contract_right)
        x = np.asarray(a[0])
        return x.astype(_wide_dtype(dtype)) if mode == "exact" else _cast(x, dtype)

    def exact(self):
        """The expression's exact value (float64; long double for float64 operands): the
        reference for a fused op, from its original operands."""
        return self.evaluate("exact")

    def contracted(self):
        if not self.has_contraction() or self.out not in ("float32", "float64"):
            return
        left = self.evaluate("fma")
        yield "a*b + c rounded once", _cast(left, self.out)
        right = self.evaluate("fma", contract_right=True)
        if not np.array_equal(left, right, equal_nan=True):
            yield "a*b + c rounded once (the other product contracted)", _cast(right, self.out)


def expression(trace, ev, inputs_of):
    """The fused expression that compiled-probe event `ev` ends, followed back through
    add/sub/mul/neg equations of the same probe (at most MAX_EXPR_NODES ops); None when
    the event is not a probe value or reads no such equation. `inputs_of(event)` gives an
    event's recorded input arrays."""
    e = trace.event(ev)
    if e["origin"] != "probe" or e["op"] not in ARITH_OPS:
        return None
    count = [1]

    def build(i, info):
        arrays = inputs_of(i)
        producers = {int(r["slot"]): int(r["producer"]) for r in trace.input_rows(i)}
        args = []
        for slot, x in enumerate(arrays):
            p = producers.get(slot, schema.PRODUCER_UNKNOWN)
            if p >= 0 and count[0] < MAX_EXPR_NODES:
                pe = trace.event(p)
                if pe["origin"] == "probe" and pe["kind"] == "eqn" and \
                        pe["parent"] == info["parent"] and pe["op"] in ARITH_OPS:
                    count[0] += 1
                    args.append(build(p, pe))
                    continue
            args.append((np.asarray(x), p))
        return Expr(info["op"], args, i)

    root = build(ev, e)
    if root.nodes() < 2:
        return None
    return root


# -- the analysis ---------------------------------------------------------------------------

def family(case):
    """(family name, problem) of a case, or (None, None) when no table applies."""
    if not case.outputs or case.outputs[0] is None or not _is_float(case.outputs[0]):
        return None, None
    out = np.asarray(case.outputs[0])
    if len([o for o in case.outputs if o is not None]) != 1:
        return None, None
    if case.expr is not None and case.expr.has_contraction():
        case.expr.out, case.expr.target = out.dtype.name, out
        return "expression", case.expr
    name = base_name(case.op)
    if name in MATMUL_OPS:
        return "matmul", matmul_problem(case)
    if name in CONV_OPS:
        return "convolution", conv_problem(case)
    if name in REDUCTION_OPS:
        return "reduction", reduction_problem(case)
    if name in DIVISION_OPS:
        return "division", elementwise_problem(case, "division")
    if name in TRANSCENDENTAL_OPS:
        return "transcendental", elementwise_problem(case, "transcendental")
    return None, None


# family -> the hypothesis that is the exact result rounded once: another hypothesis that
# reproduces a side only where it agrees with this one is no evidence for itself
GENERIC = {"matmul": "float64_accumulation", "convolution": "float64_accumulation",
           "reduction": "float64_accumulation",
           "division": "correctly_rounded", "transcendental": "correctly_rounded"}


def side_mechanisms(case):
    """[Mechanism] for one side, best first: one entry per hypothesis (its best variant).
    Order: bitwise and distinct from the exact result (evidence for that mechanism), then
    the exact result itself, then bitwise only where every hypothesis agrees, then the
    others by fewest ULP (the exact result first among equals)."""
    fam, prob = family(case)
    if prob is None:
        return []
    target = np.asarray(prob.target)
    sample = getattr(prob, "sample", "")
    found = {}
    for name in FAMILIES[fam]:
        best = None
        try:
            for note, cand in HYPOTHESES[name](prob):
                bitwise, ulp, ndiff = distance(cand, target)
                if best is None or (not bitwise, ulp, ndiff) < (not best[0], best[1], best[4]):
                    best = (bitwise, ulp, note, cand, ndiff)
                if bitwise:
                    break
        except Exception:   # one hypothesis failing never hides the others
            pass
        if best is not None:   # None: not applicable to this op (or not computable)
            found[name] = best
    generic = found.get(GENERIC.get(fam))
    ranked = []
    for rank, (name, (bitwise, ulp, note, cand, ndiff)) in enumerate(found.items()):
        is_generic = name == GENERIC.get(fam)
        if not bitwise:   # the side's error profile against this hypothesis
            note += f"; differs on {ndiff} of {target.size} elements"
        same = (bitwise and not is_generic and generic is not None and
                np.array_equal(np.asarray(cand).reshape(-1), np.asarray(generic[3]).reshape(-1)))
        if same:
            note += "; identical to the exact result on these inputs (no evidence either way)"
        tier = (0 if not same and not is_generic else 1 if is_generic else 2) if bitwise else 3
        ranked.append(((tier, ulp, 0 if is_generic else 1, rank),
                       Mechanism(side=case.side, name=name, bitwise=bool(bitwise),
                                 max_ulp=float(ulp), note=note + (f"; {sample}" if sample else ""))))
    ranked.sort(key=lambda t: t[0])
    return [m for _, m in ranked]


def hypotheses(cases):
    """[Mechanism] for the sides in `cases` ({"a": Case, "b": Case}), a's first, each
    side best first."""
    out = []
    for side in ("a", "b"):
        case = cases.get(side)
        if case is None:
            continue
        try:
            out += side_mechanisms(case)
        except Exception:   # never fail an analysis over a hypothesis
            continue
    return out


def _fmt_ulp(x):
    if not np.isfinite(x):
        return "inf"
    return str(int(x)) if float(x).is_integer() and x < 1e6 else f"{x:.3g}"


FAR_ULP = 1e6


# a reduced-precision hypothesis this close, where none is bitwise, is what the side ran
# with an accumulation order of its own (a TPU's, a GPU's tensor cores): "consistent with"
CONSISTENT_ULP = 64
REDUCED_PRECISION = ("tf32_inputs", "bf16_inputs", "fp16_inputs")
# the settings that make a float32 matmul a bf16 pass on a TPU (jax_default_matmul_precision)
_BF16_DEFAULTS = (None, "default", "fastest", "bfloat16", "BF16_BF16_F32")


def tpu_default_precision(case):
    """True when a side's matmul or convolution ran on a TPU at default precision: one
    bf16 pass."""
    if case is None:
        return False
    return ran_as_bf16_pass(case.backend, case.op, case.params, case.matmul_precision)


def _default_precision(p):
    """An op's `precision` parameter (parsed, or its text) that leaves the default: None,
    DEFAULT, or a pair of those (lhs, rhs). A pair holding HIGH or HIGHEST is not."""
    if p is None:
        return True
    if isinstance(p, Named):
        return p[0] == "precision" and p[1] == "DEFAULT"
    if isinstance(p, (tuple, list)):
        return all(_default_precision(x) for x in p)
    text = str(p).upper()
    return "DEFAULT" in text and "HIGH" not in text


def _float32_result(p):
    """`preferred_element_type` None or float32: the op's float32 result (a bfloat16 or
    float64 one is not a float32 matmul run as a bf16 pass)."""
    if p is None:
        return True
    name = p[1] if isinstance(p, Named) else str(p)
    return name == "float32" or name in ("dtype('float32')", "float32")


def is_conv(op):
    return base_name(op) in CONV_OPS


def ran_as_bf16_pass(backend, op, params, matmul_precision):
    """A float32 matmul or convolution on a TPU with neither the op's precision nor the
    process's jax_default_matmul_precision raised (and no other result type asked for):
    the chip ran it as one bf16 pass."""
    if backend != "tpu" or base_name(op) not in MATMUL_OPS | CONV_OPS:
        return False
    params = params or {}
    return _default_precision(params.get("precision")) and \
        _float32_result(params.get("preferred_element_type")) and \
        matmul_precision in _BF16_DEFAULTS


def fix_for(name, fw):
    """The setting that removes a reduced-precision mechanism, for a side's framework
    (a matmul's and a convolution's alike: JAX's matmul precision covers both)."""
    if name == "bf16_inputs" and fw == "jax":
        return ('jax.default_matmul_precision("highest") around the computation, or '
                'jax_default_matmul_precision="highest" (or precision=lax.Precision.HIGHEST '
                'on the op)')
    if name in ("tf32_inputs", "bf16_inputs") and fw == "torch":
        return ('torch.set_float32_matmul_precision("highest") and '
                'torch.backends.cuda.matmul.allow_tf32 = False (no autocast region)')
    if name == "tf32_inputs" and fw == "jax":
        return 'jax.default_matmul_precision("highest")'
    return None


def _consistent(mine, case):
    """The reduced-precision mechanism a side is consistent with (not bitwise: within
    CONSISTENT_ULP, and the closest hypothesis or, on a TPU at default precision, the bf16
    pass), else None."""
    for m in mine:
        if m.name in REDUCED_PRECISION and not m.bitwise and m.max_ulp <= CONSISTENT_ULP and \
                (m is mine[0] or (m.name == "bf16_inputs" and tpu_default_precision(case))):
            return m
    return None


def summary(mechs, ops, cases=None):
    """One line: which hypothesis reproduces each side bitwise, the reduced-precision one
    it is consistent with, or the closest one; with the fix of a reduced-precision one."""
    parts = []
    for side in ("a", "b"):
        mine = [m for m in mechs if m.side == side]
        if not mine:
            continue
        op = ops.get(side) or "op"
        case = (cases or {}).get(side)
        best = mine[0]
        tpu = (f"; {side} ran it on a TPU at default matmul precision" if
               tpu_default_precision(case) else "")
        close = None if best.bitwise else _consistent(mine, case)
        if best.bitwise:
            fix = fix_for(best.name, getattr(case, "framework", None))
            parts.append(f"{side}'s {op} is reproduced bitwise by "
                         f"{DESCRIPTIONS.get(best.name, best.name)} [{best.name}: {best.note}]"
                         + (tpu if best.name == "bf16_inputs" else "")
                         + (f"; fix: {fix}" if fix else ""))
        elif close is not None:
            fix = fix_for(close.name, getattr(case, "framework", None))
            parts.append(f"{side}'s {op} is consistent with {DESCRIPTIONS.get(close.name)}, "
                         f"{_fmt_ulp(close.max_ulp)} ULP from its closest variant (the order in "
                         f"which the kernel that ran it accumulates is not reproduced here) "
                         f"[{close.name}: {close.note}]" + (tpu if close.name == "bf16_inputs"
                                                             else "")
                         + (f"; fix: {fix}" if fix else ""))
        else:
            # a count of a million ULP and more is a different value, not a rounding
            far = not best.max_ulp < FAR_ULP
            parts.append(f"no hypothesis reproduces {side}'s {op} bitwise (closest: "
                         f"{best.name}, "
                         f"{'far off: a different value, not a rounding difference' if far else _fmt_ulp(best.max_ulp) + ' ULP'}"
                         f": {best.note})")
    return "; ".join(parts)


def cases(d, events, sides, inputs_of):
    """{side: Case} for a replayed origin pair: `events` {side: event index}, `sides` the
    replay's per-side info (op, framework, call, inputs, recorded), `inputs_of(d, side,
    event)` the recorded inputs of any event (verdict.event_inputs)."""
    out = {}
    for side in ("a", "b"):
        try:
            case = _case(d, side, events[side], sides.get(side) or {}, inputs_of)
        except Exception:   # an odd trace: no mechanisms for this side, never a failure
            case = None
        if case is not None:
            out[side] = case
    return out


def _case(d, side, event, info, inputs_of):
    call = info.get("call")
    if call is None or "inputs" not in info or not info.get("recorded"):
        return None
    trace = d.ta if side == "a" else d.tb
    try:
        expr = expression(trace, event, lambda ev: inputs_of(d, side, ev))
    except Exception:   # an odd trace: no expression, the op alone
        expr = None
    rec = info["recorded"][0]
    if rec is not None and np.asarray(rec).dtype.name == "float64":
        def wide(xs):
            return numpy_oracle(info["framework"], info["op"], call.params, xs)
    else:
        def wide(xs):
            return call.run(xs, upcast=True)
    jax_manifest = ((trace.manifest or {}).get("frameworks") or {}).get("jax") or {}
    return Case(side=side, framework=info["framework"], op=info["op"], params=call.params,
                inputs=info["inputs"], outputs=info["recorded"], kernel=call.run, wide=wide,
                expr=expr, backend=str(jax_manifest.get("backend") or "")
                if info["framework"] == "jax" else "",
                matmul_precision=jax_manifest.get("jax_default_matmul_precision"))
