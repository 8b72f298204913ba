"""Value statistics inside the compiled program (`record --jax-values compiled --level stats`).

The values program (capture/jax/probe.py, values mode) returns, next to every equation's
outputs, one small vector per output with its statistics (`trace.values.STAT_FIELDS`:
min and max over the non-NaN elements, mean and L2 over the finite ones, NaN and Inf
counts), computed by XLA on the device that holds the value: the host then reads ten
words per value instead of making four passes over its bytes (it still hashes them).

Numerics: the device digest's (digest_programs.stat_parts, digest_stats.py): float32 sums
in XLA's reduction order, scaled so that no square or sum underflows or overflows (issue
66), and the host puts mean and L2 together in float64 (`finish`); min and max as the
device compares the numbers (a subnormal flushed to 0 reads 0).
Values of 64-bit or ml_dtypes numbers, and integers wider than float32 holds exactly,
keep the host's statistics (numpy, float64 sums). locate bounds mean and L2 differences
with an allowance for float32 accumulation (diff/compare/levels.py).
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
    """Can this value's statistics be computed in the program (a non-empty real array of
    numbers that float32 holds exactly: floats of at most 4 bytes, integers and bools of
    at most 2)? Others, PRNG keys and empty arrays stay on the host path."""
    dt = getattr(x, "dtype", None)
    if dt is None or not getattr(x, "shape", None) and getattr(x, "size", 0) == 0:
        return False
    try:
        nd = np.dtype(dt)
    except TypeError:   # PRNG key dtypes
        return False
    fits = nd.itemsize <= 4 if nd.kind == "f" else nd.kind in _KINDS and nd.itemsize <= 2
    return fits and int(np.prod(x.shape, dtype=np.int64)) > 0


def stats_vector(x):
    """Traced inside jit: x's statistics as digest_programs.stat_words' uint32 words."""
    from . import digest_programs

    return digest_programs.stat_words_of(x)


def finish(words):
    """A `stats_vector` on the host as `values.STAT_FIELDS` (float64[6])."""
    from .digest_results import stat_rows

    st, counts = stat_rows(words)
    return np.concatenate([st[0], counts[0]]).astype(np.float64)
