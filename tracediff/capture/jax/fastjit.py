"""`--level calls`: the script's jitted functions keep JAX's C++ fast path.

The recorder sees a jit call in `pjit._pjit_call_impl_python`, which only JAX's Python
dispatch path reaches, so every recorded call used to take that path: for a call of 20
arrays it costs ~220 us here against the fast path's ~26 us (abstract values and sharding
checks per argument, docs/performance.md), and on a TPU host each step of a small model
paid it. At `--level calls` the recorder needs from a call only its inputs, its outputs
and what its jaxpr says once (name, argument and result names, whether it is an optax
step): `jax.jit` then returns a `FastJit`, which learns that from `.trace()` once per
call signature and records each call around the script's own `PjitFunction`, called as
it is (the same executable, through the C++ fast path). The calls it records are written
by the recorder's `record_light_call`, as the hook's are (tests/test_jax_fastjit.py
compares the traces). Only jitted functions with no static arguments are wrapped (their
mapping from arguments to the jaxpr's inputs is plain flattening); the others, and
every jit call JAX's own modules make, keep the hook. TRACEDIFF_JAX_FAST_JIT=0 turns it
off.
"""

import functools
import os
import types


def enabled():
    """Wrap the script's jits (TRACEDIFF_JAX_FAST_JIT=0: every call takes the hook)."""
    return os.environ.get("TRACEDIFF_JAX_FAST_JIT", "1") != "0"


class Signature:
    """What a call's jaxpr says once per call signature: its name and closed jaxpr."""

    __slots__ = ("name", "jaxpr")

    def __init__(self, name, jaxpr):
        self.name, self.jaxpr = name, jaxpr


class FastJit:
    """A jitted function whose calls are recorded around JAX's fast path (see module).

    Its own state lives in slots, not in `__dict__`: `functools.wraps` copies a wrapped
    function's `__dict__` into its wrapper, so `jax.grad(f)` of a `FastJit` f, jitted
    again, handed f's executable to the new `FastJit` (`jit(grad(f))` returned f's
    outputs). Only the function's own attributes (`update_wrapper`) are in `__dict__`."""

    __slots__ = ("_capture", "_fn", "_signatures", "__dict__", "__weakref__")

    def __init__(self, capture, fn):
        functools.update_wrapper(self, fn)
        self.__wrapped__ = getattr(fn, "__wrapped__", fn)
        self._capture, self._fn = capture, fn
        self._signatures = {}

    def __getattr__(self, name):    # lower, trace, eval_shape, clear_cache, ...
        try:
            fn = object.__getattribute__(self, "_fn")
        except AttributeError:   # not initialised (a copy made without __init__)
            raise AttributeError(name) from None
        return getattr(fn, name)

    def __get__(self, obj, objtype=None):   # a jitted method, as PjitFunction binds one
        return self if obj is None else types.MethodType(self, obj)

    def __repr__(self):
        return repr(self._fn)

    def __reduce_ex__(self, protocol):      # pickled (or refused) as the PjitFunction is
        import pickle

        return pickle.loads, (pickle.dumps(self._fn, protocol),)

    def __call__(self, *args, **kwargs):
        cap = self._capture
        if not cap.records_fast_calls():
            return self._fn(*args, **kwargs)
        import jax

        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        key = (tree, tuple((getattr(x, "shape", None), getattr(x, "dtype", type(x)),
                            getattr(x, "weak_type", None)) for x in leaves))
        try:
            sig = self._signatures.get(key)
        except TypeError:   # a leaf JAX will refuse (an unhashable shape): its error, by
            return self._fn(*args, **kwargs)   # the hook's path
        if sig is None:
            if len(self._signatures) > 256:
                self._signatures.clear()
            try:
                traced = self._fn.trace(*args, **kwargs)
                sig = Signature(traced.fun_name, traced.jaxpr)
            except Exception:   # the call's own error (JAX raises it again from the call),
                sig = False     # or a JAX without these: this signature keeps the hook
            self._signatures[key] = sig
        if sig is False:
            return self._fn(*args, **kwargs)
        out = []

        def run():
            out.append(self._fn(*args, **kwargs))
            return jax.tree_util.tree_leaves(out[0])

        cap.record_light_call(sig.name, sig.jaxpr, leaves, run)
        cap.fast_calls += 1
        return out[0]


def patched_jit(capture, orig):
    """`jax.jit` returning a `FastJit` for a script's function with no static arguments
    (tracediff's own programs, made while it records, stay plain)."""

    @functools.wraps(orig)
    def jit(*args, **kwargs):
        if not args:   # a decorator factory, @jax.jit(donate_argnums=...), where this JAX
            orig(**kwargs)   # has one (else its error)
            return lambda f: jit(f, **kwargs)
        fn = orig(*args, **kwargs)
        static = any(kwargs.get(k) not in (None, (), []) for k in ("static_argnums",
                                                                  "static_argnames"))
        if capture.own_work() or len(args) > 1 or static or not hasattr(fn, "trace"):
            return fn
        return FastJit(capture, fn)

    return jit
