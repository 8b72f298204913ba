"""The dispatcher: which hypotheses apply to an op (`FAMILIES`), what each is
(`DESCRIPTIONS`) and where its candidates come from (`HYPOTHESES`); `side_mechanisms` tries
them on one side and ranks them, `cases` builds each side's `Case` from a replay.

Adding a hypothesis is one function (in the module of its family) and one row in each
table. Honest by construction: a hypothesis is reported as `bitwise` only when its
candidate equals the recorded output bit for bit on every compared element; otherwise
`max_ulp` says how close it came, and "no hypothesis reproduces it" is a valid answer.
"""

import numpy as np

from ...result import Mechanism
from ..replay.oracle import numpy_oracle
from .denormals import _h_flush
from .elementwise import _h_correct, _h_reciprocal
from .expression import expression
from .numerics import distance
from .precision import _h_bf16, _h_fp16, _h_tf32
from .problems import (CONV_OPS, DIVISION_OPS, MATMUL_OPS, REDUCTION_OPS, TRANSCENDENTAL_OPS,
                       Case, _is_float, base_name, conv_problem, elementwise_problem,
                       matmul_problem, reduction_problem)
from .summation import _h_fma, _h_order, _h_separate, _h_wide

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
