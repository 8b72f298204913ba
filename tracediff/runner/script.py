"""Running the script: `record_script` runs it unmodified as __main__ under a
`Recording`, with its own argv, its folder first on sys.path, tracediff's SIGTERM handler
and the wrappers that close the trace however it ends, then turns how it ended (exit
status, exception, Ctrl-C, SIGTERM, a lost or unreadable trace) into the manifest's end
and the status `tracediff record` exits with.
"""

import contextlib
import os
import runpy
import signal
import sys
import traceback

from .. import term_watch
from ..capture import budget
from ..errors import TraceError, UnsupportedJax
from .closing import ProcessEnds
from .recording import Recording
from .signals import (LostInterrupts, Termination, _Terminated, exit_by_signal, exit_message,
                      exit_status, main_thread, on_sigterm, script_frame, term_before)


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


def record_script(script, args, output, options=None, frameworks=("jax", "torch"),
                  sigterm_ends_process=True):
    """Record `script args...` into `output`; returns the script's exit status, or -N when
    the plain script would have died by signal N (Ctrl-C, SIGTERM: `exit_by_signal`).
    `os._exit` and `os.exec*` in the script close (exec: flush) the trace first. SIGTERM
    while the script runs closes the trace and ends the process where the script is
    (`Termination`); `sigterm_ends_process=False` (`check`, which has its own clean-up)
    raises it into the script instead, and returns -15.

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
    old_term = signal.signal(signal.SIGTERM, on_sigterm) if main_thread() else None
    if old_term is not None:
        term_before.append(old_term)
    ends = ProcessEnds(rec)
    termination = Termination(ends.stop, script, rec.session)
    watch = term_watch.TermWatch(termination.stop_from_watch, exit_by_signal, on_sigterm,
                                 rec.signals_taken)
    try:
        # the frames below the script and the recorder's own never count against the
        # script's recursion budget (capture/budget.py)
        std = _std_files()
        with LostInterrupts(rec.writer), ends, watch, budget.Shift(budget.below_script()):
            try:
                # SIGTERM ends the process where the script is
                with termination if sigterm_ends_process else contextlib.nullcontext():
                    runpy.run_path(script, run_name="__main__")
            finally:
                _drop_lost_std(std)
    except SystemExit as exc:
        end = {"status": "sys.exit", "exit_code": exit_status(exc.code, sys.stderr)}
        message = exit_message(exc.code)
        if message is not None:
            end["message"] = message
    except KeyboardInterrupt as exc:
        tb = script_traceback(exc)
        end = {"status": "interrupted (SIGINT)", "exit_code": 130, "exception": "KeyboardInterrupt",
               "traceback": tb[-20000:], "signal": int(signal.SIGINT)}
        print("KeyboardInterrupt", file=sys.stderr)
    except UnsupportedJax as exc:   # JAX imported by the script, outside the supported range
        print(f"tracediff: error: {exc}", file=sys.stderr)
        end = {"status": "unsupported jax", "exit_code": 2, "exception": "UnsupportedJax",
               "message": str(exc)[:2000]}
    except _Terminated as exc:
        end = {"status": "terminated (SIGTERM)", "exit_code": 143, "exception": "SIGTERM",
               "traceback": script_traceback(exc, "Terminated by SIGTERM\n")[-20000:],
               "signal": int(signal.SIGTERM)}
    except BaseException as exc:  # the script's own error: report it as Python would
        tb = script_traceback(exc)
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
                if term_before:
                    term_before.pop()
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


def script_traceback(exc, last_line=None):
    """The script's traceback without tracediff's and runpy's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if script_frame(f.filename)]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames),
             *([last_line] if last_line else traceback.format_exception_only(type(exc), exc))]
    return "".join(lines)
