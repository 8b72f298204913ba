"""Dataflow: which event produced each input of an op. No strong references to the
program's tensors: `id -> (weakref, event, slot, _version)`, the version read lazily at
the next op for writing or aliasing ops; a tensor whose version moved or whose storage
was written through another alias is looked up by storage (`last_writer`,
`storage_writes`), else snapshotted once as an `<input>` event. `_prune` keeps this
bookkeeping bounded over long runs (called once per optimizer step)."""

import weakref

from ...trace import schema


def _local_start(t):
    """The start of a DTensor's local shard's storage (0: none, or not a DTensor): the
    wrapper has no storage of its own, a write through `p.to_local()` lands there."""
    local = getattr(t, "_local_tensor", None)
    try:
        return local.untyped_storage().data_ptr() if local is not None else 0
    except Exception:
        return 0


def _shard(t):
    """The tensor whose geometry a storage write is compared with: a DTensor's local shard."""
    local = getattr(t, "_local_tensor", None)
    return t if local is None else local


class _Dataflow:
    """Producers of tensors and input snapshots (a mixin of `TorchCapture`)."""

    def _fix_pending(self):
        producer = self.producer
        for key, wr in self.pending:
            t = wr()
            if t is not None:
                e = producer.get(key)
                if e is not None and e[0] is wr:
                    try:
                        v = t._version
                    except RuntimeError:   # an inference tensor has none
                        v = -1
                    producer[key] = (wr, e[1], e[2], v)
        self.pending = []

    def _ref(self, t):
        """(event, slot) that produced tensor t's current value; snapshots unknown tensors."""
        e = self.producer.get(id(t))
        known = e is not None and e[0]() is t
        if known and self.keep_resizable and self._moved(t):
            # its storage was freed and allocated again (FSDP's `storage.resize_`): what
            # it holds now is uninitialised until an op writes it
            return self._snapshot(t, -1, True)
        if known:
            v = e[3]
            if v is None or v == -1 or t.is_inference() or v == t._version:
                w = self._written_since(t, e[1])
                if w is None:
                    return e[1], e[2]
                g = _shard(t)
                if w[2] == tuple(g.shape) and w[3] == g.stride() and w[4] == \
                        g.storage_offset() and w[5] == g.dtype:
                    # the write covered exactly t: its recorded output is t's value now
                    self.producer[id(t)] = (e[0], w[0], w[1], v)
                    return w[0], w[1]
                # else: written through another geometry; snapshot it below
        self.n_fallback += 1
        try:
            ptr = t.untyped_storage().data_ptr()
        except Exception:
            ptr = _local_start(t)
        lw = self.last_writer.get(ptr) if ptr else None
        parent, uninit = -1, False
        g = _shard(t)
        if lw is not None:
            o = lw[2]()
            if o is not None:
                # The writer's output is alive, so the storage is the same one: an alias.
                if (o.shape == g.shape and o.dtype == g.dtype and o.stride() == g.stride()
                        and o.storage_offset() == g.storage_offset()):
                    return lw[0], lw[1]
                parent, uninit = lw[0], lw[3]   # an alias of uninitialised memory
            elif known and lw[0] > e[1]:
                parent = lw[0]  # written in place through a view that is gone
                w = self.storage_writes.get(ptr)
                if w is not None and w[0] == lw[0] and w[2] == tuple(g.shape) and \
                        w[3] == g.stride() and w[4] == g.storage_offset() and w[5] == g.dtype:
                    # ... that covered exactly t (`p.to_local().add_()` on a DTensor
                    # parameter's shard): that write's output is t's value now
                    self.producer[id(t)] = (e[0], w[0], w[1], t._version)
                    return w[0], w[1]
            elif lw[3]:
                # Most likely a wrapper (nn.Parameter) of an empty* output: the bytes are
                # uninitialised, never compare them.
                parent, uninit = lw[0], True
        return self._snapshot(t, parent, uninit)

    def _snapshot(self, t, parent, uninit):
        """Snapshot: an external input (or a value written through an alias we cannot map)."""
        eid = self.writer.add_event(framework=schema.FW_TORCH, kind=schema.KIND_INPUT, op="<input>",
                                    phase=self.phase, origin=schema.ORIGIN_SNAPSHOT,
                                    step=self.step, parent=parent, source=self._cur_source)
        self.n_inputs += 1
        self._store(eid, 0, t, uninit=uninit)
        wr = weakref.ref(t)
        self.producer[id(t)] = (wr, eid, 0, -1 if t.is_inference() else t._version)
        if self.keep_resizable:
            try:
                ptr = t.untyped_storage().data_ptr()
            except Exception:
                ptr = 0
            self.storage_of[id(t)] = ptr
            if ptr and uninit:   # views of it stay uninitialised until written
                self.last_writer[ptr] = (eid, 0, wr, True)
        return eid, 0

    def _moved(self, t):
        """Is t's storage no longer the one its producer wrote (freed and allocated again
        with `storage.resize_`, as FSDP does with its all-gather buffers)?"""
        was = self.storage_of.get(id(t))
        if was is None:
            return False
        try:
            return t.untyped_storage().data_ptr() != was
        except Exception:
            return False

    def _written_since(self, t, eid):
        """The in-place write of t's storage after event eid through another tensor object
        (`.data`, a detached alias), as storage_writes holds it, or None. Only leaves are
        checked (parameters and buffers are what such writes touch), and only once any
        in-place write happened."""
        if not self.storage_writes or not t.is_leaf:
            return None
        try:
            ptr = t.untyped_storage().data_ptr()
        except Exception:
            ptr = _local_start(t)   # a DTensor parameter: its local shard's storage
        w = self.storage_writes.get(ptr)
        return w if w is not None and w[0] > eid else None

    def _prune(self):
        """Forget bookkeeping that can no longer be used, so long runs stay bounded."""
        # Autograd nodes older than two optimizer steps have run their backward.
        self._seq_marks.append(self._get_seq())
        if len(self._seq_marks) > 2:
            keep = self._seq_marks.pop(0)
            self.seq2fwd = {k: v for k, v in self.seq2fwd.items() if k[1] >= keep}
        if len(self.producer) > 200_000:
            self.producer = {k: v for k, v in self.producer.items() if v[0]() is not None}
        if len(self.storage_of) > 200_000:
            self.storage_of = {k: v for k, v in self.storage_of.items() if k in self.producer}
        if len(self.last_writer) > 200_000:
            self.last_writer = {k: v for k, v in self.last_writer.items() if v[2]() is not None}
            self.storage_writes = {k: v for k, v in self.storage_writes.items()
                                   if k in self.last_writer}
