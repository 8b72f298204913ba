"""Every private JAX internal tracediff touches, in one place, checked at start.

JAX has no public API that intercepts calls, so capture patches three private
functions. Their names and signatures drift between releases; `check()` verifies them
and fails with one message naming the installed JAX version instead of failing later
in the middle of the user's script.

Supported and tested: jax 0.7 - 0.10 (see README). Differences handled here:
  * the jit primitive is `jit` since 0.7 (`pjit` before): normalised by `JIT_NAMES`;
  * `Primitive.get_bind_params` returns `params` (>= 0.9) or `(subfuns, params)`;
  * `_pjit_call_impl_python` returns a tuple whose first item is always the flat outputs.
"""

import jax

JIT_NAMES = ("jit", "pjit")
SUPPORTED = ((0, 7), (0, 10))  # inclusive range of minor versions tested in CI


from ...errors import UnsupportedJax  # noqa: E402  (re-exported: capture raises it)


def jax_version():
    return tuple(int(p) for p in jax.__version__.split(".")[:2] if p.isdigit())


def _load():
    from jax._src import core, pjit
    from jax._src import source_info_util

    return core, pjit, source_info_util


def check():
    """Return the internals namespace, or raise UnsupportedJax with a clear message.

    Older JAX than the supported range is refused (its internals differ in ways that
    would give wrong traces, e.g. 0.4.x's trace stack); newer JAX is tried when the
    internals are still there, with a warning in the manifest (`untested_version`).
    """
    lo, hi = SUPPORTED
    if jax_version() < lo:
        raise UnsupportedJax(f"jax {jax.__version__} is older than this tracediff supports "
                             f"(jax {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}): upgrade jax, or record "
                             f"with an older tracediff")
    try:
        core, pjit, siu = _load()
    except ImportError as exc:
        raise UnsupportedJax(f"jax {jax.__version__}: cannot import internals ({exc})") from None
    missing = [name for obj, name in (
        (pjit, "_pjit_call_impl_python"), (pjit, "_get_fastpath_data"),
        (core, "EvalTrace"), (core, "trace_state_clean"), (siu, "user_context"),
        (siu, "current"), (siu, "register_exclusion"), (siu, "current_name_stack"),
    ) if not hasattr(obj, name)]
    if not missing and not hasattr(core.EvalTrace, "process_primitive"):
        missing.append("EvalTrace.process_primitive")
    if missing:
        raise UnsupportedJax(
            f"jax {jax.__version__} is not supported by this tracediff (missing internals: "
            f"{', '.join(missing)}); supported: jax {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}")
    return core, pjit, siu


def bind_params(prim, params):
    """Parameters to pass to `prim.bind` for an equation's params, across versions."""
    got = prim.get_bind_params(params)
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], dict):
        subfuns, bparams = got
        if subfuns:
            raise NotImplementedError(f"{prim.name}: primitives with subfuns are replayed opaquely")
        return bparams
    return got


def call_outputs(result):
    """Flat outputs from `_pjit_call_impl_python`'s result tuple (2, 3 or 4 items)."""
    return result[0]


_KEY_DTYPES = {}   # dtype -> is a PRNG key dtype (asked for every value recorded)


def repeats_side_effects(closed):
    """Would running this jaxpr a second time repeat what the script sees (io_callback,
    ordered effects, state)? Debug prints aside: their equations have no outputs and the
    replay and values programs skip them (sites.py). Such a call is recorded by its inputs
    and outputs alone, never replayed nor run as a values program."""
    return any("Debug" not in type(e).__name__ for e in closed.effects)


def is_key_dtype(dtype):
    try:
        hit = _KEY_DTYPES.get(dtype)
    except TypeError:   # unhashable: not cached
        return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    if hit is None:
        hit = _KEY_DTYPES[dtype] = bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    return hit


def untested_version():
    """True when this JAX is newer than the tested range (recorded in the manifest)."""
    return jax_version() > SUPPORTED[1]


def lowering_overrides():
    """{"primitive": "platform lowering from FILE:LINE"} for the primitives whose lowering
    rule was registered from outside JAX's own packages (a sitecustomize or plugin that
    replaces how `tanh` compiles): the JAX counterpart of a torch.library kernel. Reads
    `jax._src.interpreters.mlir`'s rule tables; {} when this JAX lays them out otherwise."""
    import os

    try:
        from jax._src.interpreters import mlir
    except ImportError:
        return {}
    own = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                for m in (jax, __import__("jaxlib")) if getattr(m, "__file__", None))
    tables = [("any", getattr(mlir, "_lowerings", {}))]
    tables += sorted((getattr(mlir, "_platform_specific_lowerings", {}) or {}).items(),
                     key=lambda kv: str(kv[0]))
    out = {}
    for platform, table in tables:
        for prim, entry in list(dict(table).items()):
            fn = getattr(entry, "rule", entry)
            fn = getattr(fn, "func", fn)   # functools.partial
            code = getattr(fn, "__code__", None)
            path = getattr(code, "co_filename", "")
            if not path or os.path.abspath(path).startswith(own) or path.startswith("<"):
                continue
            out[str(getattr(prim, "name", prim))] = \
                f"{platform} lowering registered at {path}:{code.co_firstlineno}"
    return out


def sub_jaxprs(eqn):
    """The jaxprs nested in an equation's params (a pjit's, a scan's body, a cond's
    branches, a shard_map's)."""
    for val in eqn.params.values():
        for sub in (val if isinstance(val, (tuple, list)) else (val,)):
            inner = getattr(sub, "jaxpr", sub)
            if hasattr(inner, "eqns"):
                yield inner


def any_equation(jaxpr, pred, too_deep, depth=0):
    """Does `pred` hold for an equation of `jaxpr` or of a jaxpr nested in it? Past 32
    levels of nesting the answer is `too_deep` (a bound on untrusted structure)."""
    if depth > 32:
        return too_deep
    for eqn in getattr(jaxpr, "eqns", ()):
        if pred(eqn) or any(any_equation(sub, pred, too_deep, depth + 1)
                            for sub in sub_jaxprs(eqn)):
            return True
    return False
