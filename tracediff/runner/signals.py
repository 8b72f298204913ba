"""Exit status and signals: the status Python gives `sys.exit(code)`, tracediff's SIGTERM
handler (and the script's own handed back to a child the script forks), a Ctrl-C that
Python swallowed handed back to the script (`LostInterrupts`), and ending this process
by a signal as the plain script would have ended (`exit_by_signal`). term_watch.py takes
SIGTERM while the main thread is blocked in a C call, with `on_sigterm` and
`exit_by_signal` from here.
"""

import ctypes
import os
import signal
import struct
import sys

from .. import term_watch
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
    term_watch.taken.set()      # the main thread took it: the watch thread stands down
    raise _Terminated()


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
    import threading

    return threading.current_thread() is threading.main_thread()
