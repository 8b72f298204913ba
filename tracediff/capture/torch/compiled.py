"""torch.compile, recorded faithfully: shadow mode for compiled PyTorch graphs.

A recorder must not change the program's numbers. A dispatch mode that sees every op
would make Dynamo fall back to eager, so the torch capture's mode says
`ignore_compile_internals`: Dynamo compiles as in an unrecorded run, and the ops a
compiled artifact runs pass through the mode unrecorded (`compiled_depth`). What
happens inside compiled code is recorded here instead, the way JAX jit calls are:

- Hook (private, checked when Dynamo is imported): `torch._dynamo.backends.common.
  aot_module_simplified`, through which every AOT-autograd backend (inductor,
  aot_eager, ...) compiles a Dynamo graph. Its forward, backward and inference
  compilers are wrapped; each wrapper keeps a structural copy of the aten graph it is
  given (before the backend rewrites it in place) and returns the backend's compiled
  callable inside a recording wrapper. Wrapping the compilers also bypasses AOT
  autograd's own cache (it only serves serialisable compilers), so every graph reaches
  the wrapper; inductor's FX-graph cache still serves the same kernels.
- Each call of a compiled graph is a `call` event (origin `compiled`, op
  `compiled:<frame>` or `compiled:<frame>:backward`) whose outputs are the real
  outputs the program receives. Before the real call, its aten graph is replayed op by
  op from the real inputs (no grad, autocast off, every dispatch mode popped, the RNG
  state restored afterwards so the program's random stream is untouched; inputs the
  graph writes are cloned first); every replayed op is an `eqn` event (origin
  `replay`, `call`/`parent` = the call) with the module path from the FX node's
  `nn_module_stack`, the user's source line from the Dynamo graph's stack trace, the op
  it was decomposed from in `node` (`aten::native_layer_norm`), and dataflow links like
  JAX equations. Backward ops take the module and line of the forward op with the same
  autograd sequence number. Nothing replayed is returned to the program.
- `record --probe REGEX` (matched against the frame name): after the real call, an
  inductor graph's aten graph is compiled once more with every op's output as a graph
  output and run on clones of the call's inputs; the values are `probe:<frame>` call
  and `eqn` events (origin `probe`), which `locate` searches when every replayed op
  matches but the compiled outputs differ (fusion, reordered reductions).
- Compiled optimizer steps: the optimizer hooks are wrapped in `torch._dynamo.disable`
  (a graph break at the step's edges), so the step's snapshot is taken as in eager.
- `torch.compile(...)` is wrapped only to note its configuration (backend, mode,
  dynamic, fullgraph, options) for the manifest; inductor, functorch and Dynamo
  settings that affect numerics are read when a graph is compiled.

The consequence, as for JAX: the script's results are bitwise those of an unrecorded
compiled run; replayed values explain the call but can differ from what inductor's
fused kernels computed (`replay_vs_compiled` in the manifest measures by how much).
"""

import functools
import inspect
import operator
import re
import sys
import threading

from ...trace import schema
from .. import ImportWatcher

_torch = None

# inductor / functorch / dynamo settings that change the numbers of a compiled program
INDUCTOR_NUMERICS = ("fallback_random", "align_random_eager", "emulate_precision_casts",
                     "use_fast_math", "cpp.simdlen", "cpp.enable_floating_point_contract_flag",
                     "deterministic", "split_reductions", "max_autotune", "max_autotune_gemm",
                     "freezing", "cpp_wrapper", "epilogue_fusion", "aggressive_fusion",
                     "force_disable_caches")
FUNCTORCH_NUMERICS = ("functionalize_rng_ops", "donated_buffer", "activation_memory_budget")
DYNAMO_NUMERICS = ("assume_static_by_default", "automatic_dynamic_shapes", "capture_scalar_outputs",
                   "enable_dynamo_decompositions", "recompile_limit", "cache_size_limit")
