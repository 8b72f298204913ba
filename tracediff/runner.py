"""Run an unmodified script as __main__ under recording, and always close the trace.

The script gets its own argv, its folder first on sys.path and its exit status; an
exception, sys.exit, Ctrl-C or SIGTERM still leaves a complete, readable trace whose
manifest says how the run ended. A child the script forks leaves through the same code
and must not close (or claim) the parent's trace; a trace the script deleted, replaced
or lost the descriptor of is reported as lost, never as written.
"""

import ctypes
import gc
import os
import runpy
import shutil
import signal
import struct
import sys
import tempfile
import traceback

from . import term_watch
from .capture import RecordOptions, Session, budget, start_captures
from .trace.manifest import capture_losses
from .errors import TraceError, UnsupportedJax
from .trace.manifest import base_manifest, native_libraries
from .trace.writer import TraceWriter

TOOL_DIR = os.path.dirname(os.path.abspath(__file__))


def min_free_bytes():
    """Free space an output folder needs before a recording starts: TRACEDIFF_MIN_FREE_MB
    (default 64), read when a recording starts, not when tracediff is imported."""
    value = os.environ.get("TRACEDIFF_MIN_FREE_MB", "64")
    try:
        return int(float(value) * (1 << 20))
    except (ValueError, OverflowError):
        raise TraceError(f"TRACEDIFF_MIN_FREE_MB must be a number of MiB, not {value!r}") from None

# (rank, local rank, world size) variables of the launchers we know, in order of trust.
RANK_ENV = [("RANK", "LOCAL_RANK", "WORLD_SIZE", "torchrun"),
            ("JAX_PROCESS_ID", None, "JAX_NUM_PROCESSES", "jax"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi"),
            ("PMI_RANK", None, "PMI_SIZE", "mpich"),
            ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "slurm")]


def distributed_rank(environ=None):
    """{"rank", "local_rank", "world_size", "launcher"} when this process is one of several
    started by torchrun / jax / MPI / SLURM (world size > 1), else None."""
    env = os.environ if environ is None else environ
    for rank_var, local_var, size_var, launcher in RANK_ENV:
        try:
            rank, size = int(env[rank_var]), int(env[size_var])
        except (KeyError, ValueError):
            continue
        if size > 1 and 0 <= rank < size:
            try:
                local = int(env[local_var]) if local_var else None
            except (KeyError, ValueError):
                local = None
            return {"rank": rank, "local_rank": local, "world_size": size, "launcher": launcher}
    return None


def output_path_for(output, environ=None):
    """The file a recording writes. A directory (`-o run_a/`: a trailing slash, or an
    existing directory) gets `rank{R}.h5` for rank R of a multi-process run and
    `trace.h5` otherwise (created if missing); a file name gets `.rank{R}` inserted before
    its extension for rank R (`run_a.h5` -> `run_a.rank2.h5`). Every rank gets its own
    trace; they never share a file."""
    dist = distributed_rank(environ)
    output = os.fspath(output)
    if output.endswith(("/", os.sep)) or os.path.isdir(output):
        try:
            os.makedirs(output, exist_ok=True)   # every rank may race here
        except OSError as exc:
            raise TraceError(f"cannot write into {output}: {exc.strerror or exc}") from None
        name = "trace.h5" if dist is None else f"rank{dist['rank']}.h5"
        return os.path.join(output, name)
    if dist is None:
        return output
    root, ext = os.path.splitext(output)
    return f"{root}.rank{dist['rank']}{ext or '.h5'}"


