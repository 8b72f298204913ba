"""The dispatch path: one `TorchDispatchMode` sees every aten op (forward, the autograd
engine's backward ops, the optimizer's); `on_op` runs the op and writes its event, input
links and output values. This is the recorder's hot path (tens of thousands of calls a
second on tiny ops): locals instead of attributes, interned strings, the common case of
dataflow (`dataflow.py`) and of value storage (`values.py`) inlined."""

import sys
import threading
import weakref

import numpy as np

from ..budget import HEADROOM, get_limit, set_limit
from ...trace import schema
from . import loaded
from .dataflow import _local_start
from .opinfo import _SCALAR_TYPES, _OpInfo
from .values import _c_order, _fsdp_possible, _host_keeping_storage, _own_dispatch


def _flat(xs, out):
    """Append the tensors of xs (args tuple, kwargs values, nested one level) to out."""
    Tensor = loaded.torch.Tensor
    for x in xs:
        if isinstance(x, Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, Tensor):
                    out.append(y)
    return out


# the hot path's globals, looked up once (module attributes cost a lookup each)
_wref = weakref.ref
_get_ident = threading.get_ident
_FW_TORCH, _KIND_OP, _ORIGIN_EAGER = schema.FW_TORCH, schema.KIND_OP, schema.ORIGIN_EAGER


