"""Capture: one recorder per framework behind one small interface.

A `Capture` is installed when its framework is first loaded by the recorded script
(or at once if it already is; `ImportWatcher`: on the load, never on a lookup), writes events through the shared `Session`, and adds its
framework's configuration to the manifest when the run ends.
"""

import importlib.abc
import importlib.util
import os
import sys
import sysconfig
import threading

from ..trace import schema
from ..trace.sources import join_site

_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep

_SITE_MARKERS = ("site-packages" + os.sep, "dist-packages" + os.sep)
_install_dirs = ((), ())   # (sys.path it was read from, its folders that hold installs)


def _folders_with_installs():
    """The folders on sys.path that hold installed distributions (`*.dist-info`), with a
    trailing separator: where `pip install --target DIR` or a cluster's shared package
    folder put libraries outside any site-packages. (A project's own `*.egg-info`, left by
    an editable install, does not make its folder a library.) Read again when sys.path
    changes."""
    global _install_dirs
    path = tuple(sys.path)
    if _install_dirs[0] != path:
        found = []
        for entry in path:
            folder = os.path.abspath(entry or os.curdir)
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            if any(n.endswith(".dist-info") for n in names):
                found.append(folder.rstrip(os.sep) + os.sep)
        _install_dirs = (path, tuple(found))
    return _install_dirs[1]


def installed_package(filename):
    """The top-level package of a library file (the folder after site-packages,
    dist-packages or a folder on sys.path that holds installed distributions), or None
    for a file outside every such folder."""
    for marker in _SITE_MARKERS:
        i = filename.rfind(marker)
        if i >= 0:
            return filename[i + len(marker):].split(os.sep, 1)[0].split(".", 1)[0]
    for folder in _folders_with_installs():
        if filename.startswith(folder):
            return filename[len(folder):].split(os.sep, 1)[0].split(".", 1)[0]
    return None


LEVELS = ("full", "stats", "calls")


def parse_steps(text):
    """`30:40` (steps 30..39), `30:` (from 30 on), `:10`, `7` (step 7 alone) -> (start, stop)
    with stop None for open-ended; None for no window."""
    if text is None or str(text).strip() in ("", ":"):
        return None
    text = str(text).strip()
    try:
        if ":" in text:
            lo, hi = text.split(":", 1)
            start = int(lo) if lo.strip() else 0
            stop = int(hi) if hi.strip() else None
        else:
            start = int(text)
            stop = start + 1
    except ValueError:
        raise ValueError(f"invalid --steps {text!r} (use START:STOP, e.g. 30:40, or one step)") \
            from None
    if start < 0 or (stop is not None and stop <= start):
        raise ValueError(f"invalid --steps {text!r}: need 0 <= START < STOP")
    return start, stop


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
          "tib": 1 << 40}


