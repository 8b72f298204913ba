"""PyTorch capture: every aten op (forward, backward, optimizer) and every optimizer step.

Supported torch: >= 2.1, by reading (global optimizer step hooks and module forward
hooks with `always_call`); only 2.13.0+cpu has been run. `install()` checks that the
private APIs used (`torch._C._current_autograd_node`, `torch.autograd._get_sequence_nr`,
`torch._C._DisableTorchDispatch`) and the hooks exist, and raises a clear error naming
the torch version if one is missing.

`TorchCapture` (here: install, the --steps window, uninstall, the manifest) is assembled
from one mixin per concern, each in its own module: `dispatch.py` (the dispatch mode and
the per-op hot path), `dataflow.py` (producers and `<input>` snapshots), `values.py` (a
tensor written as a value), `opinfo.py` (facts about an aten overload, `params`),
`modules.py` (module paths, parameter names), `sources.py` (source lines), `optimizer.py`
(step hooks and snapshots) and `emitter.py` (the API its helpers record through:
`compiled.py`, `collectives.py`, `subclass.py`, `autocast.py`).

Design (see the design notes, torch-capture-notes.md, for the measurements behind it):

- One `TorchDispatchMode`, entered on the thread that installs the capture (the main
  thread), sees every aten op after autograd and CompositeImplicit decomposition:
  forward ops, the autograd engine's backward ops (CPU backward runs on the calling
  thread) and the optimizer's ops. Each op is one `KIND_OP` event whose values are
  all its output tensors, stored exactly (bf16 as int16 bits, float8 as uint8 bits,
  conj/neg views resolved, sparse densified). Outputs of `empty*` are uninitialised
  memory: metadata with `VFLAG_UNINIT`, never stored. `.item()` (aten
  `_local_scalar_dense`) stores its Python scalar with `VFLAG_SCALAR`. Ops that return
  None but write their arguments (`_foreach_*_`, `_fused_adam_`) have the schema's
  `is_write` arguments as outputs.
- Backward ops: `torch._C._current_autograd_node()` names the node (`node` column:
  `DotBackward0`, `AccumulateGrad`); the forward op that created it is found through
  autograd sequence numbers (`torch.autograd._get_sequence_nr()` read on entry of
  each forward op; the window since the previous op holds the nodes this op's autograd
  kernel created), keyed by (thread, seq). `parent` is that forward op's event id and
  the backward op inherits its module path and source line. `AccumulateGrad` ops take
  the module path of the parameter they accumulate into and `param=<name>` in params.
- The `node` column of forward and optimizer ops is empty; it only ever holds autograd
  node names. (No TorchFunctionMode API bracketing is done: it is optional and costs
  about 1.3x; the module path usually names the API-level unit.)
- Module path (`name_stack`): global module forward pre/post hooks keep a stack of
  qualified names; a root module names its subtree once with `named_modules()`.
- Source: a cheap `sys._getframe` walk to the first frame outside torch, tracediff and
  Python's standard library (runpy, importlib, multiprocessing...), with a
  per-code-object cache, shortened with `session.short_path()`.
- Dataflow: `add_input` for every tensor input (flattened, in argument order), linked
  to the producing event and output slot. No strong references are kept to the
  program's tensors (that would change what autograd does): `id -> (weakref, event,
  slot, _version)`, with `_version` read lazily at the next op (it is bumped after the
  Python dispatch key returns). A tensor with no live producer entry, or whose version
  moved (written through another alias), is looked up by storage `data_ptr` (last
  writer): if the last writer's output is alive and has the same geometry it is the
  producer; otherwise the tensor is snapshotted once as a `KIND_INPUT` `<input>` event
  (`parent` = the last writer, if any), so every input has a producer with a value.
- Optimizer: global `register_optimizer_step_pre_hook`/`post_hook`. Ops between them
  are `PHASE_OPTIM`; the post hook writes one `KIND_OPTIM` event (`optim:Adam`) with
  values named `params/<name>`, `grads/<name>`, `state/<name>/<key>` (names from the
  seen root modules' `named_parameters()`, else `group{g}.param{i}`), copied with
  dispatch recording disabled, then increments the step counter (`step` column =
  optimizer steps completed before the event; with two optimizers, two per iteration).
  `record_function` brackets (`profiler::` ops) are not recorded.
- Threads: NOT captured. The dispatch mode stack is thread-local, so aten ops run in
  other Python threads are not recorded; the manifest says so (`threads_captured`).
- Forked DataLoader workers inherit the mode and hooks but never write (a flag set by
  `os.register_at_fork` in the child); batches reach the main process through the
  ops that rebuild them from shared memory (`empty` + `set_`), whose outputs are stored.
- Robustness: an exception inside the recorder stops recording (one line on stderr,
  `recording_error` in the manifest); the script's op still runs and returns normally.
- torch.compile: recorded faithfully by `compiled.py` (shadow mode: the compiled
  graphs run for real, their aten graphs are replayed op by op). The dispatch mode says
  `ignore_compile_internals`, so Dynamo compiles under it instead of falling back to
  eager; ops run inside a compiled call pass through unrecorded (`compiled_depth`), and
  the module hooks do nothing while Dynamo traces them (`torch.compiler.is_compiling()`),
  so the compiled graphs are those of an unrecorded run.
- Cost: no pytree in the hot path (hand-written flatten), values go straight into the
  writer's buffered byte arena; the runner raises the GC threshold. Per op, the mode's
  one entry frame skips Dynamo's disable wrapper while no eval-frame callback is set
  (`_dispatch_entry`), a plain OpOverload runs through its C++ `_op`, op facts and
  code objects are cached by id (their own hashes are Python code, or hash every
  constant), "file:line" strings are formatted once per instruction, and known
  inputs' producers are resolved inline (benchmarks/dispatch_floor.py --levels).
"""

