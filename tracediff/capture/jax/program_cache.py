"""tracediff's own XLA programs kept on disk between runs (issue 55).

On a TPU v5e the programs tracediff adds to a recording (a call's values program, which
hashes and summarises every intermediate; the digest programs per dtype and shape) took
~94 s to compile for a 20-step 4096-wide MLP whose plain run takes 20 s, and the
hashing's integer arithmetic is most of it (one 4096x4096 value's hash alone: 0.7-1.6 s
to compile, 0.2 ms to run). A user re-runs the same repro many times; each run compiled
the same programs again. Here each program is compiled once per machine and software:
the executable XLA built is serialised into a folder and loaded by later runs
(~10 ms), keyed by the program's StableHLO text and everything that could make XLA
build another executable from it (jax/jaxlib versions, backend and its version, the
device kind and the devices it runs on, XLA_FLAGS/LIBTPU_INIT_ARGS, the host CPU's
features). The script's own programs never go through here: JAX's compilation, and its
own cache settings, stay the script's.

The key holds, beside the program's text, every setting that could make XLA build another
executable from it, a superset of what JAX's own persistent cache key holds: every JAX
configuration value (`jax_disable_most_optimizations`, the default matmul precision, ...)
and every `JAX_*`, `XLA_*`, `LIBTPU*` and `TPU_*` environment variable, read where the
program is lowered (on the script's thread, under its `with` contexts, after any
`jax.config.update` it made), so that an entry filled under one setting is never handed
back under another.

The folder: `TRACEDIFF_XLA_CACHE` (a path, or `off`), else `$XDG_CACHE_HOME/tracediff/xla`
(`~/.cache/tracediff/xla`); created private (0700), and not used where it or a folder above
it may hold someone else's files, nor where JAX's own persistent cache is on (it keeps
tracediff's programs with the script's). Its entries are sealed and read with bounds
(cache_entries.py): a planted, foreign or damaged file is compiled again, never loaded. At
most `MAX_BYTES`, temporaries included, oldest files dropped first. Any failure (a corrupt
file, a full disk, a backend that cannot serialise) compiles as before; the manifest says
how many programs were loaded, compiled and stored.
"""

import concurrent.futures
import hashlib
import os
import threading

from . import cache_entries as entries

MAX_BYTES = 4 << 30
_VERSION = "2"   # of the key's recipe
# environment variables that JAX, XLA or libtpu read: all of them are in the key
SETTING_PREFIXES = ("JAX_", "XLA_", "LIBTPU", "TPU_")


def folder():
    """The cache folder, or None where it is turned off."""
    chosen = os.environ.get("TRACEDIFF_XLA_CACHE", "")
    if chosen.lower() in ("off", "0", "none", "false"):
        return None
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tracediff", "xla")


def _host_key():
    """What about this host and its software could change an executable: versions, the
    backend's own version string (libtpu's), the CPU's features (XLA:CPU code is built for
    the host's ISA; a home folder can be shared between machines)."""
    import jax
    import jaxlib

    parts = [_VERSION, jax.__version__, getattr(jaxlib, "__version__", "")]
    devs = jax.devices()
    parts += [jax.default_backend(), getattr(devs[0].client, "platform_version", "")]
    parts += [devs[0].device_kind, str(len(devs))]
    try:
        with open("/proc/cpuinfo") as f:
            parts += sorted({line for line in f if line.startswith(("flags", "model name"))})
    except OSError:
        import platform

        parts.append(platform.processor() or platform.machine())
    return "\0".join(parts)


def settings_key():
    """Every setting that could change what XLA builds from a program, as they stand on this
    thread now (a `with jax.default_matmul_precision(...)` of the script's included): every
    JAX configuration value and every JAX/XLA/libtpu environment variable. Made where a
    program is lowered, on the script's thread, never in a background compile."""
    import jax

    config = getattr(jax.config, "values", {})
    parts = [f"{k}={config[k]!r}" for k in sorted(config)]
    parts += [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(SETTING_PREFIXES)]
    return "\0".join(parts)


