"""The emitter API: what the parts that record on the capture's behalf (compiled graphs,
`compiled*.py`; collectives, `collectives.py`; DTensor, `subclass.py`) call to look up
producers, register outputs, store values and name sources, so that their events link
into the same dataflow as the eager ops'."""

import threading
import weakref

import numpy as np

from ...trace import schema
from . import loaded
from .opinfo import _SCALAR_TYPES, _OpInfo


class _EmitterAPI:
    """The capture's public side for its helpers (a mixin of `TorchCapture`)."""

    def recording(self):
        """Is this thread recording now (not forked, not failed, inside the --steps window)?"""
        return (self.installed and not self.forked and not self.failed and not self.writer.closed
                and threading.get_ident() == self.thread and self._in_window())

    def ref(self, t):
        """(event, slot) that produced tensor t's current value (an `<input>` snapshot
        when unknown); the caller holds `lock`."""
        if self.pending:
            self._fix_pending()
        return self._ref(t)

    def register(self, eid, slot, t):
        """Make tensor t (a live program tensor) known as output `slot` of event eid."""
        wr = weakref.ref(t)
        self.producer[id(t)] = (wr, eid, slot, None)
        self.pending.append((id(t), wr))
        try:
            ptr = t.untyped_storage().data_ptr()
        except Exception:
            ptr = 0
        if ptr:
            self.last_writer[ptr] = (eid, slot, wr, False)
            if self.keep_resizable:
                self.storage_of[id(t)] = ptr
        elif self.keep_resizable:
            self.storage_of.pop(id(t), None)

    def store(self, eid, slot, t, name=None, keep=True, uninit=False, role=schema.ROLE_OUT):
        """Write tensor t (or a Python scalar) as value `slot` of event eid (an output, or
        with `role` an input); metadata only when `keep` is false (outside an
        --ops/--modules window) or `uninit` (empty*)."""
        if not isinstance(t, loaded.torch.Tensor):
            if isinstance(t, _SCALAR_TYPES):
                self.writer.add_value(eid, slot, np.asarray(t), name=name, flags=schema.VFLAG_SCALAR,
                                      store=keep)
            return
        if keep:
            self._store(eid, slot, t, uninit=uninit, name=name, role=role)
        else:
            self.writer.add_meta_value(eid, slot, self._dtype_info(t.dtype)[0], tuple(t.shape),
                                       name=name, role=role)

    def keeps(self, op, module):
        """Do the --ops/--modules windows keep the values of this op?"""
        return not self.filtered or self.opts.selected(op, module)

    def user_source(self):
        """The `file:line` calling into torch right now (`_source`: "LIB ← USER" inside
        library code)."""
        return self._source()

    def source_file(self, filename):
        """Does a frame in this file name an op's source line (as `user_source` decides:
        not torch, tracediff or Python's standard library)?"""
        return not (filename.startswith(self.skip_prefixes) or (
            filename.startswith(self.stdlib) and "-packages" not in filename))

    def short_source(self, filename, line):
        short = self._short.get(filename)
        if short is None:
            short = self._short[filename] = self.session.short_path(filename)
        return f"{short}:{line}"

    def module_path(self):
        return self.mod_stack[-1] if self.mod_stack else None

    @staticmethod
    def op_info(func):
        """Name, argument names and written arguments of an aten overload (uncached)."""
        return _OpInfo(func)

    def params(self, info, args, kwargs):
        return self._params(info, args, kwargs)

    def fail(self, exc):
        self._fail(exc)
