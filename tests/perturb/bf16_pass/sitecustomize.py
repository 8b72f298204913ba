"""Test perturbation: make XLA:CPU run float32 matmuls and convolutions as a TPU does at
default precision.

A TPU's float32 `dot_general` and `conv_general_dilated` at default precision are one
bfloat16 pass: both operands rounded to bfloat16, the products (exact in float32)
accumulated in float32. Put this folder on PYTHONPATH of a subprocess: the CPU lowering
rules of `dot_general` and `conv_general_dilated` are wrapped so that float32 operands at
default precision (`precision=None` or DEFAULT) are rounded to bfloat16 first and the op
accumulates in float32; an explicit precision (HIGHEST) keeps float32, as on the chip.
With TRACEDIFF_BF16_ORDER=reverse the contracting dimensions of a dot are also reversed:
the same bf16 pass summed in another order (the chip's accumulation order is its own),
which no hypothesis reproduces bitwise.
"""

import os

import jax
import jax.numpy as jnp
from jax import lax
from jax._src.interpreters import mlir

_entry = mlir._platform_specific_lowerings["cpu"].get(lax.dot_general_p) or \
    mlir._lowerings[lax.dot_general_p]
_original = getattr(_entry, "rule", _entry)
_REVERSE = os.environ.get("TRACEDIFF_BF16_ORDER") == "reverse"


def _default_precision(precision):
    if precision is None:
        return True
    parts = precision if isinstance(precision, tuple) else (precision,)
    return all(p is None or p == lax.Precision.DEFAULT for p in parts)


def _bf16_pass(ctx, lhs, rhs, *, dimension_numbers, precision=None, preferred_element_type=None,
               **params):
    a, b = ctx.avals_in
    if not (a.dtype == jnp.float32 and b.dtype == jnp.float32 and _default_precision(precision)
            and jax.config.jax_default_matmul_precision in (None, "default", "bfloat16")):
        return _original(ctx, lhs, rhs, dimension_numbers=dimension_numbers, precision=precision,
                         preferred_element_type=preferred_element_type, **params)
    (lc, rc), _ = dimension_numbers

    def one_pass(x, y):
        if _REVERSE:
            x, y = lax.rev(x, tuple(lc)), lax.rev(y, tuple(rc))
        return lax.dot_general(x.astype(jnp.bfloat16), y.astype(jnp.bfloat16), dimension_numbers,
                               preferred_element_type=jnp.float32)

    return mlir.lower_fun(one_pass, multiple_results=False)(ctx, lhs, rhs)


_conv_entry = mlir._platform_specific_lowerings["cpu"].get(lax.conv_general_dilated_p) or \
    mlir._lowerings[lax.conv_general_dilated_p]
_conv_original = getattr(_conv_entry, "rule", _conv_entry)


def _conv_bf16_pass(ctx, lhs, rhs, *, precision=None, preferred_element_type=None, **params):
    """The same for a float32 convolution: a TPU runs it as one bf16 pass too."""
    a, b = ctx.avals_in
    if not (a.dtype == jnp.float32 and b.dtype == jnp.float32 and _default_precision(precision)
            and jax.config.jax_default_matmul_precision in (None, "default", "bfloat16")):
        return _conv_original(ctx, lhs, rhs, precision=precision,
                              preferred_element_type=preferred_element_type, **params)

    def one_pass(x, y):
        return lax.conv_general_dilated_p.bind(
            x.astype(jnp.bfloat16), y.astype(jnp.bfloat16), precision=None,
            preferred_element_type=jnp.dtype(jnp.float32), **params)

    return mlir.lower_fun(one_pass, multiple_results=False)(ctx, lhs, rhs)


mlir.register_lowering(lax.dot_general_p, _bf16_pass, platform="cpu")
mlir.register_lowering(lax.conv_general_dilated_p, _conv_bf16_pass, platform="cpu")
jax.clear_caches()
