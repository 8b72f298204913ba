"""Test perturbation: make JAX's `tanh` one ULP larger than correct, everywhere it is compiled.

Put this folder on PYTHONPATH of a subprocess. The lowering rule of `tanh` is wrapped
so that its result goes through `nextafter(y, +inf)`: a real one-ULP change in the
compiled code of every program (fused jit calls and single-primitive dispatch alike),
like a different libm or vector math library would make.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax._src.interpreters import mlir

_entry = mlir._platform_specific_lowerings["cpu"].get(lax.tanh_p) or mlir._lowerings[lax.tanh_p]
_original = getattr(_entry, "rule", _entry)


def _one_ulp_up(ctx, x, **params):
    (y,) = _original(ctx, x, **params)
    sub = ctx.replace(primitive=None, avals_in=ctx.avals_out)
    up = mlir.lower_fun(lambda t: lax.nextafter(t, jnp.full_like(t, jnp.inf)), multiple_results=False)
    return up(sub, y)


mlir.register_lowering(lax.tanh_p, _one_ulp_up, platform="cpu")
jax.clear_caches()