class ProgramCache:
    """Compiles lowered programs, or loads them from the folder; counts both."""

    def __init__(self, path=None):
        self.path = folder() if path is None else path
        self.loaded = self.compiled = self.stored = 0
        self.jax_cache = None      # JAX's own cache folder, where that holds them instead
        self.errors = []
        self._checked = False      # the folder checked (`_ready`), at the first compile
        self._host = None          # the key's host part (`_host_key`), at the first key
        self._secret = None        # the folder's key that seals its entries (cache_entries)
        self._lock = threading.Lock()   # counts and errors: programs compile in threads too
        self._pool = None          # background compiles (`submit`)

    def _usable(self, path):
        """`path` made private if new, with its sealing key; None (with the reason kept)
        where it or a folder above it may hold someone else's files: they would be loaded
        as programs."""
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            why = entries.unsafe_folder(path)
            if why is None:
                self._secret = entries.secret(path)
        except (OSError, entries.EntryError) as exc:
            self._error(f"cache folder {path}: {getattr(exc, 'strerror', None) or exc}")
            return None
        if why is not None:
            self._error(f"cache folder {path}: {why}: not used")
            return None
        return path

    def _ready(self):
        """The folder to use, checked once: none where JAX's own persistent cache is on
        (the script or its environment set one: it holds tracediff's programs too)."""
        if not self._checked:
            self._checked = True
            import jax

            self.jax_cache = getattr(jax.config, "jax_compilation_cache_dir", None) or None
            if self.path is not None:
                self.path = None if self.jax_cache else self._usable(self.path)
        return self.path

    def _error(self, message):
        with self._lock:
            if len(self.errors) < 20:
                self.errors.append(message)

    def _count(self, what):
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def prime(self):
        """Check the folder and make the key's host part now, on this thread, before
        programs compile in others (digest_groups.py)."""
        try:
            if self._ready() is not None and self._host is None:
                self._host = _host_key()
        except Exception as exc:
            self._error(f"key: {type(exc).__name__}: {str(exc)[:200]}")

    def submit(self, fn, *args):
        """fn(*args) in a background thread (a compile: XLA's releases the GIL), as a
        Future; the folder and key are checked here first, on the caller's thread."""
        if self._pool is None:
            self.prime()
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max(1, min(8, (os.cpu_count() or 2) - 1)), thread_name_prefix="tracediff-xla")
        return self._pool.submit(fn, *args)

    def close(self):
        """Compiles not started are dropped (the recording ends)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def jit(self, fn):
        """`jax.jit(fn)`, compiled through this cache (`CachedProgram`)."""
        return CachedProgram(self, fn)

    def compile(self, lowered, devices, settings):
        """The executable of `lowered` (a `jax.stages.Lowered`): loaded from the folder,
        else compiled and stored. `devices`: the ids of the devices its arguments are on;
        `settings`: `settings_key()` where it was lowered."""
        if self._ready() is None:
            self._count("compiled")
            return lowered.compile()
        from jax.experimental import serialize_executable

        try:
            if self._host is None:
                self._host = _host_key()
            key = hashlib.sha256("\0".join(
                [self._host, settings, repr(devices), lowered.as_text()]).encode()).hexdigest()
        except Exception as exc:
            self._error(f"key: {type(exc).__name__}: {str(exc)[:200]}")
            self._count("compiled")
            return lowered.compile()
        name = key[:40] + ".xla"
        file = os.path.join(self.path, name)
        try:
            payload = entries.unseal(self._secret, name, entries.read_bounded(
                file, entries.MAX_ENTRY_BYTES))
        except entries.EntryError as exc:
            if os.path.lexists(file):
                self._error(f"load: {exc}")
            payload = None
        if payload is not None:
            try:
                exe = entries.load_executable(payload, lowered.in_tree, lowered.out_tree)
                self._count("loaded")
                os.utime(file)   # recently used: dropped last
                return exe
            except Exception as exc:   # foreign to this jaxlib: compile, overwrite below
                self._error(f"load: {type(exc).__name__}: {str(exc)[:200]}")
        exe = lowered.compile()
        self._count("compiled")
        try:
            data = serialize_executable.serialize(exe)[0]
            entries.write_entry(file, entries.seal(self._secret, name, data))
            self._count("stored")
            entries.trim(self.path, MAX_BYTES)
        except Exception as exc:   # cannot serialise here, or the disk is full: run anyway
            self._error(f"store: {type(exc).__name__}: {str(exc)[:200]}")
        return exe

    def manifest(self):
        return {"folder": self.path, "jax_cache_folder": self.jax_cache, "loaded": self.loaded,
                "compiled": self.compiled, "stored": self.stored, "errors": self.errors,
                "note": "tracediff's own programs (values and digest programs) loaded from, "
                        "or compiled and stored into, this folder; the script's programs are "
                        "compiled by JAX as in a plain run"}


def _signature(leaf):
    """What of an argument decides the program compiled for it."""
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None:
        return (leaf.shape, leaf.dtype, getattr(leaf, "weak_type", False), sharding)
    import numpy as np

    return (type(leaf), np.shape(leaf), np.result_type(leaf))


class CachedProgram:
    """A jitted function of tracediff's whose executables come from a `ProgramCache`:
    lowered once per argument signature, as `jax.jit` would trace it, then compiled or
    loaded, at its first call or ahead of it in a background thread (`start`). Where
    anything in that path fails, the call goes through `jax.jit` itself."""

    def __init__(self, cache, fn):
        import jax

        self.cache = cache
        self._jit = jax.jit(fn)
        self._exes = {}

    def _lookup(self, args):
        """(the signature that picks the executable for these arguments, what this program
        holds for it: an executable, a Future of one, or None); (None, None) where a
        sharding is unhashable (JAX's own cache decides). One dict lookup: every call."""
        import jax

        leaves, tree = jax.tree_util.tree_flatten(args)
        sig = (tree, tuple(_signature(x) for x in leaves))
        try:
            return sig, self._exes.get(sig)
        except TypeError:
            return None, None

    def _lower(self, args):
        """(the program lowered for these arguments, the ids of the devices they are on,
        the settings it compiles under: `settings_key()`, here on the caller's thread)."""
        import jax

        devices = sorted({d.id for x in jax.tree_util.tree_leaves(args)
                          for d in getattr(getattr(x, "sharding", None), "device_set", ())})
        return self._jit.lower(*args), devices, settings_key()

    def start(self, *args):
        """Compile (or load) the program for these arguments in a background thread, where
        it is not compiled yet: lowered here (tracing stays on the caller's thread), the
        call that needs it waits for it. Returns whether a compile started."""
        sig, exe = self._lookup(args)
        if sig is None or exe is not None:
            return False
        try:
            lowered = self._lower(args)
        except Exception as exc:
            self.cache._error(f"compile: {type(exc).__name__}: {str(exc)[:200]}")
            self._exes[sig] = self._jit
            return False
        self._exes[sig] = self.cache.submit(self.cache.compile, *lowered)
        return True

    def ready(self, *args):
        """Is the program for these arguments compiled (or loaded)? Where it is not, its
        compile starts in a background thread (`start`); where it cannot be, True: the
        call compiles it through `jax.jit`, as before."""
        sig, exe = self._lookup(args)
        if sig is None:
            return True
        if exe is None:
            return not self.start(*args)
        return not isinstance(exe, concurrent.futures.Future) or exe.done()

    def _executable(self, sig, exe, args):
        """The executable for these arguments (`exe`: what `_lookup` found): compiled (or
        loaded) now, or awaited where `start` compiles it; `jax.jit`'s where any of that
        failed."""
        if isinstance(exe, concurrent.futures.Future):
            try:
                exe = exe.result()
            except Exception as exc:
                self.cache._error(f"compile: {type(exc).__name__}: {str(exc)[:200]}")
                exe = self._jit
            self._exes[sig] = exe
        elif exe is None:
            try:
                exe = self.cache.compile(*self._lower(args))
            except Exception as exc:
                self.cache._error(f"compile: {type(exc).__name__}: {str(exc)[:200]}")
                exe = self._jit
            self._exes[sig] = exe
        return exe

    def __call__(self, *args):
        sig, exe = self._lookup(args)
        if sig is None:
            return self._jit(*args)
        exe = self._executable(sig, exe, args)
        if exe is self._jit:
            return exe(*args)
        try:
            return exe(*args)
        except Exception as exc:   # an executable that does not take these arguments
            self.cache._error(f"call: {type(exc).__name__}: {str(exc)[:200]}")
            self._exes[sig] = self._jit
            return self._jit(*args)