def check_output_path(output):
    """Refuse, before the script runs, an output the trace could not be written to."""
    folder = os.path.dirname(os.path.abspath(output)) or "."
    if not os.path.isdir(folder):
        raise TraceError(f"cannot write {output}: folder {folder} does not exist")
    if os.path.isdir(output):
        raise TraceError(f"cannot write {output}: it is a directory")
    if os.path.exists(output) and not os.path.isfile(output):
        raise TraceError(f"cannot write {output}: not a regular file")
    # A real probe: os.access says yes to root on a read-only file system.
    try:
        fd, probe = tempfile.mkstemp(prefix=".tracediff-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise TraceError(f"cannot write {output}: folder {folder} is not writable "
                         f"({exc.strerror or exc})") from None
    if os.path.exists(output) and not os.access(output, os.W_OK):
        raise TraceError(f"cannot write {output}: the file exists and is not writable")
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    need = min_free_bytes()
    if free is not None and free < need:
        raise TraceError(f"cannot write {output}: only {free / (1 << 20):.0f} MiB free in {folder} "
                         f"(need {need >> 20} MiB; set TRACEDIFF_MIN_FREE_MB to change)")


def exit_status(code, stderr=None):
    """The process exit status Python gives `sys.exit(code)` (CPython's
    `_Py_HandleSystemExit`): None -> 0; an int (True and False included) -> C
    `exit((int)PyLong_AsLong(code))`, i.e. `code & 0xFF` on POSIX (-1 -> 255, 256 -> 0), and
    an int too large for a C long -> -1 -> 255; anything else is printed to `stderr`
    (when given) and -> 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        half = 1 << (8 * struct.calcsize("l") - 1)
        code = int(code) if -half <= code < half else -1
        if os.name == "nt":   # the 32-bit int itself is the exit code
            return (code + (1 << 31)) % (1 << 32) - (1 << 31)
        return code & 0xFF
    if stderr is not None:
        try:
            print(code, file=stderr)
        except Exception:
            pass
    return 1


def _exit_message(code):
    """What `sys.exit(code)` printed, for the manifest (None for an int or None)."""
    if code is None or isinstance(code, int):
        return None
    try:
        return str(code)[:2000]
    except Exception:
        return type(code).__name__


class _Terminated(BaseException):
    pass


def _on_sigterm(signum, frame):
    term_watch.taken.set()      # the main thread took it: the watch thread stands down
    raise _Terminated()


# SIGTERM's handler before `record_script` installed `_on_sigterm`: a child the script
# forks gets it back (the plain script's child has no tracediff handler; a fork Pool's
# workers, terminated by SIGTERM, would print a traceback each).
_term_before = []


def _after_fork_in_child():
    term_watch.forget_in_child()
    if not _term_before:
        return
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, _term_before[-1])
    except (ValueError, OSError, TypeError):
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Recording:
    """One recording in the current process: writer, session, captures, and their clean
    teardown. Shared by `tracediff record` (`record_script`) and `tracediff.record()`.

    `start()` opens the trace and arms the captures (a framework already imported is
    captured at once, one imported later when it is imported); `stop(end)` uninstalls
    them, completes the manifest with `end` ({"status", "exit_code", ...}) and each
    framework's configuration, and closes the trace. `stop` never raises over a capture's
    clean-up error (it is recorded in the manifest instead) and is idempotent.
    """

    def __init__(self, output, options=None, frameworks=("jax", "torch"), script=None,
                 argv=None, tool="tracediff record", script_dir=None):
        self.output = output
        self.options = options or RecordOptions()
        self.frameworks = tuple(frameworks or ("jax", "torch"))
        self.script, self.argv, self.tool = script, argv, tool
        self.script_dir = script_dir or (os.path.dirname(script) if script else None)
        self.writer = self.session = self.watcher = None
        self.incomplete = None   # why a trace whose recording stopped early does not open
        self.signals_taken = []  # signals the script's own handlers took (term_watch)
        self._old_gc = None
        self._stopped = False
        self.pid = os.getpid()

    @property
    def lost(self):
        """Why the trace is not at its path (deleted, replaced, its descriptor closed by
        the script and the path gone), or None."""
        return self.writer.lost if self.writer is not None else None

    def start(self):
        self.pid = os.getpid()
        # absolute: the script may chdir, and the close-time rewrite and the size printed
        # must be the trace's, never a file of the same name in the script's new folder
        self.output = os.path.abspath(output_path_for(self.output))
        check_output_path(self.output)
        manifest = base_manifest(self.script, self.argv,
                                 {"tool": self.tool, **self.options.as_dict()})
        manifest["distributed"] = distributed_rank()
        try:
            self.writer = TraceWriter(self.output, manifest,
                                      codec=self.options.codec)
        except OSError as exc:
            raise TraceError(f"cannot write {self.output}: {exc.strerror or exc}") from None
        # a hash chosen with --hash applies to every framework's values (`auto` is chosen
        # by the JAX capture per backend, capture/jax_recorder.py; else xxh3_64)
        if getattr(self.options, "hash", "auto") != "auto":
            self.writer.use_hash(self.options.hash)
        # --level stats/calls store hash + statistics instead of bytes; --max-bytes caps bytes
        self.writer.level = "full" if self.options.level == "full" else "stats"
        self.writer.max_bytes = self.options.max_bytes
        self.session = Session(self.writer, self.options, tool_dirs=(TOOL_DIR,))
        self.session.script_dir = self.script_dir
        # The op log grows large; generation-0 collections over it cost more than recording.
        self._old_gc = gc.get_threshold()
        gc.set_threshold(100_000, 50, 100)
        try:
            self.watcher = start_captures(self.session, self.frameworks)
        except BaseException:
            self.stop({"status": "capture failed to start", "exit_code": 1})
            raise
        return self

    def stop(self, end=None, report_lost=True):
        """`report_lost=False`: the caller reports a lost trace itself (`lost`)."""
        if self.writer is None or self._stopped:
            return
        if os.getpid() != self.pid or self.writer.forked:
            return   # a forked child: the trace, captures and gc settings are the parent's
        self._stopped = True
        end = end or {"status": "completed", "exit_code": 0}
        if self.signals_taken:   # how the run ended was the script's handlers' call
            end = {**end, "signals_handled_by_script": list(self.signals_taken)}
        # A descriptor the script closed is found (and the trace reopened) on the next
        # write: do one now, so that the manifest below can say so.
        self.writer.flush()
        if self.watcher is not None:
            self.watcher.uninstall()
        frameworks_manifest = {}
        for cap in self.session.captures:
            try:
                cap.uninstall()
            except Exception as exc:  # never lose the trace over a clean-up error
                frameworks_manifest.setdefault("capture_errors", []).append(repr(exc))
            try:
                frameworks_manifest[cap.framework] = cap.manifest()
            except Exception as exc:
                frameworks_manifest.setdefault("capture_errors", []).append(repr(exc))
        frameworks_manifest["captured"] = [c.framework for c in self.session.captures]
        missed, late = self._unrecorded()
        if missed:
            frameworks_manifest["missed"] = missed
        if late:
            frameworks_manifest["captured_late"] = late
        try:
            self.writer.close(end=end, frameworks=frameworks_manifest, events=self.writer.n_events,
                              libraries=native_libraries(),   # loaded by the end of the run
                              bytes_recorded=self.writer.bytes_recorded,
                              recording=self._recording_summary())
        finally:
            if self._old_gc is not None:
                gc.set_threshold(*self._old_gc)
                self._old_gc = None
        for fw in missed:
            print(f"tracediff: WARNING: the script loaded {fw} but the trace holds none of its "
                  f"operations: {fw} was not recorded (the manifest says so under "
                  f"frameworks.missed; locate will not call this trace a match)",
                  file=sys.stderr)
        for line in capture_losses(frameworks_manifest):
            print(f"tracediff: WARNING: {line}", file=sys.stderr)
        for fw in late:
            print(f"tracediff: warning: {fw} was found loaded only after its import finished "
                  f"(loaded outside the import system); what it ran before that is not in the "
                  f"trace", file=sys.stderr)
        if self.writer.lost:
            if report_lost:
                print(f"tracediff: error: recording lost: {self.writer.lost}", file=sys.stderr)
            return
        if self.writer.error:
            # a write error (full disk): the trace must still open, or the run says so
            self.incomplete = _why_unreadable(self.output)
            if self.incomplete:
                if report_lost:
                    print(f"tracediff: error: {self.incomplete_message()}", file=sys.stderr)
                return
        if self.writer.reopened:
            print(f"tracediff: warning: the script closed the trace's file descriptor; "
                  f"{self.output} was opened again and the trace is complete", file=sys.stderr)
        if self.writer.error:
            # The script ran to its end; only the trace is short. Say so, keep its exit code.
            print(f"tracediff: warning: recording stopped early, the trace {self.output} is "
                  f"truncated after {self.writer.committed_events} events "
                  f"({self.writer.error})", file=sys.stderr)


    def incomplete_message(self):
        return (f"recording incomplete: {self.writer.error}, and the trace {self.output} "
                f"does not open ({self.incomplete})")

    def _unrecorded(self):
        """(frameworks the script loaded that have no capture, frameworks captured only
        once the watcher found them loaded by other means): never silent (issue #26)."""
        w = self.watcher
        if w is None:
            return [], []
        names = getattr(w, "frameworks", {})
        have = {c.framework for c in self.session.captures}
        missed = [names.get(m, m) for m in w.loaded_unwatched()]
        missed = sorted(set(missed) - have)
        late = sorted({names.get(m, m) for m in w.late} & have)
        return missed, late

    def _recording_summary(self):
        """The manifest's `recording` section completed with what the windows and the byte
        cap did (so every trace says how, and how much of the run, was recorded)."""
        w = self.writer
        rec = dict(w._manifest.get("recording") or {})
        rec["stats_values"] = w.stats_values
        if w.reopened:
            rec["reopened"] = w.reopened
        if w.max_bytes is not None:
            rec["max_bytes_reached"] = w.capped_at_event is not None
            if w.capped_at_event is not None:
                rec["values_capped_at_event"] = w.capped_at_event
                rec["note"] = (f"--max-bytes {w.max_bytes}: value bytes stop at event "
                               f"{w.capped_at_event}; later values have hash and statistics only")
        return rec


def _std_files():
    """(st_dev, st_ino) of descriptors 1 and 2 (None where closed)."""
    out = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            out.append(None)
    return out


def _drop_lost_std(before):
    """After the script: a standard output it closed (or whose number now holds a file of
    its own) is never written again. sys.stdout / sys.stderr go to os.devnull, so that
    neither tracediff's closing lines nor Python's flush at exit fail, which would replace
    the script's exit status (1, or 120) or write into the script's file."""
    for (fd, name), was in zip(((1, "stdout"), (2, "stderr")), before):
        if _std_files()[fd - 1] != was or was is None:
            setattr(sys, name, open(os.devnull, "w"))


def record_script(script, args, output, options=None, frameworks=("jax", "torch")):
    """Record `script args...` into `output`; returns the script's exit status, or -N when
    the plain script would have died by signal N (Ctrl-C, SIGTERM: `exit_by_signal`).
    `os._exit` and `os.exec*` in the script close (exec: flush) the trace first.

    Raises TraceError when the trace was lost (the script deleted or replaced it, or
    closed its descriptor and the path no longer holds it). In a child the script
    forked (os.fork, a fork Pool) that comes back here, exits as the plain script's
    child would (SystemExit with its status), without touching the parent's trace."""
    if not os.path.isfile(script):
        raise TraceError(f"{script}: no such script")
    script = os.path.abspath(script)
    rec = Recording(output, options, frameworks, script=script, argv=[script, *args],
                    tool="tracediff record")
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    end = {"status": "completed", "exit_code": 0}
    rec.start()
    # the process ends with the recording: the captures need not hand the rest of it back
    # as they found it (JAX's caches)
    rec.session.ends_process = True
    sys.argv = [script, *args]
    sys.path.insert(0, rec.script_dir)
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    if old_term is not None:
        _term_before.append(old_term)
    ends = _ProcessEnds(rec)
    watch = term_watch.TermWatch(ends.stop, exit_by_signal, _on_sigterm, rec.signals_taken)
    try:
        # the frames below the script and the recorder's own never count against the
        # script's recursion budget (capture/budget.py)
        std = _std_files()
        with _LostInterrupts(rec.writer), ends, watch, budget.Shift(budget.below_script()):
            try:
                runpy.run_path(script, run_name="__main__")
            finally:
                _drop_lost_std(std)
    except SystemExit as exc:
        end = {"status": "sys.exit", "exit_code": exit_status(exc.code, sys.stderr)}
        message = _exit_message(exc.code)
        if message is not None:
            end["message"] = message
    except KeyboardInterrupt as exc:
        tb = _script_traceback(exc)
        end = {"status": "interrupted (SIGINT)", "exit_code": 130, "exception": "KeyboardInterrupt",
               "traceback": tb[-20000:], "signal": int(signal.SIGINT)}
        print("KeyboardInterrupt", file=sys.stderr)
    except UnsupportedJax as exc:   # JAX imported by the script, outside the supported range
        print(f"tracediff: error: {exc}", file=sys.stderr)
        end = {"status": "unsupported jax", "exit_code": 2, "exception": "UnsupportedJax",
               "message": str(exc)[:2000]}
    except _Terminated as exc:
        end = {"status": "terminated (SIGTERM)", "exit_code": 143, "exception": "SIGTERM",
               "traceback": _script_traceback(exc, "Terminated by SIGTERM\n")[-20000:],
               "signal": int(signal.SIGTERM)}
    except BaseException as exc:  # the script's own error: report it as Python would
        tb = _script_traceback(exc)
        sys.stderr.write(tb)
        end = {"status": "exception", "exit_code": 1, "exception": type(exc).__name__,
               "message": str(exc)[:2000], "traceback": tb[-20000:]}
    finally:
        try:
            rec.stop(end, report_lost=False)
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
                if _term_before:
                    _term_before.pop()
    if os.getpid() != rec.pid:
        raise SystemExit(end["exit_code"])
    if rec.lost:
        raise TraceError(f"recording lost: {rec.lost} (the script exited with status "
                         f"{end['exit_code']})")
    if rec.incomplete:
        message = f"{rec.incomplete_message()} (the script exited with status {end['exit_code']})"
        if not rec.writer.unclosed:
            raise TraceError(message)
        print(f"tracediff: error: {message}", file=sys.stderr)
        end = {"exit_code": 2}   # as the CLI's own errors; exits below without HDF5's close
    if rec.writer is not None and rec.writer.unclosed:
        # A write failed mid-flush: HDF5 can crash closing that file (at exit too), which
        # would replace the script's exit code. The trace keeps its last commit.
        sys.stdout.flush()
        sys.stderr.flush()
        if end.get("signal"):
            exit_by_signal(end["signal"], finalize=False)
        os._exit(end["exit_code"])
    return -end["signal"] if end.get("signal") else end["exit_code"]


def exit_by_signal(signum, finalize=True):
    """End this process killed by SIGNUM, as the plain script's would have ended (a parent
    sees -SIGNUM, a shell 128+SIGNUM). SIGINT: as Python ends on an uncaught
    KeyboardInterrupt, after joining threads and running atexit handlers; SIGTERM's
    default action ends a process at once. Never returns."""
    if finalize and signum == signal.SIGINT:
        import atexit
        import threading

        try:
            threading._shutdown()
        except Exception:
            pass
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        _default_action(signum)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    except (OSError, ValueError):
        pass
    os._exit(128 + signum)


def _default_action(signum):
    """Give SIGNUM its default action back, from any thread: Python's `signal.signal` works
    only in the main thread, which is blocked in a C call when term_watch's thread ends the
    run; the C library's `signal()` works from any."""
    if _main_thread():
        signal.signal(signum, signal.SIG_DFL)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(int(signum), None)                     # SIG_DFL is 0


class _ProcessEnds:
    """`os._exit` and `os.exec*` end the process without unwinding (no finally, no
    atexit), which would leave the trace with only what the last flush committed.
    While the script runs they first stop the recording (the trace is closed and
    complete; its end says how), then do what they do. A forked child's calls go straight
    through (the trace is its parent's). `os.execl*`/`execvp*` call `os.execv`/`execve`."""

    def __init__(self, rec):
        self.rec = rec
        self.saved = {}

    def __enter__(self):
        for name, wrap in (("_exit", self._exit), ("execv", self._exec("execv")),
                           ("execve", self._exec("execve"))):
            if hasattr(os, name):
                self.saved[name] = getattr(os, name)
                setattr(os, name, wrap)
        return self

    def __exit__(self, *exc):
        for name, real in self.saved.items():
            setattr(os, name, real)

    def _ours(self):
        return os.getpid() == self.rec.pid and not self.rec._stopped

    def _exit(self, status):
        if self._ours():
            code = status if isinstance(status, int) and not isinstance(status, bool) else 1
            self.stop({"status": "os._exit", "exit_code": code & 0xFF})
        self.saved["_exit"](status)

    def _exec(self, name):
        def exec_(path, args, *env):
            if not self._ours():
                return self.saved[name](path, args, *env)
            self.stop({"status": "exec", "exit_code": None,
                        "message": f"os.{name}({os.fsdecode(path)!r}, ...)"[:2000]})
            try:
                return self.saved[name](path, args, *env)
            except BaseException:
                print(f"tracediff: warning: os.{name} failed after the trace was closed; "
                      f"the rest of the script is not recorded", file=sys.stderr)
                raise
        return exec_

    def stop(self, end):
        """Close the trace with `end` (from any thread: os._exit, the SIGTERM watch)."""
        rec = self.rec
        try:
            rec.stop(end)
            if not rec.lost and not rec.incomplete:
                print(f"tracediff: trace written to {rec.output} ({end['status']})",
                      file=sys.stderr)
        except Exception as exc:   # never keep the script from ending as it asked
            print(f"tracediff: error: closing the trace at {end['status']}: {exc}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass


class _LostInterrupts:
    """Hands a swallowed Ctrl-C back to the script.

    Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives. When
    that is a weakref callback (h5py frees its objects while the writer flushes), the
    exception is printed as "Exception ignored" and dropped: the recorded script would
    run on as if Ctrl-C had never been pressed (seen as a hang). A KeyboardInterrupt that
    reaches `sys.unraisablehook` is therefore raised again just before the next recorded
    event, in the script's own call stack (SIGTERM's exception likewise). A Ctrl-C the
    script catches itself is not touched."""

    def __init__(self, writer):
        self.writer = writer
        self.previous = None

    def __enter__(self):
        self.previous = sys.unraisablehook
        sys.unraisablehook = self._hook
        return self

    def __exit__(self, *exc):
        sys.unraisablehook = self.previous
        if self.writer is not None:
            self.writer.before_event = None

    def _hook(self, unraisable):
        kind = unraisable.exc_type
        if kind is not None and issubclass(kind, (KeyboardInterrupt, _Terminated)) and \
                self.writer is not None and not self.writer.closed:
            self.lost = kind
            self.writer.before_event = self._raise
            return
        self.previous(unraisable)

    def _raise(self):
        self.writer.before_event = None
        raise self.lost()


def _why_unreadable(path):
    """Why the trace at PATH does not open, or None (it opens: its committed events are
    all readable)."""
    from .trace.reader import Trace

    try:
        with Trace(path) as t:
            len(t)
    except Exception as exc:
        return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    return None


def _main_thread():
    import threading

    return threading.current_thread() is threading.main_thread()


def _script_traceback(exc, last_line=None):
    """The script's traceback without tracediff's and runpy's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(TOOL_DIR) and "runpy" not in os.path.basename(f.filename)]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames),
             *([last_line] if last_line else traceback.format_exception_only(type(exc), exc))]
    return "".join(lines)
