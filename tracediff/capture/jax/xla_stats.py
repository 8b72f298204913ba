"""Value statistics inside the compiled program (`record --jax-values compiled --level stats`).

The values program (capture/jax/probe.py, values mode) returns, next to every equation's
outputs, one small vector per output with its statistics (`trace.values.STAT_FIELDS`:
min and max over the non-NaN elements, mean and L2 over the finite ones, NaN and Inf
counts), computed by XLA on the device that holds the value: the host then reads six
numbers per value instead of making four passes over its bytes (it still hashes them).

Numerics: sums accumulate in the widest float JAX has enabled (float32 unless
`jax_enable_x64`), in XLA's reduction order; the host (numpy) statistics of small values
accumulate in float64. Both are the same definitions; locate bounds mean and L2
differences with an allowance for float32 accumulation (diff/compare/levels.py).
"""

import numpy as np

_KINDS = "fiub"


def in_program():
    """Compute statistics in the values program? Off the CPU (a GPU/TPU backend) only,
    unless TRACEDIFF_JAX_STATS_IN_PROGRAM says otherwise (1 / 0: measure both)."""
    import os

    forced = os.environ.get("TRACEDIFF_JAX_STATS_IN_PROGRAM")
    if forced in ("0", "1"):
        return forced == "1"
    import jax

    return jax.default_backend() != "cpu"


def wants(x):
    """Can this value's statistics be computed in the program (a non-empty real or
    integer array)? Complex values, PRNG keys and empty arrays stay on the host path."""
    dt = getattr(x, "dtype", None)
    if dt is None or not getattr(x, "shape", None) and getattr(x, "size", 0) == 0:
        return False
    try:
        kind = np.dtype(dt).kind
    except TypeError:   # PRNG key dtypes
        return False
    return kind in _KINDS and int(np.prod(x.shape, dtype=np.int64)) > 0


def stats_vector(x):
    """Traced inside jit: a (6,) float vector of x's statistics (STAT_FIELDS order)."""
    import jax
    import jax.numpy as jnp

    acc = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    v = x.astype(acc).reshape(-1)
    nan = jnp.isnan(v)
    fin = jnp.isfinite(v)
    n_nan = nan.sum(dtype=acc)
    n_fin = fin.sum(dtype=acc)
    n = acc(v.size)
    inf = jnp.inf
    mn = jnp.min(jnp.where(nan, inf, v))
    mx = jnp.max(jnp.where(nan, -inf, v))
    all_nan = n_nan == n
    mn = jnp.where(all_nan, jnp.nan, mn)
    mx = jnp.where(all_nan, jnp.nan, mx)
    vf = jnp.where(fin, v, 0)
    tot = vf.sum()
    sq = (vf * vf).sum()
    mean = jnp.where(n_fin > 0, tot / jnp.maximum(n_fin, 1), jnp.nan)
    return jnp.stack([mn, mx, mean, jnp.sqrt(sq), n_nan, n - n_fin - n_nan])
