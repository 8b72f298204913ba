"""PyTorch capture: every aten op (forward, backward, optimizer) and every optimizer step.

Supported torch: >= 2.1, by reading (global optimizer step hooks and module forward
hooks with `always_call`); only 2.13.0+cpu has been run. `install()` checks that the
private APIs used (`torch._C._current_autograd_node`, `torch.autograd._get_sequence_nr`,
`torch._C._DisableTorchDispatch`) and the hooks exist, and raises a clear error naming
the torch version if one is missing.

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
import sys
import sysconfig
import threading
import weakref

import numpy as np

from .. import Capture, optim_settings
from ..budget import HEADROOM, get_limit, set_limit
from ...trace import schema
from ...trace.sources import LIB_SEP
from . import device

SUPPORTED = "torch >= 2.1 (tested 2.13)"

_UNINIT_OPS = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                         "aten::new_empty_strided", "aten::empty_permuted"})
# outputs of custom ops that are (partly) uninitialised memory: FSDP2's all-gather buffer,
# of which the op fills only this rank's part (the all-gather after it fills the rest)
_UNINIT_OUTPUTS = {"fsdp::all_gather_copy_in": frozenset({1})}
_FUNCOL = "_c10d_functional::"
_FUNCOL_DONE = frozenset({"_c10d_functional::wait_tensor"})


class _Every:
    def __contains__(self, slot):
        return True


_EVERY_SLOT = _Every()
_SCALAR_TYPES = (bool, int, float, complex)
_SKIP_FILE_PREFIXES = ("<frozen", "<string>")
_PLUMBING = ("_ops.py", "overrides.py", "utils/_python_dispatch.py", "utils/_contextlib.py",
             "_compile.py", "utils/_device.py", "_dynamo/eval_frame.py", "_dynamo/external_utils.py")
_MAX_PARAM = 48
_MAX_PARAMS = 160

_torch = None  # the torch module, set at install (this module never imports torch itself)

# Captures installed in this process; a forked child (DataLoader worker) marks them all
# so that it never writes the parent's file. One fork hook for the process, however many
# recordings it makes (os.register_at_fork hooks cannot be removed).
_live_captures = weakref.WeakSet()


def _after_fork_in_child():
    for cap in list(_live_captures):
        cap.forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


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


def _flat(xs, out):
    """Append the tensors of xs (args tuple, kwargs values, nested one level) to out."""
    Tensor = _torch.Tensor
    for x in xs:
        if isinstance(x, Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, Tensor):
                    out.append(y)
    return out


def _tensor_like(a):
    """A tensor, None, or a list of tensors: dataflow, not a parameter."""
    if isinstance(a, _torch.Tensor) or a is None:
        return True
    return isinstance(a, (list, tuple)) and bool(a) and isinstance(a[0], _torch.Tensor)


def _short_repr(v):
    """repr of a plain argument (numbers, strings, dtypes, devices, lists of those);
    other objects (storages, script objects) are named by type only: their repr can be
    huge or hold an address."""
    if isinstance(v, (list, tuple)):
        if len(v) > 8 or not all(isinstance(x, _PLAIN) for x in v):
            return f"<{type(v).__name__} of {len(v)}>"
    elif not isinstance(v, _PLAIN + _torch_plain_types()):
        return f"<{type(v).__name__}>"
    r = repr(v)
    return r if len(r) <= _MAX_PARAM else r[:_MAX_PARAM - 3] + "..."


_PLAIN = (bool, int, float, complex, str, type(None))
# the hot path's globals, looked up once (module attributes cost a lookup each)
_wref = weakref.ref
_get_ident = threading.get_ident
_FW_TORCH, _KIND_OP, _ORIGIN_EAGER = schema.FW_TORCH, schema.KIND_OP, schema.ORIGIN_EAGER
_KEY_T = object()   # stands for a tensor in `_params_cached`'s keys
_MISS = object()
_TORCH_PLAIN = None


def _torch_plain_types():
    global _TORCH_PLAIN
    if _TORCH_PLAIN is None:
        _TORCH_PLAIN = (_torch.dtype, _torch.device, _torch.memory_format, _torch.layout)
    return _TORCH_PLAIN


class _OpInfo:
    """Per-aten-overload facts computed once: name, argument names, writes, uninit."""

    __slots__ = ("name", "arg_names", "write_pos", "write_kw", "uninit", "skip", "collective",
                 "view", "func", "call", "uninit_slots", "optional_tensors")

    def __init__(self, func):
        self.func = func   # held: the recorder's cache is keyed by id(func)
        # what `func(*args)` calls: a plain OpOverload's __call__ is one Python frame
        # around its C++ `_op`, called directly (a subclass keeps its own __call__)
        op_cls = getattr(getattr(_torch, "_ops", None), "OpOverload", None)
        direct = getattr(func, "_op", None)
        self.call = direct if (direct is not None and op_cls is not None and
                               type(func).__call__ is op_cls.__call__) else func
        sch = func._schema
        self.name = sch.name if func._overloadname == "default" else f"{sch.name}.{func._overloadname}"
        self.arg_names = [a.name for a in sch.arguments]
        # `Tensor?` arguments: one passed as None is a parameter (`bias=None`), so that a
        # replay knows which optional tensor the recorded inputs leave out
        self.optional_tensors = frozenset(
            a.name for a in sch.arguments
            if str(a.type) in ("Tensor?", "Optional[Tensor]"))
        self.write_pos, self.write_kw = [], []
        for i, a in enumerate(sch.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                (self.write_kw if a.kwarg_only else self.write_pos).append((i, a.name))
        self.uninit = sch.name in _UNINIT_OPS
        self.uninit_slots = _UNINIT_OUTPUTS.get(sch.name)
        if sch.name.startswith(_FUNCOL) and sch.name not in _FUNCOL_DONE:
            # a functional collective's result is defined only once `wait_tensor` returns
            # (recorded as its own op, with the received value): never compared before
            self.uninit_slots = _EVERY_SLOT
        # a view (as_strided, slice, view...) of uninitialised memory is uninitialised too
        # (DDP carves its gradient buckets out of an `empty` this way)
        self.view = any(r.alias_info is not None and not r.alias_info.is_write
                        for r in sch.returns)
        # record_function brackets (profiler::) carry no numbers and an object address.
        self.skip = sch.name.startswith("profiler::")
        self.collective = sch.name.startswith("c10d::")   # collectives.py records these


class TorchCapture(Capture):
    framework = "torch"
    trigger = "torch"

    def __init__(self):
        self.session = None
        self.installed = False
        self._handles = []

    # -- install / uninstall ----------------------------------------------------------------
    def install(self, session):
        global _torch
        import torch

        import torch.optim.optimizer as optim_mod

        _torch = torch
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
        tool_dirs = tuple(session.tool_dirs) + (os.path.dirname(os.path.abspath(__file__)),)
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

    def hook_optimizer(self, wrap):
        """(Re-)register the global optimizer step hooks, each passed through `wrap` when
        given: compiled.py wraps them in `torch._dynamo.disable`, so that a compiled
        `opt.step()` calls them eagerly (a graph break at the step's edges) instead of
        tracing them into its graph."""
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        for h in self._optim_hooks:
            h.remove()
        pre, post = self._optim_pre, self._optim_post
        if wrap is not None:
            pre_d, post_d = wrap(pre), wrap(post)
            cap, compiling = self, self._is_compiling

            # inside a `fullgraph=True` compile a graph break is an error: there the hooks
            # are traced as no-ops (that compiled step is not snapshotted)
            def pre(opt, args, kwargs):
                if cap.fullgraph_depth and compiling():
                    return None
                return pre_d(opt, args, kwargs)

            def post(opt, args, kwargs):
                if cap.fullgraph_depth and compiling():
                    return None
                return post_d(opt, args, kwargs)

        self._optim_hooks = [register_optimizer_step_pre_hook(pre),
                             register_optimizer_step_post_hook(post)]

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
            if self.mode_on and threading.get_ident() != self.thread:
                # closed from another thread (term_watch's, the process ends): the mode
                # stack is per thread, and ours is on the recorded thread's, not this one's
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

        torch = _torch
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
        if getattr(self, "failed", None):
            m["recording_error"] = self.failed
            m["recording_stopped_at_event"] = self.failed_at_event
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

    # -- module paths ---------------------------------------------------------------------
    def _mod_name(self, m):
        n = self.mod_names.get(m)
        if n is None:
            if not self.keep_resizable and _fsdp_possible():   # FSDP1 frees storages too
                self.keep_resizable = True
            if not self.mod_stack:
                self.roots.append(weakref.ref(m))
                for sub_name, sub in m.named_modules(remove_duplicate=False):
                    if sub not in self.mod_names:
                        self.mod_names[sub] = _strip_compiled(sub_name)
                n = self.mod_names[m]
            else:
                n = self.mod_names[m] = f"{self.mod_stack[-1]}.<{type(m).__name__}>".lstrip(".")
        return n

    def _mod_pre(self, module, args):
        # Dynamo traces global hooks into compiled graphs: they must add nothing there
        # (a compiled call names its ops from the graph's nn_module_stack instead).
        if self._is_compiling():
            return
        if threading.get_ident() == self.thread:
            self.mod_stack.append(self._mod_name(module))

    def _mod_post(self, module, args, output):
        if self._is_compiling():
            return
        if threading.get_ident() == self.thread and self.mod_stack:
            self.mod_stack.pop()

    def _param_names(self, force=False):
        """id(parameter) -> qualified name, over the root modules seen (cached per step;
        `force`: read again, as after FSDP2 swapped a module's parameters)."""
        key = (self.step, len(self.roots))
        if self._names_key == key and not force:
            return self._names
        names, named = {}, []
        for r in self.roots:
            root = r()
            if root is not None:
                for n, p in root.named_parameters(remove_duplicate=False):
                    n = _strip_compiled(n)
                    names.setdefault(id(p), n)
                    named.append((n, p))
        self.subclasses.note_params(named)
        self._names, self._names_key = names, key
        return names

    # -- source lines ---------------------------------------------------------------------
    def _source(self):
        """events.source of the op being recorded: the innermost frame of the user's code,
        as "LIB ← USER" when the op runs inside library code (torch.nn, transformers, a pip
        package: LIB is the innermost frame outside tracediff and Python's standard library;
        trace/sources.py); torch.nn's code called by a model library is named by that
        library's frame as USER (the line that says which layer, `Session.jax_site`).
        Each code object is classified once (`_code_entry`) and each instruction's
        "file:line" formatted once (`_sites`), so the walk costs a dict lookup or two per
        frame."""
        f = sys._getframe(2)
        kinds = self._code_kind
        sites = self._sites
        lib = model = None
        while f is not None:
            code = f.f_code
            c = id(code)
            e = kinds.get(c)
            if e is None:
                e = self._code_entry(code)
            if e[1]:
                site = sites.get((c, f.f_lasti))
                if site is None:
                    site = sites[(c, f.f_lasti)] = f"{e[2]}:{f.f_lineno}"
                k = e[1]
                if k == 2:
                    user = model or site
                    return user if lib is None else f"{lib}{LIB_SEP}{user}"
                if lib is None:
                    lib, in_framework = site, k == 1
                elif k == 3 and model is None and in_framework:
                    model = site   # transformers calling torch.nn
            f = f.f_back
        return f"{lib}{LIB_SEP}{model}" if model else lib

    def _code_entry(self, code):
        """(code, kind, short file name) of a code object, cached by id(code): a code
        object's own hash is recomputed on every lookup (it hashes its constants, nested
        code objects included: ~10 us for a module's code); the entry holds the code
        object, so its id cannot be reused while cached."""
        fn = code.co_filename
        k = self._kind(fn)
        short = None
        if k:
            short = self._short.get(fn)
            if short is None:
                short = self._short[fn] = self.session.short_path(fn)
        e = self._code_kind[id(code)] = (code, k, short)
        return e

    def _kind(self, fn):
        """0: a frame never named (tracediff, the standard library, <frozen ...>, torch's
        dispatch plumbing); 1: a framework's library code (torch, flax, ...); 3: other
        library code (transformers, a pip package); 2: the user's code."""
        if fn.startswith(self.tool_prefixes) or fn in self.plumbing or (
                fn.startswith(self.stdlib) and "-packages" not in fn):
            return 0
        if fn.startswith(self.torch_dir):
            return 1
        if not self.session.is_user_file(fn):
            return 1 if self.session.in_framework(fn) else 3
        return 2

    # -- values ---------------------------------------------------------------------------
    def _dtype_info(self, dtype):
        """(name, fast) for a torch dtype: fast if .numpy() holds it as is (cached)."""
        info = self._dtypes.get(dtype)
        if info is None:
            torch = _torch
            fast = not (dtype.is_complex or dtype == torch.bfloat16
                        or (dtype.itemsize == 1 and dtype.is_floating_point))
            info = self._dtypes[dtype] = (str(dtype)[6:], fast)
        return info

    def _store(self, eid, slot, t, uninit=False, name=None, role=schema.ROLE_OUT):
        """Write tensor t as value `slot` of event eid (caller holds the lock)."""
        if type(t) is not self._Tensor and self.subclasses.special(t):
            # a DTensor's local shard and placement, or another subclass's metadata
            self.subclasses.store(eid, slot, t, uninit, name, role)
            return
        dname, fast = self._dtype_info(t.dtype)
        if fast and not uninit and t.is_cpu and t.layout is self._strided:
            try:
                arr = (t.detach() if t.requires_grad else t).numpy() if not \
                    self.keep_resizable else _host_keeping_storage(t)
            except RuntimeError:  # a negative-bit view
                arr = _host_keeping_storage(t.detach().resolve_neg())
            if not arr.flags.c_contiguous:
                arr = _c_order(t, arr)
            self.writer.add_value(eid, slot, arr, role=role, name=name)
            return
        self._store_slow(eid, slot, t, dname, uninit, name, role)

    def _store_slow(self, eid, slot, t, dname, uninit, name, role):
        torch = _torch
        w = self.writer
        dtype = t.dtype
        if uninit:
            w.add_meta_value(eid, slot, dname, tuple(t.shape), role=role, name=name,
                             flags=schema.VFLAG_UNINIT)
            return
        if t.is_meta:
            w.add_meta_value(eid, slot, dname, tuple(t.shape), role=role, name=name)
            return
        t = t.detach()
        if t.layout != torch.strided:
            try:
                t = t.to_dense()
            except Exception:
                w.add_meta_value(eid, slot, dname, tuple(t.shape), role=role, name=name)
                return
        if not t.is_cpu:
            names = device.storage_name(torch, dtype)
            if names is not None:   # read back in batches, never one op at a time
                if self._device_batch is None:
                    self._device_batch = device.DeviceBatch(w, torch)
                self._device_batch.add(eid, slot, t, names[0], names[1], role, name)
                return
            t = t.cpu()
        logical = None
        if dtype.is_complex:
            t = t.resolve_conj().resolve_neg()
            if dtype == torch.complex32:
                t = t.to(torch.complex64)
        elif dtype == torch.bfloat16:
            t, logical = t.view(torch.int16), "bfloat16"
        elif dtype.itemsize == 1 and dtype.is_floating_point:
            t, logical = t.view(torch.uint8), dname
        else:
            t = t.resolve_neg()
        w.add_value(eid, slot, t.numpy() if not self.keep_resizable else _host_keeping_storage(t),
                    role=role, name=name, logical_dtype=logical)

    # -- dataflow -------------------------------------------------------------------------
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

    # -- the op hook ----------------------------------------------------------------------
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
        try:
            self._after(info, node, seq_now, src, mod, refs, args, kwargs, out, simple)
        except Exception as exc:
            self._fail(exc)
        return out

    def _fail(self, exc):
        self.failed = f"{type(exc).__name__}: {exc}"[:500]
        self.failed_at_event = self.writer.n_events
        print(f"tracediff: torch capture stopped at event {self.failed_at_event}: {self.failed}",
              file=sys.stderr)

    def _after(self, info, node, seq_now, src, mod, refs, args, kwargs, out, simple=False):
        """Write the op's event, input links and output values."""
        Tensor = _torch.Tensor
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

    def _params_cached(self, info, args, kwargs):
        """`_params`, memoised per op and non-tensor argument values (bounded)."""
        Tensor = _torch.Tensor
        try:
            key = (info, tuple([_KEY_T if isinstance(a, Tensor) else
                                (tuple([_KEY_T if isinstance(y, Tensor) else y for y in a])
                                 if isinstance(a, (list, tuple)) else a) for a in args]),
                   tuple([(k, _KEY_T if isinstance(v, Tensor) else v)
                          for k, v in kwargs.items()]) if kwargs else None)
            hit = self._pcache.get(key, _MISS)
        except Exception:   # an unhashable argument (or one without a plain ==): no cache
            return self._params(info, args, kwargs)
        if hit is _MISS:
            hit = self._params(info, args, kwargs)
            if len(self._pcache) < 50_000:
                self._pcache[key] = hit
        return hit

    def _params(self, info, args, kwargs):
        """Short deterministic summary of the non-tensor arguments."""
        names = info.arg_names
        none = info.optional_tensors
        parts = [f"{names[i] if i < len(names) else i}={_short_repr(a)}"
                 for i, a in enumerate(args)
                 if not _tensor_like(a) or (a is None and i < len(names) and names[i] in none)]
        if kwargs:
            parts += [f"{k}={_short_repr(a)}" for k, a in kwargs.items()
                      if k != "pin_memory" and (not _tensor_like(a) or (a is None and k in none))]
        if not parts:
            return None
        s = ", ".join(parts)
        return s if len(s) <= _MAX_PARAMS else s[:_MAX_PARAMS - 3] + "..."

    # -- emitter API (used by compiled.py for compiled calls and their replay) ------------
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
        if not isinstance(t, _torch.Tensor):
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

    # -- optimizer ------------------------------------------------------------------------
    def _optim_pre(self, opt, args, kwargs):
        if not self.forked and threading.get_ident() == self.thread:
            self.phase = schema.PHASE_OPTIM

    def _optim_post(self, opt, args, kwargs):
        if self.forked or self.failed or threading.get_ident() != self.thread or self.writer.closed:
            return
        if self._in_window():
            try:
                self._snapshot_optimizer(opt)
            except Exception as exc:
                self._fail(exc)
        self.step += 1
        self.phase = schema.PHASE_FWD
        self._prune()
        self._update_window()

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

    def _snapshot_optimizer(self, opt):
        torch = _torch
        names = self._param_names()
        if any(id(p) not in names for g in opt.param_groups for p in g["params"]):
            names = self._param_names(force=True)   # parameters swapped since (FSDP2)
        hyper = []
        for g, group in enumerate(opt.param_groups):
            for k in ("lr", "betas", "eps", "weight_decay", "momentum"):
                if k in group and not isinstance(group[k], torch.Tensor):
                    hyper.append(f"{k}={_short_repr(group[k])}" if g == 0 else f"g{g}.{k}={_short_repr(group[k])}")
        with self.lock, torch._C._DisableTorchDispatch(), torch.no_grad():
            eid = self.writer.add_event(framework=schema.FW_TORCH, kind=schema.KIND_OPTIM,
                                        op=f"optim:{type(opt).__name__}", phase=schema.PHASE_OPTIM,
                                        origin=schema.ORIGIN_SNAPSHOT, params=", ".join(hyper)[:_MAX_PARAMS] or None,
                                        step=self.step)
            for row in optim_settings.torch_groups(opt.param_groups):
                self.writer.add_optim_setting(eid, *row)
            slot = 0
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    n = names.get(id(p), f"group{g}.param{i}")
                    self._store(eid, slot, p, name=f"params/{n}")
                    slot += 1
                    if p.grad is not None:
                        self._store(eid, slot, p.grad, name=f"grads/{n}")
                        slot += 1
                    for k, v in opt.state.get(p, {}).items():
                        if isinstance(v, torch.Tensor):
                            self._store(eid, slot, v, name=f"state/{n}/{k}")
                        elif isinstance(v, _SCALAR_TYPES):
                            self.writer.add_value(eid, slot, np.asarray(v), name=f"state/{n}/{k}",
                                                  flags=schema.VFLAG_SCALAR)
                        else:
                            continue
                        slot += 1


def _c_order(t, arr):
    """The C-order host copy of a non-contiguous CPU tensor (a transposed weight, a
    permuted view) that the hash and the stored bytes need: torch's blocked copy, ~4x
    faster than numpy's element-order `ascontiguousarray` on a transposed 4096x4096
    float32 matrix (72 vs 293 ms here; benchmarks/stats_floor.py's MLP has nine a step).
    Small values keep numpy's copy (no torch call)."""
    if arr.size < 65536:
        return np.ascontiguousarray(arr)
    with _torch._C._DisableTorchDispatch(), _torch.no_grad():
        return t.detach().contiguous().numpy()


def _host_keeping_storage(t):
    """A host array of CPU tensor t that leaves its storage resizable: `.numpy()` marks a
    storage not resizable for good, and FSDP frees and re-allocates its all-gather buffers
    with `storage.resize_` (`keep_resizable`). Through DLPack (no mark), else a copy."""
    if type(t).__torch_dispatch__ is not _torch.Tensor.__torch_dispatch__:
        raise TypeError("a tensor subclass")   # DLPack would read a wrapper's empty storage
    t = t.detach()
    try:
        return np.from_dlpack(t)
    except (RuntimeError, TypeError, BufferError, ValueError):
        return t.clone().numpy()


def _own_dispatch(types):
    """Does one of these tensor subclasses dispatch ops itself (DTensor, another wrapper)?
    nn.Parameter and nn.Buffer are listed in `types` too (every op on a parameter), but
    their `__torch_dispatch__` is torch's disabled one: plain tensors underneath."""
    disabled = _torch._C._disabled_torch_dispatch_impl
    return any(getattr(tp, "__torch_dispatch__", None) is not disabled for tp in types)


def _fsdp_possible():
    """Can FSDP1 be freeing storages (`keep_resizable`)? Only with FSDP imported and a
    process group up: FSDP needs one. Imported alone is no sign of use: torch._dynamo
    imports FSDP (an optimizer's first step does), so does HF transformers, and reading
    values through DLPack and checking each input's storage cost ~12 % of a tiny-op loop."""
    if "torch.distributed.fsdp" not in sys.modules:
        return False
    dist = _torch.distributed
    return dist.is_available() and dist.is_initialized()


def _strip_compiled(name):
    """`_orig_mod.fc1` -> `fc1`: a module wrapped by `torch.compile(module)` is named as in
    an eager run, so eager and compiled traces share module paths and parameter names."""
    if name == "_orig_mod":
        return ""
    return name.replace("_orig_mod.", "")


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
