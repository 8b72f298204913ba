"""torch.distributed collectives, recorded before and after: what a rank sent and what it got.

The c10d collectives (`dist.all_reduce`, `broadcast`, `all_gather`, `reduce_scatter`,
`all_gather_into_tensor`, `reduce_scatter_tensor`, `barrier`, ...) reach the dispatcher as
`c10d::*` ops, so the recorder's `TorchDispatchMode` sees them, DDP's gradient all-reduce
included (its C++ Reducer calls `ProcessGroup::allreduce`, which dispatches
`c10d::allreduce_` on the bucket, inside `loss.backward()`). They are asynchronous (gloo runs
them on its own threads): an in-place collective's tensor read when the op returns may
or may not be reduced yet. So a collective is recorded here, not by the generic op path:

- its tensor arguments are copied *before* it runs (role-IN values, slot = argument
  order, lists flattened one level, as the dataflow edges);
- the returned `Work` is waited for, then the tensors it writes (`tensors` of
  `allreduce_`/`broadcast_`, `output_tensors` of `allgather_`/`reduce_scatter_`, ...)
  are stored as its outputs: the result this rank received;
- `params` names the process group: `group=<name>, ranks=[...], backend=gloo`, then the
  plain arguments (`reduce_op=SUM`, `root_rank=0`).

Waiting makes an asynchronous collective synchronous while recording (the values are the
same; DDP's communication no longer overlaps the rest of backward). The functional
collectives of `torch.distributed._functional_collectives` (`_c10d_functional::*`, used
by DTensor and FSDP2) are recorded as ordinary ops: their result is only defined after
`wait_tensor`, which is recorded as its own op with the reduced value.
"""

from ...trace import schema

NAMESPACE = "c10d"


def is_collective(func):
    """Is this aten overload a c10d collective (recorded by this module)?"""
    return getattr(func, "namespace", "") == NAMESPACE


def _one_level(xs, torch):
    """The tensors of xs, lists nested one level included: the order and slots of the
    recorder's dataflow edges (`dispatch._flat`)."""
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out.extend(y for y in x if isinstance(y, torch.Tensor))
    return out


def _deep(xs, out, torch):
    for x in xs:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            _deep(x, out, torch)
    return out


