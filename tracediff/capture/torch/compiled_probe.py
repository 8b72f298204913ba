"""`record --probe REGEX`: an inductor graph whose frame name matches is compiled once
more with every op's output as a graph output and run on clones of the call's inputs
after the real call; its values are a `probe:<frame>` call and `eqn` events (origin
`probe`), which `locate` searches when every replayed op matches but the compiled outputs
differ (fusion, reordered reductions)."""

from ...trace import schema
from . import loaded
from .compiled_calls import _flatten_out, _same_bits
from .compiled_graphs import _Ref


class _Probe:
    """The probe of compiled graphs (a mixin of `CompileRecorder`)."""

    def _probe(self, prog, ins, refs, eid, phase, ns, src, compiled):
        """Compile the graph again with every op's output as an output, run it on the
        call's inputs, record the values as a `probe:` call (see the module docstring)."""
        torch = loaded.torch
        cap = self.cap
        stats = self.probe_stats
        if prog.probe_failed:
            return
        from torch.utils._python_dispatch import _disable_current_modes

        self._tl.probing = True
        cap.compiled_depth += 1
        rng = torch.get_rng_state()
        try:
            # compiled as Dynamo compiles: with no dispatch mode active (ours included)
            with _disable_current_modes():
                if prog.probe_fn is None:
                    prog.probe_fn = _build_probe(prog, ins)
                fn, order, n_final = prog.probe_fn
                torch.set_rng_state(rng)
                with torch.no_grad():
                    res = list(fn(*ins))
        except Exception as exc:
            prog.probe_failed = f"{type(exc).__name__}: {str(exc)[:200]}"
            if len(stats["errors"]) < 20:
                stats["errors"].append(f"{prog.op}: {prog.probe_failed}")
            return
        finally:
            torch.set_rng_state(rng)
            cap.compiled_depth -= 1
            self._tl.probing = False
        finals, inter = res[:n_final], res[n_final:]
        values = dict(zip(order, inter))
        with cap.lock:
            pid = cap.writer.add_event(framework=schema.FW_TORCH, kind=schema.KIND_CALL,
                                       op=f"probe:{prog.name}" + (":backward" if prog.kind == "backward" else ""),
                                       phase=phase, origin=schema.ORIGIN_PROBE, name_stack=ns,
                                       source=src, parent=eid, step=cap.step,
                                       params=f"{len(order)} op outputs compiled as graph outputs")
            for slot, r in enumerate(refs):
                if r is not None:
                    cap.writer.add_input(pid, slot, *r)
        self._interpret(prog, ins, refs, pid, phase, ns, src, schema.ORIGIN_PROBE, values=values)
        with cap.lock:
            for slot, o in enumerate(finals):
                if isinstance(o, torch.Tensor):
                    cap.store(pid, slot, o)
        stats["calls"] += 1
        stats["ops"] += len(order)
        tensors = [(f, c) for f, c in zip(finals, compiled) if isinstance(c, torch.Tensor)]
        if all(_same_bits(f, c) for f, c in tensors):
            stats["final_outputs_equal_compiled"] += 1
        else:
            stats["final_outputs_differ_from_compiled"] += 1


def _build_probe(prog, example):
    """An inductor-compiled copy of `prog` returning (final outputs..., every op's output)."""
    torch = loaded.torch
    fx = torch.fx
    g = fx.Graph()
    env = {}
    for pos, i in enumerate(prog.placeholders):
        env[i] = g.placeholder(f"arg{pos}")
    root = torch.nn.Module()
    for i, c in prog.consts.items():
        name = f"_const{i}"
        if isinstance(c, torch.nn.Module):
            root.add_module(name, c)
        elif isinstance(c, torch.Tensor):
            root.register_buffer(name, c)
        else:
            setattr(root, name, c)
        env[i] = g.get_attr(name)

    def to_node(x):
        if isinstance(x, _Ref):
            return env[x.i]
        if isinstance(x, (list, tuple)):
            t = [to_node(y) for y in x]
            return tuple(t) if isinstance(x, tuple) else t
        if isinstance(x, dict):
            return {k: to_node(v) for k, v in x.items()}
        return x

    order, extra = [], []
    multi = {nd.i for nd in prog.ops if nd.multi and nd.tensor_out}
    for nd in prog.ops:
        if isinstance(nd.target, torch.nn.Module):
            raise RuntimeError("call_module nodes are not probed")
        node = g.call_function(nd.target, to_node(nd.args), to_node(nd.kwargs))
        env[nd.i] = node
        # every tensor an op computes: single outputs, and the used items of tuple outputs
        wanted = nd.tensor_out and not nd.multi if not nd.getitem else \
            (bool(nd.ins) and nd.ins[0] in multi)
        if wanted:
            order.append(nd.i)
            extra.append(node)
    finals = _flatten_out(to_node(prog.outputs))
    g.output(tuple(finals) + tuple(extra))
    gm = fx.GraphModule(root, g)
    from torch._inductor.compile_fx import compile_fx

    with torch.no_grad():
        fn = compile_fx(gm, list(example))
    return fn, order, len(finals)
