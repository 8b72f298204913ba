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

Here: `CompileRecorder`'s hooks (torch.compile, Dynamo, AOT autograd), its bookkeeping
and manifest. The graphs' copies are in `compiled_graphs.py`, each call's recording and
replay in `compiled_calls.py`, the probe in `compiled_probe.py`.
"""

import functools
import inspect
import re
import sys
import threading

from .. import ImportWatcher
from ..optim_settings import label as setting_label
from ..skipped import kind, name as key_name, text
from . import loaded
from .compiled_calls import _CompiledCalls
from .compiled_graphs import _Region
from .compiled_probe import _Probe
from .opinfo import _PLAIN, _plain_repr


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


class CompileRecorder(_CompiledCalls, _Probe):
    """Records compiled graphs for one `TorchCapture` (see the module docstring)."""

    def __init__(self, cap):
        import torch

        loaded.torch = torch
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
        torch = loaded.torch
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
            self.note_error(f"torch.compile not recorded: torch {loaded.torch.__version__}: "
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
        """The settings of a `torch.compile` call, for the manifest. One that cannot be
        formatted (an option whose repr raises) is shown by its type and counted in the
        capture's `skipped_settings`: this runs inside the script's `torch.compile` call,
        which it must never fail (issue 66: the recorded script died there)."""
        skipped = self.cap.skipped_settings

        def shown(where, v):
            try:
                return (_plain_repr(v) if isinstance(v, _PLAIN) else repr(v))[:80]
            except Exception as exc:
                skipped.add(f"torch.compile {where}", exc)
                return f"<{kind(v)}>"

        try:
            backend = kwargs.get("backend", "inductor")
            if not isinstance(backend, str):
                backend = text(getattr(backend, "__name__", None)) or kind(backend)
            plain = {k: kwargs.get(k) for k in ("mode", "dynamic")}
            entry = {"backend": text(backend), **{k: v if type(v) in _PLAIN else shown(k, v)
                                                  for k, v in plain.items()},
                     "fullgraph": bool(kwargs.get("fullgraph", False)), "options": {}}
            for k, v in list((kwargs.get("options") or {}).items()):
                try:
                    key = setting_label(k)
                except Exception as exc:
                    skipped.add(f"torch.compile option {key_name(k)}", exc)
                    continue
                entry["options"][key] = shown(f"option {key}", v)
        except Exception as exc:
            self.note_error(f"torch.compile settings not recorded: {kind(exc)}")
            return
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
                try:   # a value set by the script, whose repr may raise: by its type
                    vals[key] = obj if isinstance(obj, (bool, int, float, str, type(None))) \
                        else repr(obj)[:80]
                except Exception as exc:
                    self.cap.skipped_settings.add(f"{label} config {key}", exc)
                    vals[key] = f"<{kind(obj)}>"
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
