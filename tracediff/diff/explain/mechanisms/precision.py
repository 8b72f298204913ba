"""Reduced-precision inputs: TF32, bfloat16 and float16 passes, and when a TPU runs one.

`tf32_inputs`, `bf16_inputs` and `fp16_inputs` round both matrix operands and re-sum them
(products of rounded float32 operands are exact in float32, as on the hardware), or run
this machine's own kernel on the rounded inputs. `ran_as_bf16_pass` says when a float32
matmul or convolution ran as one bf16 pass on a TPU (default precision), `fix_for` the
setting that removes a reduced-precision mechanism.
"""

import numpy as np

from ..replay.calls import JaxCall
from ..replay.params import Named
from .numerics import _cast, _dtype_name, _round_mantissa
from .problems import CONV_OPS, MATMUL_OPS, Dot, base_name
from .summation import _order_variants, _wide_dot

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
