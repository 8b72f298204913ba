"""Run an unmodified script as __main__ under recording, and always close the trace.

The script gets its own argv, its folder first on sys.path and its exit status; an
exception, sys.exit, Ctrl-C or SIGTERM still leaves a complete, readable trace whose
manifest says how the run ended.
"""

import gc
import os
import runpy
import signal
import sys
import traceback

from .capture import RecordOptions, Session, start_captures
from .errors import TraceError
from .trace.manifest import base_manifest
from .trace.writer import TraceWriter

TOOL_DIR = os.path.dirname(os.path.abspath(__file__))


def check_output_path(output):
    folder = os.path.dirname(os.path.abspath(output)) or "."
    if not os.path.isdir(folder):
        raise TraceError(f"cannot write {output}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise TraceError(f"cannot write {output}: folder {folder} is not writable")
    if os.path.isdir(output):
        raise TraceError(f"cannot write {output}: it is a directory")


class _Terminated(BaseException):
    pass


def _on_sigterm(signum, frame):
    raise _Terminated()


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
        self._old_gc = None

    def start(self):
        check_output_path(self.output)
        manifest = base_manifest(self.script, self.argv,
                                 {"tool": self.tool, **self.options.as_dict()})
        try:
            self.writer = TraceWriter(self.output, manifest)
        except OSError as exc:
            raise TraceError(f"cannot write {self.output}: {exc.strerror or exc}") from None
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

    def stop(self, end=None):
        if self.writer is None or self.writer.closed:
            return
        end = end or {"status": "completed", "exit_code": 0}
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
        try:
            self.writer.close(end=end, frameworks=frameworks_manifest, events=self.writer.n_events,
                              bytes_recorded=self.writer.bytes_recorded,
                              recording=self._recording_summary())
        finally:
            if self._old_gc is not None:
                gc.set_threshold(*self._old_gc)
                self._old_gc = None


    def _recording_summary(self):
        """The manifest's `recording` section completed with what the windows and the byte
        cap did (so every trace says how, and how much of the run, was recorded)."""
        w = self.writer
        rec = dict(w._manifest.get("recording") or {})
        rec["stats_values"] = w.stats_values
        if w.max_bytes is not None:
            rec["max_bytes_reached"] = w.capped_at_event is not None
            if w.capped_at_event is not None:
                rec["values_capped_at_event"] = w.capped_at_event
                rec["note"] = (f"--max-bytes {w.max_bytes}: value bytes stop at event "
                               f"{w.capped_at_event}; later values have hash and statistics only")
        return rec


def record_script(script, args, output, options=None, frameworks=("jax", "torch")):
    """Record `script args...` into `output`; returns the script's exit code."""
    if not os.path.isfile(script):
        raise TraceError(f"{script}: no such script")
    script = os.path.abspath(script)
    rec = Recording(output, options, frameworks, script=script, argv=[script, *args],
                    tool="tracediff record")
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    end = {"status": "completed", "exit_code": 0}
    rec.start()
    sys.argv = [script, *args]
    sys.path.insert(0, rec.script_dir)
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        end = {"status": "sys.exit", "exit_code": code}
    except KeyboardInterrupt:
        end = {"status": "interrupted (SIGINT)", "exit_code": 130}
        print("KeyboardInterrupt", file=sys.stderr)
    except _Terminated:
        end = {"status": "terminated (SIGTERM)", "exit_code": 143}
    except BaseException as exc:  # the script's own error: report it as Python would
        tb = _script_traceback(exc)
        sys.stderr.write(tb)
        end = {"status": "exception", "exit_code": 1, "exception": type(exc).__name__,
               "message": str(exc)[:2000], "traceback": tb[-20000:]}
    finally:
        try:
            rec.stop(end)
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
    return end["exit_code"]


def _main_thread():
    import threading

    return threading.current_thread() is threading.main_thread()


def _script_traceback(exc):
    """The script's traceback without tracediff's and runpy's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(TOOL_DIR) and "runpy" not in os.path.basename(f.filename)]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames),
             *traceback.format_exception_only(type(exc), exc)]
    return "".join(lines)