MAX_GRAPH_NOTES = 50
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in ')


class _Ref:
    """A reference to the value of node `i` inside an argument template."""

    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


def _template(x, index):
    """Node arguments with every fx.Node replaced by a `_Ref` (a copy that later graph
    rewrites by the backend cannot change)."""
    fx = _torch.fx
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


def _same_bits(a, b):
    torch = _torch
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
    torch = _torch
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape or \
            not a.dtype.is_floating_point or a.numel() == 0:
        return 0.0
    x, y = a.detach().double(), b.detach().double()
    rel = (x - y).abs() / y.abs().clamp_min(torch.finfo(a.dtype).tiny)
    rel = rel[~torch.isnan(rel)]
    return float(rel.max()) if rel.numel() else 0.0


class _Node:
    """One op of a compiled graph, as replayed: target, argument template, metadata."""

    __slots__ = ("i", "name", "target", "args", "kwargs", "ins", "op", "orig", "module", "source",
                 "getitem", "tensor_out", "multi", "info", "seq")


class _Program:
    """A structural copy of one AOT graph (forward, backward or inference), made before
    the backend compiles (and rewrites) it; what replay and the probe run."""

    def __init__(self, region, gm, kind):
        torch = _torch
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
                        if pos < len(n.args) and isinstance(n.args[pos], _torch.fx.Node) and \
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