class _Dispatch:
    """Recording one aten op (a mixin of `TorchCapture`)."""

    def on_sub_op(self, func, types, args, kwargs):
        """An op with tensor-subclass arguments (`types`): a DTensor op recorded at the
        level the user wrote it and its local ops below (capture/torch/subclass.py), any
        other as one op whose subclass values are metadata."""
        sub = self.subclasses
        if not self.keep_resizable and (_own_dispatch(types) or _fsdp_possible()):
            # DTensor / FSDP2: storages are freed with resize_(0); FSDP1 frees the flat
            # parameter its constructor concatenates (an op on parameters) when it shards
            self.keep_resizable = True
        if sub.redispatch is func:   # handed back by `Subclasses.run`: DTensor's turn
            sub.redispatch = None
            return NotImplemented
        if sub.depth:   # FakeTensor ops of DTensor's sharding propagation
            return func(*args, **kwargs)
        return self.on_op(func, args, kwargs, sub.dtensor_types(types))

    substitutions = None   # confirm's counterfactual run: substitute.Substitutions

    def on_op(self, func, args, kwargs, dtensor=False):
        """Run one aten op and record it (called by the dispatch mode).

        A failure inside the recorder never reaches the script: recording stops, the
        op runs as usual and the manifest names the error.

        This is the recorder's hot path (tens of thousands of calls a second on tiny
        ops): one method, locals instead of attributes, strings interned once per
        (op, module, source), parameter summaries cached per argument values, values
        handed to the writer as host arrays (`add_array`). docs/performance.md has the
        profile."""
        if self.compiled_depth or self.forked or self.failed or self.writer.closed or (
                self.subclasses.depth and self.subclasses.fake_active()):
            return func(*args, **kwargs)
        try:
            info = self._opinfo.get(id(func))   # OpOverload.__hash__ is Python code
            if info is None:
                info = self._opinfo[id(func)] = _OpInfo(func)
            if info.skip:
                return func(*args, **kwargs)
            node = self._cur_node()
            if node is None:
                seq_now = self._get_seq()
                src = self._source()
                mod = self.mod_stack[-1] if self.mod_stack else None
            elif type(node).__name__ == "CompiledFunctionBackward":
                return func(*args, **kwargs)  # AOT autograd's plumbing: the compiled call records it
            else:
                seq_now = src = mod = None
            self._cur_source = src
            # `_flat`, inlined; `simple`: every argument is a tensor (no parameters)
            Tensor = self._Tensor
            ins = []
            simple = not kwargs
            for x in args:
                if isinstance(x, Tensor):
                    ins.append(x)
                else:
                    simple = False
                    if isinstance(x, (list, tuple)):
                        for y in x:
                            if isinstance(y, Tensor):
                                ins.append(y)
            if kwargs:
                _flat(kwargs.values(), ins)
            with self.lock:
                if self.pending:   # outputs of writing or aliasing ops only: rare
                    self._fix_pending()
                producer = self.producer
                # `_ref`'s common case inlined: a known tensor, its version unchanged (an
                # inference tensor's is -1: it has none), no later write through another
                # alias of its storage (`_written_since`, leaves only)
                refs = []
                writes = self.storage_writes
                moved = self._moved if self.keep_resizable else None
                for t in ins:
                    e = producer.get(id(t))
                    if e is not None and e[0]() is t:
                        v = e[3]
                        if (v is None or v == -1 or v == t._version) and not (
                                moved is not None and moved(t)):
                            if not writes or not t.is_leaf:
                                refs.append((e[1], e[2]))
                                continue
                            try:
                                ptr = t.untyped_storage().data_ptr()
                            except Exception:   # a DTensor: its local shard's storage
                                ptr = _local_start(t)
                            sw = writes.get(ptr) if ptr else None
                            if sw is None or sw[0] <= e[1]:
                                refs.append((e[1], e[2]))
                                continue
                    refs.append(self._ref(t))
                self.hold = None
        except Exception as exc:
            self._fail(exc)
            return func(*args, **kwargs)
        if info.collective:   # c10d: inputs before, outputs after its Work (collectives.py)
            return self.collectives.run(func, args, kwargs,
                                        (info, None, node, seq_now, src, mod, refs))
        out = info.call(*args, **kwargs) if not dtensor else self.subclasses.run(func, args, kwargs)
        if self.substitutions is not None:   # a counterfactual run of confirm (substitute.py)
            try:
                self.substitutions.apply(self.writer.n_events, info.name, out, loaded.torch)
            except Exception as exc:
                self._fail(exc)
        try:
            self._after(info, node, seq_now, src, mod, refs, args, kwargs, out, simple)
        except Exception as exc:
            self._fail(exc)
        return out

    def _fail(self, exc):
        try:
            self.failed = f"{type(exc).__name__}: {exc}"[:500]
        except Exception:   # an exception whose str raises
            self.failed = type(exc).__name__
        self.failed_at_event = self.writer.n_events
        print(f"tracediff: torch capture stopped at event {self.failed_at_event}: {self.failed}",
              file=sys.stderr)

    def _after(self, info, node, seq_now, src, mod, refs, args, kwargs, out, simple=False):
        """Write the op's event, input links and output values."""
        Tensor = loaded.torch.Tensor
        if out is None:
            outs = [a for i, _ in info.write_pos if i < len(args) for a in _flat((args[i],), [])]
            outs += [a for _, n in info.write_kw if n in kwargs for a in _flat((kwargs[n],), [])]
        elif isinstance(out, Tensor):
            outs = [out]
        elif isinstance(out, (list, tuple)):
            outs = _flat(out, [])
        else:
            outs = None
        parent = -1
        node_id = -1
        phase = self.phase
        params = None if simple else self._params_cached(info, args, kwargs)
        w = self.writer
        if node is not None:
            phase = schema.PHASE_BWD
            node_name = type(node).__name__
            node_id = self._ids.get(node_name)
            if node_id is None:
                node_id = self._ids[node_name] = w.intern(node_name)
            fwd = self.seq2fwd.get((_get_ident(), node._sequence_nr()))
            if fwd is not None:
                parent, mod, src = fwd
            elif node_name == "AccumulateGrad":
                pname = self._param_names().get(id(node.variable))
                if pname is not None:
                    mod = pname.rpartition(".")[0]
                    params = f"param={pname}" + (f", {params}" if params else "")
        ids = self._ids
        key = (info.name, params, mod, src)
        ev = ids.get(key)
        if ev is None:
            ev = ids[key] = (w.intern(info.name), w.intern(params), w.intern(mod),
                             w.source_id(src))
        with self.lock:
            eid = w.add_event_ids(_FW_TORCH, _KIND_OP, phase, _ORIGIN_EAGER,
                                  ev[0], ev[1], ev[2], ev[3], node_id, -1, parent, self.step)
            self.n_ops += 1
            if refs:
                w._rows["inputs"].extend([(eid, slot, r[0], r[1]) for slot, r in enumerate(refs)])
            if node is None:
                tid = _get_ident()
                last = self.last_seq.get(tid, seq_now)
                if last != seq_now:
                    entry = (eid, mod, src)
                    seq2fwd = self.seq2fwd
                    for s in range(last, seq_now):
                        seq2fwd[(tid, s)] = entry
                    self.last_seq[tid] = seq_now
            keep = not self.filtered or self.opts.selected(info.name, mod)
            if outs is None:
                if isinstance(out, _SCALAR_TYPES):
                    w.add_value(eid, 0, np.asarray(out), flags=schema.VFLAG_SCALAR, store=keep)
                return
            producer, pending, last_writer = self.producer, self.pending, self.last_writer
            writes = self.storage_writes if (info.write_pos or info.write_kw) else None
            # An op that writes an argument or returns an alias: autograd bumps the
            # version after this returns, so it is read at the next op (`pending`). A
            # fresh output's version is final now.
            lazy = writes is not None or info.view
            uninit = info.uninit
            uslots = info.uninit_slots
            dtypes = self._dtypes
            resizable = self.keep_resizable
            for slot, o in enumerate(outs):
                wr = _wref(o)
                key = id(o)
                if lazy:
                    producer[key] = (wr, eid, slot, None)
                    pending.append((key, wr))
                else:
                    try:
                        v = o._version
                    except RuntimeError:   # an inference tensor has none
                        v = -1
                    producer[key] = (wr, eid, slot, v)
                try:
                    ptr = o.data_ptr()     # the storage's start: data_ptr less the offset
                    if ptr:
                        off = o.storage_offset()
                        if off:
                            ptr -= off * o.element_size()
                except Exception:
                    ptr = 0
                view_uninit = uninit or (uslots is not None and slot in uslots)
                if ptr:
                    # uninitialised memory stays so through views, and outside a part
                    # written in place (DDP fills its `empty` gradient buckets slice
                    # by slice)
                    lw = last_writer.get(ptr)
                    st_uninit = view_uninit
                    if lw is not None and lw[3] and not view_uninit:
                        view_uninit = st_uninit = bool(info.view)
                        if not st_uninit:
                            st_uninit = o.numel() * o.element_size() < \
                                o.untyped_storage().nbytes()
                    last_writer[ptr] = (eid, slot, wr, st_uninit)
                    if resizable:
                        self.storage_of[key] = ptr
                    if writes is not None:
                        writes[ptr] = (eid, slot, tuple(o.shape), o.stride(),
                                       o.storage_offset(), o.dtype)
                    if (lazy and self.subclasses.param_shards
                            and ptr in self.subclasses.param_shards):
                        # a write to, or a view of, a DTensor parameter's local shard
                        self.subclasses.tag_write(eid, slot, ptr, o)
                elif resizable:
                    # no storage (an empty tensor): forget what an earlier object at the
                    # same id had, or `_moved` takes that for this one's and snapshots it
                    self.storage_of.pop(key, None)
                if not keep:  # outside the --ops/--modules window: metadata only
                    w.add_meta_value(eid, slot, self._dtype_info(o.dtype)[0], tuple(o.shape))
                    continue
                dinfo = dtypes.get(o.dtype)
                if dinfo is not None and dinfo[1] and not view_uninit:
                    # .numpy() refuses what the fast path cannot take as is (another
                    # device, sparse, conj/neg bits): those take _store. A tensor that
                    # requires grad is detached first: numpy()'s refusal costs ~27 us
                    # (a C++ exception with its backtrace), the detach ~1.
                    try:
                        arr = (o.detach() if o.requires_grad else o).numpy() if not \
                            resizable else _host_keeping_storage(o)
                    except (RuntimeError, TypeError):
                        arr = None
                    if arr is not None:
                        if not arr.flags.c_contiguous:
                            arr = _c_order(o, arr)
                        w.add_array(eid, slot, arr)
                        continue
                self._store(eid, slot, o, view_uninit)


