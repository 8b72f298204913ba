"""Exit status and signals: the status Python gives `sys.exit(code)`, tracediff's SIGTERM
handler (`on_sigterm`: while the script runs, `Termination` ends the process where the
script is; the script's own handler handed back to a child the script forks), a Ctrl-C
that Python swallowed handed back to the script (`LostInterrupts`), and ending this
process by a signal as the plain script would have ended (`exit_by_signal`).
term_watch.py takes SIGTERM while the main thread is blocked in a C call, with
`on_sigterm` and `exit_by_signal` from here.
"""

import ctypes
import os
import signal
import struct
import sys
import threading
import traceback

from .. import term_watch
from .recording import TOOL_DIR
from ..trace.writer import on_fork_in_child


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


def exit_message(code):
    """What `sys.exit(code)` printed, for the manifest (None for an int or None)."""
    if code is None or isinstance(code, int):
        return None
    try:
        return str(code)[:2000]
    except Exception:
        return type(code).__name__


class _Terminated(BaseException):
    pass


def on_sigterm(signum, frame):
    """tracediff's SIGTERM handler: while the script runs, its `Termination` ends the
    process (now, or once tracediff's own frames have returned); before or after the
    script, an exception `record_script` catches, which closes the trace."""
    if _running and _running[-1].take(frame):
        return
    term_watch.taken.set()      # the main thread took it: the watch thread stands down
    raise _Terminated()


_running = []   # the `Termination` of the script `record_script` is running


class Termination:
    """SIGTERM taken by tracediff's handler while the script runs ends the process where
    the script is, as SIGTERM's default action ends the plain run: the trace is closed,
    then the process dies by SIGTERM, and nothing of the script runs meanwhile (no
    `finally` block, no `except`, no atexit handler, no thread joined, no buffered output
    flushed). Before, the handler raised an exception into the script: its `finally`
    blocks ran and printed, and a bare `except:` swallowed SIGTERM (the run went on and
    exited 0).

    A signal taken inside tracediff's own frames (the capture between two of the
    script's ops, the writer) waits until they have returned to the program's frame
    below them (a trace function on that frame), so that the trace is closed with no
    half-recorded op; term_watch still ends a run whose main thread does not get there
    within its grace. `stop(end)` closes the trace and says so (runner.closing.ProcessEnds.stop);
    the `session`'s captures are told the process dies where it is (`Session.ends_now`)."""

    def __init__(self, stop, script, session=None):
        self.stop = stop
        self.script = script
        self.session = session
        self.pid = os.getpid()
        self.boundary = None
        self.armed = self.ending = False
        self._claim = threading.Lock()   # one ending: the main thread's or the watch's

    def __enter__(self):
        self.boundary = sys._getframe(1)     # record_script's frame: below it, the script's run
        _running.append(self)
        return self

    def __exit__(self, *exc):
        _running.remove(self)
        if self.armed:   # the script ended before the frame below tracediff's resumed
            self._end(sys._getframe())

    def take(self, frame):
        """SIGTERM in the main thread at FRAME: end the run (now, or armed); False where
        the script is not what runs (a forked child, tracediff before or after it)."""
        if os.getpid() != self.pid or not main_thread():
            return False
        if self.armed or self.ending:
            return True     # a second SIGTERM: the first one's end is on its way
        own, f = None, frame
        while f is not None and f is not self.boundary:
            if self._own(f.f_code.co_filename):
                own = f
            f = f.f_back
        if f is None:
            return False
        if own is None:
            self._end(frame)                # never returns
        self.armed = True
        below = own.f_back
        below.f_trace_opcodes = True        # its next instruction, whatever the line
        below.f_trace = lambda f, event, arg: self._end(f)
        sys.settrace(_untraced)   # tracing on (new frames untraced): `below` gets its events
        return True

    def _own(self, filename):
        """A frame of tracediff's own (its examples and the script are the program's)."""
        return filename.startswith(_OWN) and not filename.startswith(_EXAMPLES) and \
            filename != self.script

    def stop_from_watch(self, end):
        """term_watch's ending (the main thread did not take SIGTERM within its grace):
        the one ending of the run; when the main thread's has begun, that one ends it."""
        if not self._claim.acquire(blocking=False):
            threading.Event().wait()
        self.stop(end)

    def _end(self, frame):
        if self.ending:     # `below` again, or SIGTERM again, while this one closes the trace
            return
        self.ending = True
        sys.settrace(None)
        if not self._claim.acquire(blocking=False):
            threading.Event().wait()        # the watch thread is ending the run
        term_watch.taken.set()
        if self.session is not None:
            self.session.ends_now = True
        frames = []
        while frame is not None and frame is not self.boundary:   # the script's run only
            frames.append((frame, frame.f_lineno))
            frame = frame.f_back
        stack = [f for f in traceback.StackSummary.extract(reversed(frames))
                 if script_frame(f.filename)]
        tb = "".join(["Traceback (most recent call last):\n", *traceback.format_list(stack),
                      "Terminated by SIGTERM\n"])
        self.stop({"status": "terminated (SIGTERM)", "exit_code": 143, "exception": "SIGTERM",
                   "traceback": tb[-20000:], "signal": int(signal.SIGTERM)})
        exit_by_signal(signal.SIGTERM, finalize=False)


def _untraced(frame, event, arg):
    return None


_OWN = TOOL_DIR + os.sep
_EXAMPLES = os.path.join(TOOL_DIR, "examples") + os.sep


def script_frame(filename):
    """A frame of the script's (or a library's): neither tracediff's nor runpy's."""
    return not filename.startswith(TOOL_DIR) and "runpy" not in os.path.basename(filename)


# SIGTERM's handler before `record_script` installed `on_sigterm`: a child the script
# forks gets it back (the plain script's child has no tracediff handler; a fork Pool's
# workers, terminated by SIGTERM, would print a traceback each). The writer's fork hook
# runs this before any signal sent to the child is let through (trace.writer.signals).
term_before = []


def _after_fork_in_child():
    term_watch.forget_in_child()
    if not term_before:
        return
    try:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, term_before[-1])
    except (ValueError, OSError, TypeError):
        pass


on_fork_in_child(_after_fork_in_child)


def exit_by_signal(signum, finalize=True):
    """End this process killed by SIGNUM, as the plain script's would have ended (a parent
    sees -SIGNUM, a shell 128+SIGNUM). SIGINT: as Python ends on an uncaught
    KeyboardInterrupt, after joining threads, running atexit handlers and flushing
    sys.stdout; SIGTERM's default action ends a process at once, the script's buffered
    output unwritten. Never returns."""
    if finalize and signum == signal.SIGINT:
        import atexit

        try:
            threading._shutdown()
        except Exception:
            pass
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):   # Python's finalization flushes them
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
    if main_thread():
        signal.signal(signum, signal.SIG_DFL)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(int(signum), None)                     # SIG_DFL is 0


class LostInterrupts:
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


def main_thread():
    return threading.current_thread() is threading.main_thread()
