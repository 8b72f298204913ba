"""Which recorded ops are collectives: they hand values between ranks or devices, so what
one delivers was made elsewhere (per-rank ordering in `locate DIR DIR`, a non-finite value
received rather than made)."""

COLLECTIVE_PREFIX = "c10d::"
# torch's functional collectives (DTensor's redistributions, `full_tensor()`): issued by
# one op, their result defined at `wait_tensor` (capture/torch/collectives.py)
FUNCOL_PREFIX = "_c10d_functional::"
FUNCOL_WAIT = "_c10d_functional::wait_tensor"
# JAX collectives (a shard_map body replayed per device on each process, jax.distributed)
JAX_COLLECTIVES = frozenset({"psum", "psum_invariant", "psum2", "pmax", "pmin", "all_gather",
                             "all_gather_invariant", "ppermute", "all_to_all",
                             "reduce_scatter", "psum_scatter", "pbroadcast"})


def is_collective(op: str) -> bool:
    """A torch `c10d::*` collective, a functional collective's `wait_tensor` (where what
    it received appears) or a JAX collective equation."""
    return op.startswith(COLLECTIVE_PREFIX) or op == FUNCOL_WAIT or op in JAX_COLLECTIVES
