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


def record_script(script, args, output, options=None, frameworks=("jax", "torch")):
    """Record `script args...` into `output`; returns the script's exit code."""
    options = options or RecordOptions()
    if not os.path.isfile(script):
        raise TraceError(f"{script}: no such script")
    check_output_path(output)
    script = os.path.abspath(script)
    manifest = base_manifest(script, [script, *args], {"tool": "tracediff record", **options.as_dict()})
    try:
        writer = TraceWriter(output, manifest)
    except OSError as exc:
        raise TraceError(f"cannot write {output}: {exc.strerror or exc}") from None
    session = Session(writer, options, tool_dirs=(TOOL_DIR,))
    session.script_dir = os.path.dirname(script)

    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *args]
    sys.path.insert(0, session.script_dir)
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    # The op log grows large; generation-0 collections over it cost more than recording.
    old_gc = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    end = {"status": "completed", "exit_code": 0}
    watcher = start_captures(session, frameworks)
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
        watcher.uninstall()
        frameworks_manifest = {}
        for cap in session.captures:
            try:
                cap.uninstall()
            except Exception as exc:  # never lose the trace over a clean-up error
                frameworks_manifest.setdefault("capture_errors", []).append(repr(exc))
            try:
                frameworks_manifest[cap.framework] = cap.manifest()
            except Exception as exc:
                frameworks_manifest.setdefault("capture_errors", []).append(repr(exc))
        frameworks_manifest["captured"] = [c.framework for c in session.captures]
        writer.close(end=end, frameworks=frameworks_manifest, events=writer.n_events,
                     bytes_recorded=writer.bytes_recorded)
        sys.argv, sys.path[:] = saved_argv, saved_path
        gc.set_threshold(*old_gc)
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
