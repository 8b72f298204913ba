"""Module paths for Flax NNX models.

Flax linen pushes a JAX name scope per module call (`MLP/fc1`); NNX does not, so an
`nnx.Module` with `self.linear1 = nnx.Linear(...)` recorded no module path at all and
could not be paired with its torch port by path. Here every `nnx.Module` subclass's
`__call__` is wrapped: the outermost module call takes the paths of its NNX graph
(`nnx.iter_graph`: `linear1`, `bn`, `blocks/0/attn`, like torch's `named_modules()`
relative to the model), and each module call runs inside `jax.named_scope` of its path
relative to the module that calls it. A name scope is metadata: the computation and its
results are unchanged. Uninstalling restores every class as it was.
"""

import functools
import threading

_TL = threading.local()
MARK = "_tracediff_nnx_path"


def _subclasses(cls):
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        for s in c.__subclasses__():
            if s not in out:
                out.append(s)
                todo.append(s)
    return [cls] + out


class NnxPaths:
    """Installs and removes the `__call__` wrappers (see the module docstring)."""

    def __init__(self):
        self.wrapped = []        # (class, original __call__)
        self.nnx = None
        self._had_init_subclass = False

    def install(self):
        import jax
        from flax import nnx

        self.nnx, self.named_scope = nnx, jax.named_scope
        for cls in _subclasses(nnx.Module):
            self._wrap(cls)
        module = nnx.Module
        self._had_init_subclass = "__init_subclass__" in module.__dict__
        self._orig_init_subclass = module.__dict__.get("__init_subclass__")
        paths = self

        def __init_subclass__(cls, **kwargs):
            if paths._had_init_subclass:
                paths._orig_init_subclass.__func__(cls, **kwargs)
            else:
                super(module, cls).__init_subclass__(**kwargs)
            paths._wrap(cls)

        module.__init_subclass__ = classmethod(__init_subclass__)

    def uninstall(self):
        if self.nnx is None:
            return
        module = self.nnx.Module
        if self._had_init_subclass:
            module.__init_subclass__ = self._orig_init_subclass
        else:
            try:
                del module.__init_subclass__
            except AttributeError:
                pass
        for cls, call in reversed(self.wrapped):
            cur = cls.__dict__.get("__call__")
            if cur is not None and getattr(cur, MARK, False):
                type.__setattr__(cls, "__call__", call)
        self.wrapped = []
        self.nnx = None

    def _wrap(self, cls):
        call = cls.__dict__.get("__call__")
        if call is None or getattr(call, MARK, False) or not callable(call):
            return
        paths = self

        @functools.wraps(call)
        def __call__(module, *args, **kwargs):
            return paths.call(call, module, args, kwargs)

        setattr(__call__, MARK, True)
        type.__setattr__(cls, "__call__", __call__)
        self.wrapped.append((cls, call))

    def call(self, call, module, args, kwargs):
        stack = getattr(_TL, "stack", None)
        if stack is None:
            stack = _TL.stack = []
        if not stack:     # the outermost module call: the root of the paths
            try:
                paths = {id(node): "/".join(str(p) for p in path)
                         for path, node in self.nnx.iter_graph(module)
                         if isinstance(node, self.nnx.Module)}
            except Exception:  # a graph NNX cannot walk: no paths, never a failure
                paths = {}
            stack.append((paths, ""))
            try:
                return call(module, *args, **kwargs)
            finally:
                stack.pop()
        paths, parent = stack[-1]
        path = paths.get(id(module))
        if not path:
            return call(module, *args, **kwargs)
        rel = path[len(parent) + 1:] if parent and path.startswith(parent + "/") else path
        stack.append((paths, path))
        try:
            with self.named_scope(rel):
                return call(module, *args, **kwargs)
        finally:
            stack.pop()
