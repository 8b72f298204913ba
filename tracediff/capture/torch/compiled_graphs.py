"""The graphs torch.compile runs, copied for replay: one `_Region` per Dynamo graph that
an AOT-autograd backend compiles (its name, backend and stack traces), one `_Program` per
forward, backward or inference aten graph, copied structurally before the backend
rewrites it in place. Each op keeps its target, an argument template (`_Ref` for a
node's value), its module path from `nn_module_stack` and the user's source line from
the graph's stack traces; backward ops take those of their forward op (by autograd
sequence number), as eager backward ops do."""

import functools
import operator
import re

from . import loaded


class _Ref:
    """A reference to the value of node `i` inside an argument template."""

    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


def _template(x, index):
    """Node arguments with every fx.Node replaced by a `_Ref` (a copy that later graph
    rewrites by the backend cannot change)."""
    fx = loaded.torch.fx
    return _map_args(x, lambda y: _Ref(index[y]) if isinstance(y, fx.Node) else y)


def _subst(x, env):
    return _map_args(x, lambda y: env[y.i] if isinstance(y, _Ref) else y)


def _map_args(x, leaf):
    """`leaf` applied to everything inside the lists, tuples, dicts and slices of an FX
    node's arguments, the structure kept."""
    if isinstance(x, (list, tuple)):
        t = [_map_args(y, leaf) for y in x]
        return tuple(t) if isinstance(x, tuple) else t
    if isinstance(x, dict):
        return {k: _map_args(v, leaf) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_map_args(x.start, leaf), _map_args(x.stop, leaf), _map_args(x.step, leaf))
    return leaf(x)


