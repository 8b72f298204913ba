"""Name every optax step's grads, params, updates and state, inside jit or not.

The outermost `GradientTransformation.update` of each step tags its leaves with
`jax.ad_checkpoint.checkpoint_name` (an identity `name` equation that XLA drops: the
compiled program is unchanged). The JAX recorder collects the tagged values during
replay (or eagerly) and writes them as one optimizer-step event named by pytree path,
e.g. `grads/GRUCell_0/ir/kernel`, `state/mu/Dense_0/bias`, `state/count`.
"""

import jax
from jax.ad_checkpoint import checkpoint_name

OPTAX_TAG = "tracediff:optax/"   # checkpoint_name prefix of tagged values


def key_path(path, drop_indices=False):
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                val = getattr(k, attr)
                if not (drop_indices and attr == "idx"):
                    parts.append(str(val))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def tag(tree, prefix, drop_indices=False):
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    names = [key_path(p, drop_indices) for p, _ in leaves]
    if drop_indices and len(set(names)) != len(names):  # indices needed to keep names unique
        names = [key_path(p) for p, _ in leaves]
    it = iter(names)

    def _tag(x):
        name = next(it)
        if isinstance(x, (jax.Array, jax.core.Tracer)):
            return checkpoint_name(x, f"{OPTAX_TAG}{prefix}/{name}" if name else f"{OPTAX_TAG}{prefix}")
        return x

    return jax.tree_util.tree_map(_tag, tree)


class _Patch:
    def __init__(self, cls, original):
        self.cls, self.original = cls, original

    def uninstall(self):
        self.cls.__new__ = self.original


def install(capture):
    import optax

    base = optax.GradientTransformation
    original_new = base.__new__

    def wrap_update(update):
        def update_fn(updates, state, params=None, *args, **kwargs):
            with capture.optax_update() as outer:
                if outer:
                    capture.optax_settings(update)
                    updates = tag(updates, "grads")
                    if params is not None:
                        params = tag(params, "params")
                new_updates, new_state = update(updates, state, params, *args, **kwargs)
            if outer:
                new_updates = tag(new_updates, "updates")
                new_state = tag(new_state, "state", drop_indices=True)
                leaves = jax.tree_util.tree_leaves(new_updates)
                if not any(isinstance(x, jax.core.Tracer) for x in leaves):
                    capture.flush_optim()  # eager update: the step is complete now
            return new_updates, new_state

        update_fn.__wrapped__ = update
        return update_fn

    def new(cls, init, update, *args, **kwargs):
        if not getattr(update, "__wrapped__", None):
            update = wrap_update(update)
        return original_new(cls, init, update, *args, **kwargs)

    base.__new__ = new
    return _Patch(base, original_new)
