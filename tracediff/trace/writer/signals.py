"""Signal handlers held back while the writer is inside HDF5 (`_signals_deferred`).

A Python handler runs between any two bytecodes, so one that raises (Ctrl-C, SIGTERM, a
script's own) could fail one of HDF5's writes half-way, which HDF5 cannot recover from:
the writer's entry points note signals meanwhile and deliver them once HDF5 has returned.
`installed_handler` tells other threads (term_watch.py) which handler is the process's.

A child the process forks gets the script's handlers, never tracediff's: the signals Python
handles are blocked in the forking thread across the fork (`hold_for_fork`), and the child
lets them through only once its handlers are the script's again (`settle_in_child`: the
deferral's stand-ins, and whatever upper layers registered with `on_fork_in_child`).
Otherwise a signal sent to a child that is still starting (a fork Pool terminated at
once) ran tracediff's handler there, and wrote to the parent's wakeup socket.
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


# -- fork ------------------------------------------------------------------------------------

_in_child = []   # callables a forked child runs before its signals are let through
_masks = {}      # forking thread's ident -> its signal mask before `hold_for_fork`


def on_fork_in_child(fn):
    """Run FN in every child the process forks, after the writer's own fork hook and before
    any signal sent to the child meanwhile is delivered (register once per process)."""
    _in_child.append(fn)


def hold_for_fork():
    """In the forking thread, just before fork: block the signals that Python handles, so
    that none runs a handler of tracediff's in the child before `settle_in_child` (between
    fork and the child's hooks, the child's handlers are still the parent's: SIGTERM's
    raised into a starting Pool worker, which printed a traceback, and its wakeup byte
    reached the parent's term_watch, which then killed the parent)."""
    if not hasattr(signal, "pthread_sigmask"):
        return
    try:
        held = [s for s in _CATCHABLE if callable(installed_handler(s))]
        if held:
            _masks[threading.get_ident()] = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (ValueError, OSError):
        pass


def release_in_parent():
    """In the parent after fork: the forking thread's mask as it was."""
    _unmask(_masks.pop(threading.get_ident(), None))


def settle_in_child():
    """In a forked child: the script's handlers back in place of the deferral's stand-ins
    (a thread forked while the main thread was in HDF5), the upper layers' `on_fork_in_child`
    (tracediff's SIGTERM handler swapped for the script's), then the signals let through."""
    mask = _masks.pop(threading.get_ident(), None)
    _masks.clear()
    try:
        for sig, handler in list(_held.items()):
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError, TypeError, RuntimeError):
                pass
        _held.clear()
        for fn in _in_child:
            try:
                fn()
            except Exception:
                pass
    finally:
        _unmask(mask)


def _unmask(mask):
    if mask is not None:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        except (ValueError, OSError):
            pass