import os
import sysconfig
import threading
import weakref

from .. import Capture, skipped
from ...trace import schema
from . import loaded
from .dataflow import _Dataflow
from .dispatch import _Dispatch, _make_mode
from .emitter import _EmitterAPI
from .substitute import Substitutions
from .modules import _ModulePaths
from .opinfo import _OpParams
from .optimizer import _OptimizerSteps
from .sources import _PLUMBING, _SKIP_FILE_PREFIXES, _SourceLines
from .values import _Values

SUPPORTED = "torch >= 2.1 (tested 2.13)"


# Captures installed in this process; a forked child (DataLoader worker) marks them all
# so that it never writes the parent's file. One fork hook for the process, however many
# recordings it makes (os.register_at_fork hooks cannot be removed).
_live_captures = weakref.WeakSet()


def _after_fork_in_child():
    for cap in list(_live_captures):
        cap.forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


class TorchCapture(_Dispatch, _Dataflow, _Values, _OpParams, _ModulePaths, _SourceLines,
                   _OptimizerSteps, _EmitterAPI, Capture):
    framework = "torch"
    trigger = "torch"

    def __init__(self):
        self.session = None
        self.installed = False
        self._handles = []

    # -- install / uninstall ----------------------------------------------------------------
    def install(self, session):
        import torch

        import torch.optim.optimizer as optim_mod

        loaded.torch = torch
        missing = [name for name, ok in (
            ("torch._C._current_autograd_node", hasattr(torch._C, "_current_autograd_node")),
            ("torch.autograd._get_sequence_nr", hasattr(torch.autograd, "_get_sequence_nr")),
            ("torch._C._DisableTorchDispatch", hasattr(torch._C, "_DisableTorchDispatch")),
            ("torch.optim.optimizer.register_optimizer_step_post_hook",
             hasattr(optim_mod, "register_optimizer_step_post_hook")),
        ) if not ok]
        if missing:
            raise RuntimeError(f"tracediff torch capture needs {SUPPORTED}; torch {torch.__version__} "
                               f"lacks {', '.join(missing)}")
        from torch.nn.modules.module import (register_module_forward_hook,
                                             register_module_forward_pre_hook)

        self.session = session
        self.writer = session.writer
        from . import stats

        # statistics (--level stats) with torch's own ops, on the values' device
        self.writer.stats_reducer = stats.segment_stats
        self.writer.stats_backend = "torch"
        self.lock = session.lock
        # capture/ (this package's parent): never an op's source, as before the move
        tool_dirs = tuple(session.tool_dirs) + (
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)
        # Python's own library is skipped too: a DataLoader batch is attributed to the
        # script's `for ... in loader` line, not to multiprocessing/queues.py.
        self.stdlib = sysconfig.get_paths()["stdlib"] + os.sep
        self.torch_dir = os.path.dirname(torch.__file__) + os.sep
        self.skip_prefixes = (self.torch_dir,) + tool_dirs + _SKIP_FILE_PREFIXES
        self.tool_prefixes = tool_dirs + _SKIP_FILE_PREFIXES
        # frames of torch that only route a call to its op: never an op's library frame
        self.plumbing = {os.path.join(self.torch_dir, *p.split("/")) for p in _PLUMBING}
        self.step = 0
        self.phase = schema.PHASE_FWD
        self.n_ops = 0
        self.n_inputs = 0
        self.n_fallback = 0
        # dataflow
        self.producer = {}       # id(tensor) -> (weakref, event, slot, version or None/-1)
        self.pending = []        # (id, weakref) of the last op's outputs, version read lazily
        self.last_writer = {}    # storage data_ptr -> (event, slot, weakref, uninit)
        # storage data_ptr -> (event, slot, shape, stride, offset, dtype) of the last op that
        # wrote it in place (an is_write argument): catches a write through another tensor
        # object that shares the storage but not the version counter (`p.data.normal_()`,
        # as HF's _init_weights does), which leaves p's own version and producer unchanged
        self.storage_writes = {}
        # autograd
        self.seq2fwd = {}        # (thread id, seq nr) -> (event, module path, source)
        self.last_seq = {}       # thread id -> sequence number after the previous forward op
        # modules
        self.mod_names = weakref.WeakKeyDictionary()
        self.roots = []
        self.mod_stack = []
        # caches
        self._opinfo = {}        # id(aten overload) -> _OpInfo (which holds the overload)
        self._dtypes = {}
        self._strided = torch.strided
        self._Tensor = torch.Tensor
        self.forked = False
        # FSDP (or DTensor) in use: values are read without marking their storage
        # unresizable (`_host_keeping_storage`); a few us more per value
        self.keep_resizable = False
        self.storage_of = {}     # id(tensor) -> its storage's data_ptr when produced (FSDP)
        self.failed = None
        self.failed_at_event = None
        # what could not be read or formatted, skipped (capture/skipped.py): the manifest's
        self.skipped_settings = skipped.settings()
        self.skipped_names = skipped.names()
        # confirm's counterfactual run: another run's values for some events (substitute.py)
        self.substitutions = Substitutions.from_env()
        self._seq_marks = []
        _live_captures.add(self)
        self._names, self._names_key = {}, None
        self._cur_source = None
        self._code_kind = {}     # id(code object) -> (code, _kind of its file, short name)
        self._sites = {}         # (id(code object), f_lasti) -> "short:line"
        self._short = {}
        self._ids = {}           # interned ids: node names, (op, params, module, source)
        self._pcache = {}        # (op info, non-tensor arguments) -> params summary
        self._device_batch = None  # accelerator values read back in batches (device.py)
        self._cur_node = torch._C._current_autograd_node
        self._get_seq = torch.autograd._get_sequence_nr

        try:
            self._handles = [register_module_forward_hook(self._mod_post, always_call=True)]
        except TypeError:
            raise RuntimeError(f"tracediff torch capture needs {SUPPORTED}; torch {torch.__version__} "
                               f"has no always_call module hooks") from None
        self._handles += [register_module_forward_pre_hook(self._mod_pre)]
        self._optim_hooks = []
        self.compiled_depth = 0  # >0 inside a compiled call: its ops pass through unrecorded
        self.fullgraph_depth = 0  # >0 inside a torch.compile(fullgraph=True) function
        # the raw outputs of the last compiled call, kept until the next op has looked up
        # its inputs: AOT autograd hands the program aliases of them (same storage and
        # geometry), found through `last_writer` only while the originals live
        self.hold = None
        self._is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or \
            (lambda: False)
        self.hook_optimizer(None)
        from .subclass import Subclasses

        self.subclasses = Subclasses(self, torch)
        self.mode = _make_mode(self)
        self.thread = threading.get_ident()
        # Levels and windows (RecordOptions): at `calls` level no op is recorded (only
        # optimizer-step snapshots); outside a --steps window the dispatch mode is not
        # even entered, so those steps run at full speed.
        opts = session.options
        self.opts = opts
        self.ops_level = getattr(opts, "level", "full") != "calls"
        self.filtered = bool(getattr(opts, "filtered", False))
        self.mode_on = False
        self._update_window()
        self.installed = True
        from .compiled import CompileRecorder

        self.compile = CompileRecorder(self)
        self.compile.install()
        from .collectives import Collectives

        self.collectives = Collectives(self, torch)
        from .autocast import AutocastLog

        self.autocast = AutocastLog(self, torch)

    def _in_window(self):
        o = self.opts
        return o.in_steps(self.step) if hasattr(o, "in_steps") else True

    def _update_window(self):
        """Enter the dispatch mode while the current step is recorded, leave it otherwise."""
        want = self.ops_level and self._in_window()
        if want and not self.mode_on:
            self.mode.__enter__()
            self.mode_on = True
            self.last_seq[self.thread] = self._get_seq()
        elif not want and self.mode_on:
            self.mode.__exit__(None, None, None)
            self.mode_on = False

    def uninstall(self):
        if not self.installed:
            return
        self.installed = False
        _live_captures.discard(self)
        for h in self._handles + self._optim_hooks:
            h.remove()
        self._handles, self._optim_hooks = [], []
        compile_rec = getattr(self, "compile", None)
        if compile_rec is not None:
            compile_rec.uninstall()
        if getattr(self, "autocast", None) is not None:
            self.autocast.uninstall()
        try:
            if self.mode_on and (threading.get_ident() != self.thread or
                                 getattr(self.session, "ends_now", False)):
                # closed from another thread (term_watch's, the process ends): the mode
                # stack is per thread, and ours is on the recorded thread's, not this one's;
                # or where SIGTERM found the script, which may be inside torch's dispatch
                # with our mode stashed off the stack: the process dies next either way
                self.mode_on = False
            elif self.mode_on:
                self.mode_on = False
                if self._mode_removed():
                    self.failed = self.failed or (
                        "the script removed tracediff's dispatch mode from torch's mode stack: "
                        "the ops it ran after that were not recorded")
                else:
                    self.mode.__exit__(None, None, None)
        finally:
            self.producer.clear()
            self.last_writer.clear()
            self.storage_writes.clear()
            self.storage_of.clear()
            self.pending = []

    def _mode_removed(self):
        """True when our dispatch mode is no longer on this thread's mode stack (a script
        or library popped it): capture stopped silently at that point."""
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
            return not any(m is self.mode for m in _get_current_dispatch_mode_stack())
        except Exception:   # a torch without the helper: nothing to tell
            return False

    def manifest(self):
        from ...trace import manifest as _manifest

        torch = loaded.torch
        if torch is None:
            return {}
        compile_rec = getattr(self, "compile", None)
        m = {"version": torch.__version__, "mode": "eager dispatch",
             "supported": SUPPORTED,
             "compile": compile_rec.manifest() if compile_rec is not None else {},
             "threads_captured": False,
             "threads_note": "aten ops run in Python threads other than the recording thread are "
                             "not recorded (the dispatch mode stack is thread-local)",
             "num_threads": torch.get_num_threads(),
             "num_interop_threads": torch.get_num_interop_threads(),
             "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
             "float32_matmul_precision": torch.get_float32_matmul_precision(),
             "optimizer_steps": getattr(self, "step", 0),
             "level": getattr(getattr(self, "opts", None), "level", "full"),
             "ops": getattr(self, "n_ops", 0),
             "input_snapshots": getattr(self, "n_inputs", 0),
             "producer_fallbacks": getattr(self, "n_fallback", 0),
             "statistics": "torch ops on the value's device (capture/torch/stats.py)"}
        if getattr(self, "collectives", None) is not None:
            m["collectives"] = self.collectives.manifest()
        if getattr(self, "autocast", None) is not None:
            m["autocast"] = self.autocast.manifest()
        if getattr(self, "subclasses", None) is not None:
            m["subclasses"] = self.subclasses.manifest()
        if getattr(self, "substitutions", None) is not None:
            m["substituted"] = self.substitutions.manifest()
        if getattr(self, "failed", None):
            m["recording_error"] = self.failed
            m["recording_stopped_at_event"] = self.failed_at_event
        for key in ("skipped_settings", "skipped_names"):
            got = getattr(self, key, None)
            if got:
                m[key] = got.manifest()
        for key, fn in (("config", lambda: torch.__config__.show()),
                        ("parallel_info", lambda: torch.__config__.parallel_info()),
                        ("cpu_capability", lambda: torch.backends.cpu.get_cpu_capability()),
                        ("cuda_matmul_allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                        ("cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                        ("cudnn_deterministic", lambda: torch.backends.cudnn.deterministic),
                        ("cuda_available", lambda: torch.cuda.is_available()),
                        ("mkldnn_enabled", lambda: torch.backends.mkldnn.enabled),
                        # aten ops whose kernel was replaced from Python (torch.library)
                        ("python_kernels", lambda: _manifest.dispatcher_overrides(torch)),
                        ("libraries", lambda: _manifest.torch_build_libraries(
                            torch.__config__.show()))):
            try:
                m[key] = fn()
            except Exception as exc:  # a missing backend must not lose the manifest
                m[key] = f"unavailable: {type(exc).__name__}"
        return m