def _refs_in(x, out):
    """The `_Ref`s of a template in argument order."""
    if isinstance(x, _Ref):
        out.append(x.i)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _refs_in(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _refs_in(y, out)
    return out


def op_name(target):
    """`aten::add.Tensor` for an aten overload (as the eager recorder names ops), the
    operator's name for higher-order ops, `module.qualname` for Python callables."""
    sch = getattr(target, "_schema", None)
    if sch is not None:
        over = getattr(target, "_overloadname", "default")
        return sch.name if over == "default" else f"{sch.name}.{over}"
    name = getattr(target, "name", None)
    if callable(name):
        try:
            return f"higher_order::{name()}"
        except Exception:
            pass
    mod = getattr(target, "__module__", None) or ""
    return f"{mod}.{getattr(target, '__qualname__', getattr(target, '__name__', type(target).__name__))}"


def module_path(path):
    """Dynamo's `L['self'].h[0]._modules['attn']` -> `h.0.attn` (as named eagerly)."""
    p = re.sub(r"^[LG]\[(['\"])[^'\"]*\1\]", "", str(path))
    p = re.sub(r"\._modules\[(['\"])([^'\"]+)\1\]", r".\2", p)
    p = re.sub(r"\[(['\"]?)([^'\"\]]+)\1\]", r".\2", p)
    p = p.lstrip(".")
    if p == "_orig_mod":
        return ""
    return p.replace("_orig_mod.", "")


def _seq_nr(meta):
    """The autograd sequence number an FX node was traced under, or None."""
    try:
        return int(meta["seq_nr"])
    except (KeyError, TypeError, ValueError):
        return None


def _last_module(stack):
    if not stack:
        return None
    try:
        last = list(stack.values())[-1]
    except Exception:
        return None
    path = last[0] if isinstance(last, (tuple, list)) else last
    return module_path(path)


class _Node:
    """One op of a compiled graph, as replayed: target, argument template, metadata."""

    __slots__ = ("i", "name", "target", "args", "kwargs", "ins", "op", "orig", "module", "source",
                 "getitem", "tensor_out", "multi", "info", "seq")


class _Program:
    """A structural copy of one AOT graph (forward, backward or inference), made before
    the backend compiles (and rewrites) it; what replay and the probe run."""

    def __init__(self, region, gm, kind):
        torch = loaded.torch
        self.region, self.kind = region, kind
        self.name = region.name
        self.op = f"compiled:{region.name}" + (":backward" if kind == "backward" else "")
        nodes = list(gm.graph.nodes)
        index = {n: i for i, n in enumerate(nodes)}
        self.n = len(nodes)
        self.placeholders, self.ops, self.consts = [], [], {}
        self.outputs, self.out_names = (), []
        self.mutated = set()      # positions of placeholders the graph writes into
        ph_pos = {}
        seq_map = region.seq_map
        for n in nodes:
            i = index[n]
            if n.op == "placeholder":
                ph_pos[i] = len(self.placeholders)
                self.placeholders.append(i)
            elif n.op == "get_attr":
                obj = gm
                for part in str(n.target).split("."):
                    obj = getattr(obj, part)
                self.consts[i] = obj
            elif n.op in ("call_function", "call_module"):
                node = _Node()
                node.i, node.name = i, n.name
                node.target = gm.get_submodule(n.target) if n.op == "call_module" else n.target
                node.args = _template(n.args, index)
                node.kwargs = _template(n.kwargs, index)
                node.ins = _refs_in((node.args, node.kwargs), [])
                node.getitem = node.target is operator.getitem
                val = n.meta.get("val")
                node.multi = isinstance(val, (list, tuple))
                # None: no metadata, decided from the replayed value
                node.tensor_out = None if "val" not in n.meta else (
                    isinstance(val, torch.Tensor) or (
                        node.multi and any(isinstance(v, torch.Tensor) for v in val)))
                node.op = op_name(node.target)
                orig = n.meta.get("original_aten")
                node.orig = op_name(orig) if orig is not None else None
                node.info = region.rec.cap.op_info(node.target) \
                    if getattr(node.target, "_schema", None) is not None else None
                node.seq = _seq_nr(n.meta)
                node.module, node.source = self._site(n, kind, seq_map)
                if node.info is not None:
                    for pos, _ in node.info.write_pos:
                        if pos < len(n.args) and isinstance(n.args[pos], loaded.torch.fx.Node) and \
                                index[n.args[pos]] in ph_pos:
                            self.mutated.add(ph_pos[index[n.args[pos]]])
                self.ops.append(node)
            elif n.op == "output":
                self.outputs = _template(n.args[0], index)
        by_i = {nd.i: nd for nd in self.ops}
        self.items = {}           # multi-output node -> {index: its getitem node}
        for nd in self.ops:
            if nd.getitem and nd.ins and isinstance(nd.args[1], int) and nd.ins[0] in by_i:
                self.items.setdefault(nd.ins[0], {})[nd.args[1]] = nd.i
        outs = self.outputs if isinstance(self.outputs, (list, tuple)) else (self.outputs,)
        for o in outs:
            name = None
            if isinstance(o, _Ref):
                nd = by_i.get(o.i)
                if nd is not None and nd.getitem and nd.ins and isinstance(nd.args[1], int):
                    name = f"{by_i[nd.ins[0]].name if nd.ins[0] in by_i else nd.name}[{nd.args[1]}]"
                elif nd is not None:
                    name = nd.name
                else:
                    name = next((n.name for n in nodes if index[n] == o.i), None)
            self.out_names.append(name)
        if kind != "backward":
            for nd in self.ops:
                if nd.seq is not None and not nd.getitem:
                    seq_map.setdefault(nd.seq, (nd.module, nd.source))
        self.n_ops = sum(1 for nd in self.ops if not nd.getitem and nd.tensor_out)
        self.params = (f"{region.backend}, {kind} graph, {self.n_ops} ops, "
                       f"compile id {region.compile_id}")
        self.probe_fn = None
        self.probe_failed = None

    def _site(self, n, kind, seq_map):
        """(module path, source) of one FX node. A backward op takes its forward op's (the
        forward op with its autograd sequence number), as eager backward ops do."""
        meta = n.meta
        stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
        module = _last_module(stack) if stack else None
        fwd = seq_map.get(_seq_nr(meta))
        if kind == "backward" and fwd is not None:
            return (module if module is not None else fwd[0]), fwd[1]
        source = self.region.source_of(meta)
        if fwd is not None:
            module = module if module is not None else fwd[0]
            source = source if source is not None else fwd[1]
        return module, source


class _Region:
    """One Dynamo graph compiled by an AOT-autograd backend: its name, backend, the
    stack traces of its nodes, and the forward ops by autograd sequence number (for the
    backward graph compiled later)."""

    def __init__(self, rec, mod, fw_compiler):
        self.rec = rec
        gm = getattr(mod, "gm", mod)
        self.traces = {}
        for n in getattr(getattr(gm, "graph", None), "nodes", ()):
            st = n.meta.get("stack_trace")
            if st:
                self.traces[n.name] = st
        self.compile_id = str(getattr(gm, "meta", {}).get("dynamo_compile_id", "?"))
        self.name = rec.frame_name() or "graph"
        self.backend = _backend_name(fw_compiler)
        self.seq_map = {}
        self.fw_events = {}   # forward call event -> (module path, source), for its backward
        self._sources = {}

    def source_of(self, meta):
        st = meta.get("stack_trace")
        if not st:
            todo = list(meta.get("from_node") or ())
            seen = 0
            while todo and seen < 64:
                ns = todo.pop(0)
                seen += 1
                st = self.traces.get(getattr(ns, "name", None))
                if st:
                    break
                todo.extend(getattr(ns, "from_node", None) or ())
        if not st:
            return None
        hit = self._sources.get(st)
        if hit is None:
            hit = self._sources[st] = self.rec.user_line(st) or ""
        return hit or None

    def compiler(self, inner, kind):
        rec = self.rec

        def compile_graph(gm, example_inputs):
            prog = None
            try:
                prog = _Program(self, gm, kind)
            except Exception as exc:  # never break compilation: the graph runs unrecorded
                rec.note_error(f"{self.name} {kind}: {type(exc).__name__}: {str(exc)[:200]}")
            with rec.passthrough():
                compiled = inner(gm, example_inputs)
            if prog is None:
                return compiled
            rec.note_graph(prog)
            return rec.runtime(prog, compiled)

        compile_graph.__name__ = getattr(inner, "__name__", "compile_graph")
        return compile_graph


def _backend_name(fw_compiler):
    fn = getattr(fw_compiler, "compiler_fn", fw_compiler)
    while isinstance(fn, functools.partial):
        fn = fn.func
    mod = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__name__", type(fn).__name__)
    if mod.startswith("torch._inductor"):
        return "inductor"
    if name in ("nop", "boxed_nop") or mod.startswith("functorch") or mod.startswith("torch._functorch"):
        return "aot_eager"
    return f"{mod}.{name}".strip(".")
