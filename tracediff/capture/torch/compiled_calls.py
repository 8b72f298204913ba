"""Each call of a compiled graph, recorded: a `call` event (origin `compiled`) whose
outputs are the real outputs the program receives, and before the real call the graph's
aten ops replayed one by one from the real inputs (no grad, autocast off, every dispatch
mode popped, the RNG state restored), each an `eqn` event (origin `replay`) linked into
the dataflow. How far replay is from the compiled kernels is measured for the manifest
(`replay_vs_compiled`)."""

import operator

from ...trace import schema
from . import loaded
from .compiled_graphs import _subst


class _CompiledCalls:
    """Recording and replaying compiled calls (a mixin of `CompileRecorder`)."""

    def runtime(self, prog, compiled):
        """The callable AOT autograd runs in place of `compiled`: records each call."""
        boxed = bool(getattr(compiled, "_boxed_call", False))
        rec = self

        def call(args):
            return compiled(args) if boxed else compiled(*args)

        def run(args):
            cap = rec.cap
            if getattr(rec._tl, "probing", False) or not cap.recording():
                return call(args)
            return rec.record_call(prog, call, args)

        run._boxed_call = True
        return run

    def record_call(self, prog, call, args):
        torch = loaded.torch
        cap = self.cap
        w = cap.writer
        ins = list(args)     # a boxed callee empties `args`
        Tensor = torch.Tensor
        try:
            with cap.lock:
                refs = [cap.ref(x) if isinstance(x, Tensor) else None for x in ins]
                parent = -1
                if prog.kind == "backward":
                    phase = schema.PHASE_BWD
                    ns = src = None
                    for r in refs:
                        if r is not None and r[0] in prog.region.fw_events:
                            parent = r[0]
                            ns, src = prog.region.fw_events[parent]
                            break
                else:
                    phase = cap.phase
                    ns, src = cap.module_path(), cap.user_source()
                eid = w.add_event(framework=schema.FW_TORCH, kind=schema.KIND_CALL, op=prog.op,
                                  phase=phase, origin=schema.ORIGIN_COMPILED, params=prog.params,
                                  name_stack=ns, source=src, parent=parent, step=cap.step)
                for slot, r in enumerate(refs):
                    if r is not None:
                        w.add_input(eid, slot, *r)
                if prog.kind != "backward":
                    prog.region.fw_events[eid] = (ns, src)
                    if len(prog.region.fw_events) > 10_000:
                        prog.region.fw_events.pop(next(iter(prog.region.fw_events)))
        except Exception as exc:
            cap.fail(exc)
            return call(args)
        replayed = None
        if cap.ops_level:
            replayed = self._replay(prog, ins, refs, eid, phase, ns, src)
        want_probe = self.probe is not None and prog.region.backend == "inductor" and \
            cap.ops_level and self.probe.search(prog.name) is not None
        probe_ins = [x.detach().clone() if isinstance(x, Tensor) else x for x in ins] \
            if want_probe else None
        cap.compiled_depth += 1
        try:
            out = call(args)
        finally:
            cap.compiled_depth -= 1
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        self.calls += 1
        try:
            with cap.lock:
                for slot, o in enumerate(outs):
                    name = prog.out_names[slot] if slot < len(prog.out_names) else None
                    if isinstance(o, Tensor) or isinstance(o, (bool, int, float)):
                        cap.store(eid, slot, o, name=name, keep=cap.keeps(prog.op, ns))
                # the program's own outputs come first (saved activations after them): of
                # several outputs sharing a storage, the first is its writer
                for slot in range(len(outs) - 1, -1, -1):
                    if isinstance(outs[slot], Tensor):
                        cap.register(eid, slot, outs[slot])
                cap.hold = outs
            if replayed is not None:
                self._measure(prog, replayed, outs)
            if want_probe:
                self._probe(prog, probe_ins, refs, eid, phase, ns, src, outs)
        except Exception as exc:
            cap.fail(exc)
        return out

    def _measure(self, prog, replayed, compiled):
        """How far is replay from the compiled program here? (manifest)"""
        if len(replayed) != len(compiled):
            return
        differs, worst = False, 0.0
        for r, c in zip(replayed, compiled):
            if r is None or c is None or not isinstance(c, loaded.torch.Tensor):
                continue
            if not _same_bits(r, c):
                differs = True
                worst = max(worst, _max_rel(r, c))
        fid = self.fidelity
        fid["calls_compared"] += 1
        if differs:
            fid["calls_where_replay_differs"] += 1
            fid["max_rel_difference"] = max(fid["max_rel_difference"], worst)
            if len(fid["examples"]) < 5 and prog.op not in fid["examples"]:
                fid["examples"].append(prog.op)

    def _replay(self, prog, ins, refs, eid, phase, ns, src):
        """Run the graph's ops one by one on the call's real inputs and record each;
        returns the replayed graph outputs (None when replay failed)."""
        torch = loaded.torch
        cap = self.cap
        from torch.utils._python_dispatch import _disable_current_modes

        rng = torch.get_rng_state()
        cap.compiled_depth += 1
        try:
            with _disable_current_modes(), torch.no_grad(), torch._C._DisableAutocast():
                return self._interpret(prog, ins, refs, eid, phase, ns, src, schema.ORIGIN_REPLAY)
        except Exception as exc:  # never break the script: the compiled call still runs
            self.note_error(f"replay of {prog.op}: {type(exc).__name__}: {str(exc)[:200]}")
            return None
        finally:
            torch.set_rng_state(rng)
            cap.compiled_depth -= 1

    def _interpret(self, prog, ins, refs, eid, phase, ns, src, origin, values=None):
        """Replay (values None) or emit the probe's values (values: node index -> output)."""
        torch = loaded.torch
        cap = self.cap
        w = cap.writer
        env = [None] * prog.n
        erefs = [None] * prog.n
        for pos, i in enumerate(prog.placeholders):
            x = ins[pos] if pos < len(ins) else None
            if values is None and pos in prog.mutated and isinstance(x, torch.Tensor):
                x = x.detach().clone()
            env[i] = x
            erefs[i] = refs[pos] if pos < len(refs) else None
        for i, c in prog.consts.items():
            env[i] = c
        Tensor = torch.Tensor
        for nd in prog.ops:
            if nd.getitem:
                base, idx = env[nd.ins[0]] if nd.ins else None, nd.args[1]
                env[nd.i] = operator.getitem(base, idx) if base is not None else None
                src_ref = erefs[nd.ins[0]] if nd.ins else None
                if src_ref is not None and src_ref[1] == -1:      # a multi-output op's event
                    erefs[nd.i] = (src_ref[0], idx)
                continue
            args, kwargs = _subst(nd.args, env), _subst(nd.kwargs, env)
            if values is None:
                out = nd.target(*args, **kwargs)
            elif nd.multi:
                kids = prog.items.get(nd.i, {})
                out = [values.get(kids.get(k)) for k in range(max(kids) + 1)] if kids else []
            else:
                out = values.get(nd.i)
            env[nd.i] = out
            if nd.tensor_out is False:
                continue
            if isinstance(out, Tensor):
                outs, multi = [out], False
            elif isinstance(out, (list, tuple)):
                outs, multi = list(out), True
            elif out is None and nd.info is not None and nd.info.write_pos:
                # an in-place op returning nothing (`_foreach_add_`): its written arguments
                outs = [a for i, _ in nd.info.write_pos if i < len(args) for a in _flat1(args[i])]
                multi = True
            else:
                continue
            params = cap.params(nd.info, args, kwargs) if nd.info is not None else None
            mod = nd.module if nd.module is not None else ns
            with cap.lock:
                oid = w.add_event(framework=schema.FW_TORCH, kind=schema.KIND_EQN, op=nd.op,
                                  phase=phase, origin=origin, params=params, name_stack=mod,
                                  source=nd.source or src, node=nd.orig, call=eid, parent=eid,
                                  step=cap.step, iter=-1 if nd.seq is None else nd.seq)
                slot = 0
                for j in nd.ins:
                    x = env[j]
                    if isinstance(x, Tensor):
                        r = erefs[j]
                        if r is not None:
                            w.add_input(oid, slot, *r)
                        slot += 1
                    elif isinstance(x, (list, tuple)):
                        for k, y in enumerate(x):
                            if isinstance(y, Tensor):
                                r = erefs[j]
                                if r is not None:
                                    w.add_input(oid, slot, r[0], k if r[1] == -1 else r[1])
                                slot += 1
                keep = cap.keeps(nd.op, mod)
                for k, o in enumerate(outs):
                    if isinstance(o, Tensor):
                        # named like the FX node (`add_1`, `var_mean[1]`), as the call's
                        # outputs are: locate finds the op behind a compiled output by name
                        cap.store(oid, k, o, name=f"{nd.name}[{k}]" if multi else nd.name,
                                  keep=keep, uninit=nd.info is not None and nd.info.uninit)
            if values is None:
                self.replayed += 1
            erefs[nd.i] = (oid, -1) if multi else (oid, 0)
        return _flatten_out(_subst(prog.outputs, env))


def _same_bits(a, b):
    torch = loaded.torch
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) else False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    try:
        x = a.detach().contiguous().reshape(-1).view(torch.uint8)
        y = b.detach().contiguous().reshape(-1).view(torch.uint8)
        return bool(torch.equal(x, y))
    except Exception:
        return bool(torch.equal(a, b))


def _max_rel(a, b):
    torch = loaded.torch
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape or \
            not a.dtype.is_floating_point or a.numel() == 0:
        return 0.0
    x, y = a.detach().double(), b.detach().double()
    rel = (x - y).abs() / y.abs().clamp_min(torch.finfo(a.dtype).tiny)
    rel = rel[~torch.isnan(rel)]
    return float(rel.max()) if rel.numel() else 0.0


def _flat1(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _flatten_out(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]
