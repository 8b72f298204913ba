"""Signal handlers held back while the writer is inside HDF5 (`_signals_deferred`).

A Python handler runs between any two bytecodes, so one that raises (Ctrl-C, SIGTERM, a
script's own) could fail one of HDF5's writes half-way, which HDF5 cannot recover from:
the writer's entry points note signals meanwhile and deliver them once HDF5 has returned.
`installed_handler` tells other threads (term_watch.py) which handler is the process's.
"""

import functools
import signal
import sys
import threading


def _signals_deferred(method):
    """Run `method` with the process's Python signal handlers held back, then call them.

    HDF5 writes through `TraceFile`, Python code, and Python runs a signal handler
    between any two bytecodes: a Ctrl-C or SIGTERM (or a script's own handler that
    raises) would otherwise raise inside one of HDF5's writes, failing it in the middle
    of an HDF5 operation, which HDF5 cannot recover from. While the writer is in HDF5,
    every handler installed from Python is replaced by one that notes the signal; the
    originals are put back and called (raising KeyboardInterrupt, ...) once HDF5 has
    returned. Handlers only ever run in the main thread, so other threads skip this.
    Meanwhile `installed_handler` still tells another thread which handler is the process's."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return method(self, *args, **kwargs)
        caught, saved = [], {}

        def note(signum, frame):
            caught.append(signum)

        try:
            for sig in _CATCHABLE:
                handler = signal.getsignal(sig)
                if callable(handler):
                    outer = _held.setdefault(sig, handler) is handler
                    try:
                        signal.signal(sig, note)
                    except (ValueError, OSError, RuntimeError):
                        if outer:
                            del _held[sig]
                        continue
                    saved[sig] = handler
            return method(self, *args, **kwargs)
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
                if _held.get(sig) is handler:   # the outermost deferral: nothing held now
                    del _held[sig]
            for signum in caught:
                saved[signum](signum, sys._getframe())

    return wrapper


_held = {}   # signal -> the process's handler, while `_signals_deferred` holds it back


def installed_handler(sig):
    """The Python handler of SIG (as `signal.getsignal`), from any thread: the one held
    back while the writer is in HDF5, not the stand-in that notes the signal meanwhile."""
    held = _held.get(sig)
    return held if held is not None else signal.getsignal(sig)


_CATCHABLE = tuple(s for s in getattr(signal, "valid_signals", lambda: ())()
                   if s not in (getattr(signal, "SIGKILL", None), getattr(signal, "SIGSTOP", None)))