class Collectives:
    """The collective recorder of one `TorchCapture` (its emitter API, `emitter.py`)."""

    def __init__(self, cap, torch):
        self.cap = cap
        self.torch = torch
        self.count = 0
        self.groups = {}        # group name -> {"ranks", "backend", "size"}
        self.ops = {}           # op name -> count
        self._written = {}      # func -> [argument positions it writes]
        self._manifest_done = False

    # -- facts about the arguments ---------------------------------------------------------
    def _writes(self, func):
        """[(position, name)] of the arguments a collective writes: its `output*`
        arguments, else its `tensors` (in place: allreduce_, broadcast_, recv_). The c10d
        schemas carry no alias annotations, so the names decide."""
        w = self._written.get(func)
        if w is None:
            args = [(i, a.name) for i, a in enumerate(func._schema.arguments)]
            w = [x for x in args if x[1].startswith("output")] or \
                [x for x in args if x[1] in ("tensors", "tensor")]
            self._written[func] = w
        return w

    def _outbufs(self, func, args, kwargs):
        """ids of the tensors passed as `output*` arguments only (never read by the
        collective), when the collective has separate input arguments."""
        w = [x for x in self._writes(func) if x[1].startswith("output")]
        if not w:
            return ()
        return {id(t) for t in _deep([args[i] if i < len(args) else kwargs.get(n)
                                      for i, n in w], [], self.torch)}

    def _group(self, obj):
        """{"name", "ranks", "backend"} of a ProcessGroup script object (None if unreadable)."""
        try:
            from torch._C._distributed_c10d import ProcessGroup
            import torch.distributed as dist

            pg = ProcessGroup.unbox(obj)
            name = pg.group_name
            g = self.groups.get(name)
            if g is None:
                try:
                    ranks = dist.get_process_group_ranks(pg)
                except Exception:
                    ranks = list(range(pg.size()))
                g = self.groups[name] = {"name": name, "ranks": [int(r) for r in ranks],
                                         "backend": str(dist.get_backend(pg)),
                                         "size": int(pg.size())}
            return g
        except Exception:
            return None

    def _params(self, info, args, kwargs):
        torch = self.torch
        parts, group = [], None
        names = info.arg_names
        for i, a in enumerate(list(args) + list(kwargs.values())):
            name = names[i] if i < len(args) and i < len(names) else \
                list(kwargs)[i - len(args)] if i >= len(args) else str(i)
            if isinstance(a, torch.ScriptObject):
                qn = ""
                try:
                    qn = a._type().qualified_name()
                except Exception:
                    pass
                if qn.endswith("ProcessGroup"):
                    group = self._group(a)
                elif qn.endswith("ReduceOp"):
                    parts.append(f"{name}={_reduce_op(a)}")
                continue
            if isinstance(a, (bool, int, float, str)) and name not in ("async_op", "timeout"):
                parts.append(f"{name}={a!r}")
        head = []
        if group is not None:
            head = [f"group={group['name']}", f"ranks={group['ranks']}",
                    f"backend={group['backend']}"]
        s = ", ".join(head + parts)
        return (s if len(s) <= 200 else s[:197] + "..."), group

    # -- the op ----------------------------------------------------------------------------
    def run(self, func, args, kwargs, pre):
        """Run collective `func` and record it: inputs before, outputs after its Work. A
        failure of the recorder stops recording (`TorchCapture.fail`); the collective
        itself always runs, once."""
        try:
            rec = self._before(func, args, kwargs, pre)
        except Exception as exc:
            self.cap.fail(exc)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        try:
            _wait(out, self.torch)
            self._after(rec, func, args, kwargs)
        except Exception as exc:
            self.cap.fail(exc)
        return out

    def _before(self, func, args, kwargs, pre):
        """Write the event, its dataflow edges and its inputs as they are now."""
        cap, torch = self.cap, self.torch
        info, tid, node, seq_now, src, mod, refs = pre
        ins = _one_level(list(args) + list(kwargs.values()), torch)
        params, group = self._params(info, args, kwargs)
        phase = cap.phase
        node_name = None
        if node is not None:
            phase = schema.PHASE_BWD
            node_name = type(node).__name__
            src = cap.user_source()
        w = cap.writer
        with cap.lock:
            eid = w.add_event(framework=schema.FW_TORCH, kind=schema.KIND_OP, op=info.name,
                              phase=phase, origin=schema.ORIGIN_EAGER, params=params,
                              name_stack=mod, source=src, node=node_name, step=cap.step)
            cap.n_ops += 1
            # dataflow edges and role-IN values share slots: the tensor arguments, lists
            # flattened one level (allgather_'s nested output buffers are written, not read)
            for slot, (pe, ps) in enumerate(refs):
                w.add_input(eid, slot, pe, ps)
            keep = cap.keeps(info.name, mod)
            # an output buffer only (all_gather_into_tensor's `output_tensor`): what it
            # held before is not what the rank sent, often uninitialised memory
            outbuf = self._outbufs(func, args, kwargs)
            for slot, t in enumerate(ins):
                cap.store(eid, slot, t, keep=keep, role=schema.ROLE_IN,
                          uninit=id(t) in outbuf)
        return eid, keep, info, group

    def _after(self, rec, func, args, kwargs):
        """Store what the collective wrote, now that its Work is done."""
        cap, torch = self.cap, self.torch
        eid, keep, info, group = rec
        writes = self._writes(func)
        outs = _deep([args[i] if i < len(args) else kwargs.get(n) for i, n in writes], [], torch)
        with cap.lock:
            for slot, t in enumerate(outs):
                cap.register(eid, slot, t)
                cap.store(eid, slot, t, keep=keep)
            self.count += 1
            self.ops[info.name] = self.ops.get(info.name, 0) + 1
        if group is not None and not self._manifest_done:
            self._note_group(group)

    def _note_group(self, group):
        """Complete the manifest's `distributed` section (backend; the rank and world size
        from the default group when no launcher variable named them)."""
        self._manifest_done = True
        try:
            import torch.distributed as dist

            w = self.cap.writer
            d = dict(w._manifest.get("distributed") or {})
            d.setdefault("backend", group["backend"])
            if "rank" not in d and dist.is_initialized():
                d.update(rank=int(dist.get_rank()), world_size=int(dist.get_world_size()),
                         local_rank=d.get("local_rank"), launcher="torch.distributed")
            w.update_manifest(distributed=d)
        except Exception:
            pass

    def manifest(self):
        return {"recorded": self.count, "ops": dict(self.ops),
                "groups": list(self.groups.values()),
                "waited": "every collective is waited for before its result is stored"}


_REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")


def _reduce_op(obj):
    """SUM / AVG / MAX ... of a c10d ReduceOp script object (its `op()` is the enum value)."""
    try:
        n = int(obj.op())
        return _REDUCE_OPS[n] if 0 <= n < len(_REDUCE_OPS) else str(n)
    except Exception:
        return "?"


def _wait(out, torch):
    """Wait for the Work a c10d op returned (alone or last in its tuple)."""
    from torch._C._distributed_c10d import Work

    works = [out] if isinstance(out, torch.ScriptObject) else \
        [o for o in out if isinstance(o, torch.ScriptObject)] if isinstance(out, (tuple, list)) \
        else []
    for wk in works:
        Work.unbox(wk).wait()