class CompileRecorder:
    """Records compiled graphs for one `TorchCapture` (see the module docstring)."""

    def __init__(self, cap):
        global _torch
        import torch

        _torch = torch
        self.cap = cap
        self.compiles = []
        self.regions = 0
        self.graph_notes = []
        self.calls = self.replayed = 0
        self.errors = []
        self.fidelity = {"calls_compared": 0, "calls_where_replay_differs": 0,
                         "max_rel_difference": 0.0, "examples": []}
        self.settings = None
        self.probe = None
        self.probe_stats = {"calls": 0, "ops": 0, "final_outputs_equal_compiled": 0,
                            "final_outputs_differ_from_compiled": 0, "errors": []}
        pattern = getattr(cap.opts, "probe", None)
        if pattern:
            self.probe = re.compile(pattern)
        self._undo = []
        self._watcher = None
        self._tl = threading.local()
        self.hooked = False

    # -- install ---------------------------------------------------------------------------
    def install(self):
        torch = _torch
        orig = torch.compile
        rec = self

        cap = self.cap

        @functools.wraps(orig)
        def compile(model=None, *args, **kwargs):
            if model is None:
                return orig(model, *args, **kwargs)
            rec._note_compile(kwargs)
            res = orig(model, *args, **kwargs)
            if not kwargs.get("fullgraph") or isinstance(model, torch.nn.Module) or not callable(res):
                return res

            @functools.wraps(res)
            def fullgraph_call(*a, **k):
                # the optimizer hooks must not break this graph (see hook_optimizer)
                cap.fullgraph_depth += 1
                try:
                    return res(*a, **k)
                finally:
                    cap.fullgraph_depth -= 1

            return fullgraph_call

        torch.compile = compile
        self._undo.append(lambda: setattr(torch, "compile", orig))
        import warnings

        # our global module hooks make torch.compile(module) warn; they are harmless to it
        # (they do nothing while Dynamo traces), so the script's stderr stays its own
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there "
                                r"are global hooks", category=UserWarning)
        flt = warnings.filters[0]
        self._undo.append(lambda: warnings.filters.remove(flt) if flt in warnings.filters else None)
        # Dynamo is imported by the first torch.compile (or by a library): hook it then,
        # each part once its module has finished importing (importing more from inside
        # Dynamo's own import would be circular)
        self._watcher = ImportWatcher({"torch._dynamo": self._hook_optimizer,
                                       "torch._dynamo.backends.common": self._hook_aot})
        self._watcher.install()

    def uninstall(self):
        if self._watcher is not None:
            self._watcher.uninstall()
            self._watcher = None
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                pass
        self._undo = []

    def _hook_optimizer(self):
        """A compiled `opt.step()` calls the optimizer hooks eagerly (graph breaks at the
        step's edges) instead of tracing them into its graph."""
        if not self.cap.installed:
            return
        try:
            disable = sys.modules["torch._dynamo"].disable
        except (KeyError, AttributeError) as exc:
            self.note_error(f"optimizer hooks not disabled for Dynamo: {type(exc).__name__}")
            return
        self.cap.hook_optimizer(disable)
        self._undo.append(lambda: self.cap.hook_optimizer(None) if self.cap.installed else None)

    def _hook_aot(self):
        """Wrap the entry point of AOT autograd's backends (see the module docstring)."""
        if self.hooked or not self.cap.installed:
            return
        try:
            common = sys.modules["torch._dynamo.backends.common"]
            orig = common.aot_module_simplified
            sig = inspect.signature(orig)
            for name in ("mod", "fw_compiler", "bw_compiler", "inference_compiler"):
                if name not in sig.parameters:
                    raise RuntimeError(f"aot_module_simplified has no {name}")
        except Exception as exc:
            self.note_error(f"torch.compile not recorded: torch {_torch.__version__}: "
                            f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        self.hooked = True
        common.aot_module_simplified = self._wrap_aot(orig, sig)
        self._undo.append(lambda: setattr(common, "aot_module_simplified", orig))

    def _wrap_aot(self, orig, sig):
        rec = self

        @functools.wraps(orig)
        def aot_module_simplified(*args, **kwargs):
            if getattr(rec._tl, "probing", False) or not rec.cap.installed or rec.cap.forked:
                return orig(*args, **kwargs)
            try:
                bound = sig.bind(*args, **kwargs)
                a = bound.arguments
                fw = a["fw_compiler"]
                bw = a.get("bw_compiler") or fw
                inf = a.get("inference_compiler") or fw
                region = _Region(rec, a["mod"], fw)
                a["fw_compiler"] = region.compiler(fw, "forward")
                a["bw_compiler"] = region.compiler(bw, "backward")
                a["inference_compiler"] = region.compiler(inf, "inference")
                rec.regions += 1
                rec._read_settings()
            except Exception as exc:
                rec.note_error(f"graph not recorded: {type(exc).__name__}: {str(exc)[:200]}")
                return orig(*args, **kwargs)
            cg = orig(*bound.args, **bound.kwargs)

            @functools.wraps(cg)
            def compiled_region(*a, **k):
                # AOT autograd's runtime plumbing around the compiled graphs is not the
                # program's own work: it runs unrecorded, the graphs are recorded
                with rec.passthrough():
                    return cg(*a, **k)

            return compiled_region

        return aot_module_simplified

    # -- bookkeeping -------------------------------------------------------------------------
    def passthrough(self):
        return _Passthrough(self.cap)

    def note_error(self, msg):
        if len(self.errors) < 50:
            self.errors.append(msg)

    def note_graph(self, prog):
        if len(self.graph_notes) < MAX_GRAPH_NOTES:
            self.graph_notes.append({"op": prog.op, "kind": prog.kind, "backend": prog.region.backend,
                                     "compile_id": prog.region.compile_id, "ops": prog.n_ops,
                                     "inputs": len(prog.placeholders)})

    def _note_compile(self, kwargs):
        backend = kwargs.get("backend", "inductor")
        if not isinstance(backend, str):
            backend = getattr(backend, "__name__", type(backend).__name__)
        entry = {"backend": backend, "mode": kwargs.get("mode"), "dynamic": kwargs.get("dynamic"),
                 "fullgraph": bool(kwargs.get("fullgraph", False)),
                 "options": {str(k): repr(v)[:80] for k, v in (kwargs.get("options") or {}).items()}}
        if entry not in self.compiles and len(self.compiles) < 20:
            self.compiles.append(entry)

    def _read_settings(self):
        """Inductor, functorch and Dynamo settings that affect numerics, as in force while
        the first graph compiles (torch.compile(mode=...) patches inductor's config then)."""
        settings = {}
        for label, modname, keys in (("inductor", "torch._inductor.config", INDUCTOR_NUMERICS),
                                     ("functorch", "torch._functorch.config", FUNCTORCH_NUMERICS),
                                     ("dynamo", "torch._dynamo.config", DYNAMO_NUMERICS)):
            mod = sys.modules.get(modname)
            if mod is None:
                continue
            vals = {}
            for key in keys:
                obj = mod
                try:
                    for part in key.split("."):
                        obj = getattr(obj, part)
                except AttributeError:
                    continue
                vals[key] = obj if isinstance(obj, (bool, int, float, str, type(None))) else repr(obj)[:80]
            settings[label] = vals
        if self.settings is None:
            self.settings = settings
        elif settings != self.settings:
            self.settings.setdefault("changed_later", settings)

    def frame_name(self):
        """The name of the function Dynamo is compiling (`forward`, `train_step`, or a
        resume function after a graph break)."""
        try:
            from torch._dynamo.symbolic_convert import InstructionTranslator

            tx = InstructionTranslator.current_tx()
            return tx.f_code.co_name
        except Exception:
            return None

    def user_line(self, stack_trace):
        """`file:line` of the innermost frame of an FX stack trace outside torch (the
        frame the eager recorder would name for the same op)."""
        cap = self.cap
        best = None
        for m in _FRAME.finditer(stack_trace):
            fn = m.group("file")
            if cap.source_file(fn):
                best = cap.short_source(fn, m.group("line"))
        return best

    def manifest(self):
        """`torch_compile_calls` and `settings` describe the environment (they are compared
        by locate); `stats` describes the recording."""
        stats = {"hooked": self.hooked, "dynamo_graphs": self.regions, "graphs": self.graph_notes,
                 "compiled_calls": self.calls, "replayed_ops": self.replayed,
                 "replay_vs_compiled": self.fidelity, "errors": self.errors}
        if self.probe is not None:
            stats["probe"] = dict(self.probe_stats, pattern=self.probe.pattern,
                                  note="probe values come from the graph compiled again by "
                                       "inductor with every op's output as a graph output; "
                                       "fusion may differ from the real program")
        return {"recorded_as": "shadow: compiled graphs run for real (their outputs are what the "
                               "script gets); their aten graphs are replayed op by op from the "
                               "real inputs",
                "torch_compile_calls": self.compiles, "settings": self.settings or {},
                "stats": stats}

    # -- runtime ---------------------------------------------------------------------------
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
        torch = _torch
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
            if r is None or c is None or not isinstance(c, _torch.Tensor):
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
        torch = _torch
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
        torch = _torch
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

    # -- probe -----------------------------------------------------------------------------
    def _probe(self, prog, ins, refs, eid, phase, ns, src, compiled):
        """Compile the graph again with every op's output as an output, run it on the
        call's inputs, record the values as a `probe:` call (see the module docstring)."""
        torch = _torch
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


def _flat1(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _flatten_out(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _build_probe(prog, example):
    """An inductor-compiled copy of `prog` returning (final outputs..., every op's output)."""
    torch = _torch
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


class _Passthrough:
    """Inside: ops reaching the dispatch mode are not recorded (compiled code, replay,
    compilation). Only on the recording thread (the dispatch mode is that thread's)."""

    __slots__ = ("cap", "mine")

    def __init__(self, cap):
        self.cap = cap
        self.mine = False

    def __enter__(self):
        self.mine = threading.get_ident() == getattr(self.cap, "thread", None)
        if self.mine:
            self.cap.compiled_depth += 1

    def __exit__(self, *exc):
        if self.mine:
            self.cap.compiled_depth -= 1