def _dispatch_entry(capture, dispatch, lazy):
    """The mode's `__torch_dispatch__`: `dispatch` with `budget.HEADROOM` more frames of
    recursion limit, kept out of Dynamo when Dynamo could see it, in one frame.

    - Headroom: the recorder's own frames above an op never count against the script's
      budget (capture/budget.py); this frame is the only one the script's budget pays for.
    - Dynamo (`lazy`: torch versions that wrap a mode's dispatch in `_disable_dynamo`):
      torch's wrapper imports Dynamo at the first call (~2.5 CPU-s) and then enters and
      leaves Dynamo's disabled context on every op (~10 us of Python a tiny op). Its only
      effect is that no eval-frame callback runs inside the recorder; when none is set
      (an eager program: Dynamo not imported, or imported but not compiling or running a
      compiled frame right now) calling `dispatch` directly is the same thing. Otherwise
      (inside a compiled call, while Dynamo traces) this is torch's own wrapper."""
    disabled = None
    get_callback = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        nonlocal disabled, get_callback
        limit = get_limit()
        set_limit(limit + HEADROOM)
        try:
            if types:   # tensor subclass arguments (DTensor): rare, never the hot path
                if not lazy or get_callback is None or get_callback() is None:
                    return capture.on_sub_op(func, types, args, kwargs or {})
                return disabled(self, func, types, args, kwargs)
            if not lazy:
                return capture.on_op(func, args, kwargs or {})
            if get_callback is None:
                dynamo = sys.modules.get("torch._dynamo")
                if dynamo is None or getattr(getattr(dynamo, "__spec__", None), "_initializing",
                                             False):
                    return capture.on_op(func, args, kwargs or {})
                torch = sys.modules["torch"]
                disabled = torch._disable_dynamo(dispatch, recursive=True)
                get_callback = torch._C._dynamo.eval_frame.get_eval_frame_callback
            if get_callback() is None:
                return capture.on_op(func, args, kwargs or {})
            return disabled(self, func, types, args, kwargs)
        finally:
            try:
                set_limit(limit)
            except RecursionError:   # this frame stands at the limit itself: stay higher
                pass

    return __torch_dispatch__


def _make_mode(capture):
    from torch.utils._python_dispatch import TorchDispatchMode

    def dispatch(self, func, types, args=(), kwargs=None):
        if types:
            return capture.on_sub_op(func, types, args, kwargs or {})
        return capture.on_op(func, args, kwargs or {})

    # torch versions that wrap a mode's dispatch for Dynamo get the same wrapper, later
    skip = getattr(TorchDispatchMode, "_should_skip_dynamo", None)
    lazy = skip is not None and skip()

    class _TraceMode(TorchDispatchMode):
        __torch_dispatch__ = _dispatch_entry(capture, dispatch, lazy)

        @classmethod
        def _should_skip_dynamo(cls):
            return False   # wrapped above (torch would wrap it again at class creation)

        @classmethod
        def ignore_compile_internals(cls):
            # Dynamo compiles under this mode (instead of falling back to eager) and runs
            # the compiled artifacts with it active; their ops pass through `on_op`
            # unrecorded (compiled_depth) and compiled.py records the calls.
            return True

    return _TraceMode()
