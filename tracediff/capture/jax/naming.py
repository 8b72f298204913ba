"""Where an event comes from and what it is called.

Its source line, from the live stack (`Session.jax_site`); its name stack, JAX's own
(Flax linen's modules push a name scope per module call) and, for Flax NNX modules,
which push none, their graph paths (nnx_paths.py, installed when `flax.nnx` is
imported); and the names of a jitted function's arguments and results.
"""

import sys

from . import nnx_paths


class _Naming:
    """JaxCapture's source lines, name stacks and argument/result names."""

    def _live_source(self):
        """events.source of an eager primitive or a call, from the live stack
        (`Session.jax_site`)."""
        def frames(f):
            while f is not None:
                yield f.f_code.co_filename, f.f_lineno
                f = f.f_back
        return self.session.jax_site(frames(sys._getframe(2)))

    def _name_stack(self):
        return str(self._siu.current_name_stack())

    @staticmethod
    def _arg_names(jaxpr, n):
        names = getattr(getattr(jaxpr.jaxpr, "debug_info", None), "arg_names", None)
        return list(names) if names is not None and len(names) == n else [None] * n

    @staticmethod
    def _result_names(jaxpr, n):
        names = getattr(getattr(jaxpr.jaxpr, "debug_info", None), "result_paths", None)
        if callable(names) or names is None or len(names) != n:
            return [None] * n
        return list(names)

    def _patch_nnx(self):
        """NNX modules push no name scope of their own: give them their graph paths."""
        self._nnx_paths = nnx_paths.NnxPaths()
        try:
            self._nnx_paths.install()
        except Exception as exc:   # another Flax: record without NNX paths, never fail
            self._nnx_paths = None
            self.replay_errors.append(f"NNX module paths not recorded: {type(exc).__name__}")

    def _unpatch_nnx(self):
        paths = getattr(self, "_nnx_paths", None)
        if paths is not None:
            paths.uninstall()
            self._nnx_paths = None
