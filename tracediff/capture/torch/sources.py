"""Source lines: `events.source` of an op, the innermost frame of the user's code, as
"LIB <- USER" when the op runs inside library code (trace/sources.py). A cheap
`sys._getframe` walk with each code object classified once and each instruction's
"file:line" formatted once, so the walk costs a dict lookup or two per frame."""

import sys

from ...trace.sources import LIB_SEP


_SKIP_FILE_PREFIXES = ("<frozen", "<string>")
_PLUMBING = ("_ops.py", "overrides.py", "utils/_python_dispatch.py", "utils/_contextlib.py",
             "_compile.py", "utils/_device.py", "_dynamo/eval_frame.py", "_dynamo/external_utils.py")


class _SourceLines:
    """The user's `file:line` calling into torch (a mixin of `TorchCapture`)."""

    def _source(self):
        """events.source of the op being recorded: the innermost frame of the user's code,
        as "LIB ← USER" when the op runs inside library code (torch.nn, transformers, a pip
        package: LIB is the innermost frame outside tracediff and Python's standard library;
        trace/sources.py); torch.nn's code called by a model library is named by that
        library's frame as USER (the line that says which layer, `Session.jax_site`).
        Each code object is classified once (`_code_entry`) and each instruction's
        "file:line" formatted once (`_sites`), so the walk costs a dict lookup or two per
        frame; a frame's "file:line" is looked up only where it is used (the library's
        innermost frame, a model library's, the user's), not for the library frames
        between (nn.Module's `_call_impl` and `_wrapped_call_impl` above every layer)."""
        f = sys._getframe(2)
        kinds = self._code_kind
        sites = self._sites
        lib = model = None
        in_framework = False
        while f is not None:
            code = f.f_code
            c = id(code)
            e = kinds.get(c)
            if e is None:
                e = self._code_entry(code)
            k = e[1]
            if k and (k == 2 or lib is None or (k == 3 and model is None and in_framework)):
                site = sites.get((c, f.f_lasti))
                if site is None:
                    site = sites[(c, f.f_lasti)] = f"{e[2]}:{f.f_lineno}"
                if k == 2:
                    user = model or site
                    return user if lib is None else f"{lib}{LIB_SEP}{user}"
                if lib is None:
                    lib, in_framework = site, k == 1
                else:
                    model = site   # transformers calling torch.nn
            f = f.f_back
        return f"{lib}{LIB_SEP}{model}" if model else lib

    def _code_entry(self, code):
        """(code, kind, short file name) of a code object, cached by id(code): a code
        object's own hash is recomputed on every lookup (it hashes its constants, nested
        code objects included: ~10 us for a module's code); the entry holds the code
        object, so its id cannot be reused while cached."""
        fn = code.co_filename
        k = self._kind(fn)
        short = None
        if k:
            short = self._short.get(fn)
            if short is None:
                short = self._short[fn] = self.session.short_path(fn)
        e = self._code_kind[id(code)] = (code, k, short)
        return e

    def _kind(self, fn):
        """0: a frame never named (tracediff, the standard library, <frozen ...>, torch's
        dispatch plumbing); 1: a framework's library code (torch, flax, ...); 3: other
        library code (transformers, a pip package); 2: the user's code."""
        if fn.startswith(self.tool_prefixes) or fn in self.plumbing or (
                fn.startswith(self.stdlib) and "-packages" not in fn):
            return 0
        if fn.startswith(self.torch_dir):
            return 1
        if not self.session.is_user_file(fn):
            return 1 if self.session.in_framework(fn) else 3
        return 2