def parse_size(text):
    """`500MB`, `2G`, `1.5GiB`, `1000000` -> bytes (binary units); None passes through."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return int(text)
    t = str(text).strip().lower().replace(" ", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = None
    if value is None or unit not in _UNITS or value < 0:
        raise ValueError(f"invalid size {text!r} (use e.g. 500MB, 2GB, 1000000)")
    return int(value * _UNITS[unit])


class RecordOptions:
    """What to record.

    `level`: full (every value's bytes), stats (per value: hash and statistics, no bytes)
    or calls (JAX: top-level jit calls' inputs/outputs and optimizer steps, no replay;
    torch: optimizer-step snapshots; hash and statistics). `loops`: opaque or stepped.
    Windows: `steps` ("30:40": only optimizer steps 30..39 are recorded at all), `ops`
    (regex on op names) and `modules` (glob(s) on module paths / name stacks, comma
    separated): events outside these are recorded without values (metadata only);
    `max_bytes`: past this many stored value bytes, values are kept as stats + hash.
    `probe` (JAX, regex on jit function names): also record those calls' compiled
    intermediates (capture/jax/probe.py) to narrow compiled-call divergences.
    `devices` (JAX, default on): shards and replicas of multi-device arrays and
    shard_map/pmap bodies per device (capture/jax/devices.py).
    `jax_values`: "replay" (every equation re-run op by op: faithful to each primitive)
    or "compiled" (each call's jaxpr compiled once with every intermediate as an output:
    fast, the values of a program XLA may fuse differently; docs/performance.md), or
    "auto" (default: compiled on an accelerator, replay on the CPU).
    `hash`: "auto" (words64 where JAX values are hashed on an accelerator, else
    xxh3_64), "xxh3_64" or "words64" (computable by XLA: CPU and TPU traces of one script
    then compare hash to hash; trace/values.py).
    `codec`: "none" or "zstd", compression of the stored value bytes (trace/codec.py)."""

    def __init__(self, level="full", loops="opaque", steps=None, ops=None, modules=None,
                 max_bytes=None, probe=None, devices=True, jax_values="auto", codec="none",
                 hash="auto"):
        from ..trace.codec import blob_filter

        blob_filter(codec)   # ValueError: unknown codec, or hdf5plugin missing
        self.codec = codec or "none"
        if jax_values not in ("auto", "replay", "compiled"):
            raise ValueError(f"unknown JAX values mode {jax_values!r} (choose auto, replay or "
                             f"compiled)")
        self.jax_values = jax_values
        if hash not in ("auto", "xxh3_64", "words64"):
            raise ValueError(f"unknown hash {hash!r} (choose auto, xxh3_64 or words64)")
        self.hash = hash
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r} (choose from {', '.join(LEVELS)})")
        if loops not in ("opaque", "stepped"):
            raise ValueError(f"unknown loop mode {loops!r}")
        self.level, self.loops = level, loops
        self.devices = bool(devices)   # JAX per-device capture (capture/jax/devices.py)
        self.steps = parse_steps(steps) if not isinstance(steps, tuple) else steps
        self.ops = ops or None
        self._ops_re = None
        if self.ops:
            import re

            try:
                self._ops_re = re.compile(self.ops)
            except re.error as exc:
                raise ValueError(f"invalid --ops regular expression {ops!r}: {exc}") from None
        self.probe = probe or None
        if self.probe:
            import re

            try:
                re.compile(self.probe)
            except re.error as exc:
                raise ValueError(f"invalid --probe regular expression {probe!r}: {exc}") from None
        self.modules = modules or None
        self._globs = tuple(g.strip() for g in self.modules.split(",") if g.strip()) \
            if self.modules else ()
        self.max_bytes = parse_size(max_bytes)
        self._selected = {}

    @property
    def filtered(self):
        """True when an --ops or --modules window restricts which events keep values."""
        return bool(self._ops_re is not None or self._globs)

    def in_steps(self, step):
        """Is optimizer step `step` inside the --steps window?"""
        w = self.steps
        return w is None or (step >= w[0] and (w[1] is None or step < w[1]))

    def past_steps(self, step):
        """True once `step` is past the end of the window (nothing more will be recorded)."""
        w = self.steps
        return w is not None and w[1] is not None and step >= w[1]

    def selected(self, op, module):
        """Do the --ops/--modules windows keep the values of an event (cached)?"""
        key = (op, module)
        hit = self._selected.get(key)
        if hit is None:
            import fnmatch

            hit = True
            if self._ops_re is not None:
                hit = bool(op) and self._ops_re.search(op) is not None
            if hit and self._globs:
                m = module or ""
                hit = any(fnmatch.fnmatchcase(m, g) for g in self._globs)
            if len(self._selected) < 100_000:
                self._selected[key] = hit
        return hit

    def steps_text(self):
        if self.steps is None:
            return None
        start, stop = self.steps
        return f"{start}:{'' if stop is None else stop}"

    def as_dict(self):
        from ..trace.values import HASH_NAME

        return {"level": self.level, "loops": self.loops, "steps": self.steps_text(),
                "ops": self.ops, "modules": self.modules, "max_bytes": self.max_bytes,
                "probe": self.probe, "hash": HASH_NAME,
                **({} if self.devices else {"devices": False}),
                **({} if self.jax_values in ("auto", "replay") else
                   {"jax_values": self.jax_values}),
                "values": {"full": "bytes of every value (hash of the exact bytes)",
                           "stats": "hash of the exact bytes and statistics per value, no bytes",
                           "calls": "top-level calls and optimizer steps only: hash and "
                                    "statistics per value"}[self.level],
                **({"jax_values": self.jax_values} if self.jax_values not in ("auto", "replay")
                   else {}),
                **({"codec": self.codec} if self.codec != "none" else {})}


class Session:
    """State shared by the captures of one recording: the writer, options, a lock."""

    def __init__(self, writer, options, tool_dirs=()):
        self.writer = writer
        self.options = options
        self.lock = threading.RLock()
        self.pid = os.getpid()
        self.script_dir = None
        self.tool_dirs = tuple(tool_dirs)
        self.captures = []
        self.ends_process = False   # the process ends with the recording (record_script)
        # the process dies where the script is, right after the recording (SIGTERM,
        # runner.signals.Termination): the captures leave the program's state as it is
        self.ends_now = False
        self._user_files = {}
        self._site_kinds = {}
        # the lines around each new events.source, stored in the trace (trace/sources.py)
        from ..trace.sources import SourceRecorder

        writer.source_lines = SourceRecorder(lambda: self.script_dir)

    @property
    def active(self):
        """False in forked children (DataLoader workers, fork Pools, os.fork): they never
        write the parent's file (the writer also stops them, trace/writer/process_hooks.py)."""
        return os.getpid() == self.pid and not self.writer.closed

    _LIBRARY_MARKERS = (os.sep + "lib" + os.sep + "python3", "<frozen", "<string>")

    def is_user_file(self, filename):
        """True for the user's code: the script's folder, or anything outside libraries
        (`installed_package`: also those installed with `pip install --target` onto
        PYTHONPATH) and tracediff itself (the bundled examples count as user code when they
        are the script)."""
        known = self._user_files.get(filename)
        if known is None:
            if self.script_dir and filename.startswith(self.script_dir + os.sep):
                known = True
            else:
                known = not (filename.startswith(self.tool_dirs)
                             or any(m in filename for m in self._LIBRARY_MARKERS)
                             or installed_package(filename) is not None)
            self._user_files[filename] = known
        return known

    site_skip = ()   # folders never named as an op's frame (jax, jaxlib: set by the recorder)

    def jax_site(self, frames):
        """events.source from (file, line) frames, innermost first: the innermost frame of
        the user's code, as "LIB ← USER" when the op runs inside library code (flax, optax,
        a pip package: LIB is the innermost frame outside jax, tracediff and Python's
        standard library; trace/sources.py). When LIB is a framework's own layer code
        (flax.linen's Dense) called by a model library (transformers' modeling_flax_bert),
        USER is that library's frame: the line that says which layer (`model_site`).
        Each file is classified once."""
        kinds = self._site_kinds
        lib = model = None
        for fn, line in frames:
            k = kinds.get(fn)
            if k is None:
                k = kinds[fn] = self._site_kind(fn)
            if k:
                here = f"{self.short_path(fn)}:{line}"
                if k == 2:
                    return join_site(model or here, lib)
                if lib is None:
                    lib, in_framework = here, k == 1
                elif k == 3 and model is None and in_framework:
                    model = here
        return join_site(model, lib) if model else lib

    # the frameworks' own packages (layers, optimizers): an op inside them is named by the
    # model code that called them when that code is a library (`jax_site`)
    FRAMEWORK_PACKAGES = ("flax", "optax", "torch", "jax", "jaxlib", "chex", "haiku",
                          "equinox", "torchvision", "functorch")

    def _site_kind(self, fn):
        """0: never named (tracediff, jax, the standard library, <frozen ...>); 1: a
        framework's library code (flax, optax, torch); 3: other library code
        (transformers, a pip package); 2: the user's code (`is_user_file`)."""
        if fn.startswith(self.tool_dirs) or fn.startswith(self.site_skip) or \
                fn.startswith(("<frozen", "<string>")) or \
                (fn.startswith(_STDLIB) and "-packages" not in fn):
            return 0
        if self.is_user_file(fn):
            return 2
        return 1 if self.in_framework(fn) else 3

    def in_framework(self, filename):
        """True for a file of a framework's own package (`FRAMEWORK_PACKAGES`), read from
        the folder after the library folder (`installed_package`)."""
        return installed_package(filename) in self.FRAMEWORK_PACKAGES

    def short_path(self, filename):
        """A source path as shown in reports: relative to the script's folder when inside it."""
        if self.script_dir and filename.startswith(self.script_dir + os.sep):
            return filename[len(self.script_dir) + 1:]
        return filename


class Capture:
    """Interface of a framework recorder."""

    framework = ""
    trigger = ""  # module whose import installs this capture

    def install(self, session):
        raise NotImplementedError

    def uninstall(self):
        raise NotImplementedError

    def manifest(self):
        """Framework configuration at the end of the run, merged into the manifest."""
        return {}


class _Loader(importlib.abc.Loader):
    """The module's own loader, and the watcher's callback once the module has run."""

    def __init__(self, inner, fire):
        self.inner, self.fire = inner, fire

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.fire()

    def __getattr__(self, name):   # get_resource_reader, is_package, get_source, ...
        if name in ("inner", "fire"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def _loaded(name):
    """True when module `name` is in sys.modules and has finished executing (a module
    still importing is in sys.modules already, with `__spec__._initializing` set when the
    import system runs it)."""
    mod = sys.modules.get(name)
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
        return False
    # a loader called by hand sets no flag: the module's own code still on the stack
    own = getattr(mod, "__dict__", None)
    f = sys._getframe(1)
    while f is not None:
        if f.f_globals is own:
            return False
        f = f.f_back
    return True


class ImportWatcher(importlib.abc.MetaPathFinder):
    """Runs a callback once, right after a watched module is *loaded* (has executed).

    Why on the load and not on the lookup: libraries look a framework up before they
    import it (transformers calls `importlib.util.find_spec("jax")`), and a lookup need
    not be followed by a load through that spec. So every spec handed out carries the
    callback until one of them runs; `import`, `importlib.import_module`, lazy modules
    and imports inside functions or libraries all load through a spec. A module loaded
    some other way (a loader called by hand) is caught on the next import of anything
    (sys.modules is checked then: `late`), and `loaded_unwatched()` names what is loaded
    with its callback never run, for the end of a recording."""

    def __init__(self, callbacks):
        self.callbacks = dict(callbacks)
        self.late = []   # watched modules found loaded by the sys.modules check
        self._busy = set()

    def _fire(self, name):
        cb = self.callbacks.pop(name, None)
        if cb is not None:
            cb()

    def _check_loaded(self):
        for name in [n for n in self.callbacks if _loaded(n)]:
            if name in self.callbacks:
                self.late.append(name)
                self._fire(name)

    def find_spec(self, fullname, path=None, target=None):
        if not self.callbacks:
            return None
        self._check_loaded()
        if fullname not in self.callbacks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, lambda: self._fire(fullname))
        return spec

    def loaded_unwatched(self):
        """Watched modules that are loaded while their callback never ran."""
        return [n for n in self.callbacks if _loaded(n)]

    def install(self):
        for name in list(self.callbacks):
            if name in sys.modules:
                self._fire(name)
        if self.callbacks:
            sys.meta_path.insert(0, self)

    def uninstall(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)


# framework -> (module that triggers the capture, recorder module, recorder class).
# Recorder modules import their framework, so they are imported only once the script
# has imported it: a torch-only script never pays for importing JAX, and vice versa.
RECORDERS = {
    "jax": ("jax", "tracediff.capture.jax.recorder", "JaxCapture"),
    "torch": ("torch", "tracediff.capture.torch.recorder", "TorchCapture"),
}


def start_captures(session, frameworks=("jax", "torch")):
    """Arrange for each framework's capture to install when the script imports it."""
    import importlib

    callbacks = {}
    for framework in frameworks:
        trigger, module, cls_name = RECORDERS[framework]

        def _install(module=module, cls_name=cls_name):
            if not session.active:
                # A forked child (a fork Pool worker) importing the framework for the
                # first time: it records nothing, so it gets no capture either.
                return
            cap = getattr(importlib.import_module(module), cls_name)()
            cap.install(session)
            session.captures.append(cap)

        callbacks[trigger] = _install
    watcher = ImportWatcher(callbacks)
    watcher.frameworks = {RECORDERS[fw][0]: fw for fw in frameworks}
    watcher.install()
    return watcher


__all__ = ["Capture", "Session", "RecordOptions", "start_captures", "schema"]
