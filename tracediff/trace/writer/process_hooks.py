"""What the writer does for the whole process: a forked child never writes its parent's
trace (`_after_fork_in_child`), traces HDF5 still holds at exit are closed writing
nothing (`_close_at_exit`), and the script's `os.close`, `os.closerange` and `os.dup2`
of a trace's descriptor wait for the chunks written behind, while tracediff's own
descriptors (`reserve_descriptor`) are not the script's to close (`_guard_descriptors`).

Registered once per process (os.register_at_fork hooks cannot be removed); they find
the live writers and files through the weak sets `_live_writers` and `_live_files`.
"""

import atexit
import errno
import functools
import os
import weakref

from .signals import hold_for_fork, release_in_parent, settle_in_child


# Writers and files of this process. A forked child (a DataLoader worker, a fork Pool, a
# script's own os.fork) inherits them; the hook below stops the child from writing the
# parent's trace, flushing it or closing it (os.register_at_fork hooks cannot be removed:
# one hook for the process, whatever number of recordings it makes).
_live_writers = weakref.WeakSet()
_live_files = weakref.WeakSet()


def _before_fork():
    """No chunk is written behind while the process forks: the child would not have the
    thread, and its copy of the buffers would be half written. Then the signals Python
    handles wait until the child's handlers are the script's (signals.hold_for_fork)."""
    try:
        for w in list(_live_writers):
            w._quiet()
    finally:
        hold_for_fork()


def _after_fork_in_child():
    try:
        for tf in list(_live_files):
            tf.discard()
        for w in list(_live_writers):
            w._after_fork_in_child()
    finally:
        settle_in_child()


def _close_at_exit():
    """Close, writing nothing, every trace file HDF5 still has open when Python exits
    (a forked child's copy of the parent's, a recording that never stopped): HDF5 would
    close them after Python has finalized, through h5py's file-object driver, which
    crashes the process (measured: SIGSEGV, exit status 139 instead of the script's).
    A trace closed this way keeps its last commit (`complete` False, like a killed run)."""
    for w in list(_live_writers):
        f = getattr(w, "_f", None)
        try:
            w._quiet()
            if f is None or not f.id.valid:
                continue
            w._file.discard()
            f.close()
        except Exception:
            pass


def _quiet_writers(closes):
    """Wait for the chunks written behind by the writers whose descriptor `closes`."""
    for w in list(_live_writers):
        fd = w._file.fd
        if fd is not None and closes(fd):
            w._quiet()


# Descriptors of tracediff's own that the script never had (term_watch's sockets), by the
# process that owns them: the script's `os.closerange` leaves them open, its `os.close`
# of one fails as it would in the plain script (EBADF). A forked child's are not kept.
_reserved = {}


def reserve_descriptor(fd):
    _guard_descriptors()
    _reserved[fd] = os.getpid()


def release_descriptor(fd):
    _reserved.pop(fd, None)


def _reserved_here():
    pid = os.getpid()
    return sorted(fd for fd, owner in list(_reserved.items()) if owner == pid)


def _guard_descriptors():
    """The script's `os.close`, `os.closerange` and `os.dup2` of a trace's descriptor
    number first wait for the chunks a thread is writing behind (`_Fsync`). Otherwise the
    script could close the number between the thread's check that it is the trace's
    (`TraceFile._fd`) and its write, and even get it back for a file of its own, which
    the write would then change. A reserved descriptor (`reserve_descriptor`) is not the
    script's to close. Process-wide and once, like the fork hook; other numbers go
    straight through."""
    if getattr(os.close, "_tracediff_guard", False):
        return
    real_close, real_closerange, real_dup2 = os.close, os.closerange, os.dup2

    @functools.wraps(real_close)
    def close(fd):
        if fd in _reserved_here():
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        _quiet_writers(lambda n: n == fd)
        return real_close(fd)

    @functools.wraps(real_closerange)
    def closerange(fd_low, fd_high):
        _quiet_writers(lambda n: fd_low <= n < fd_high)
        for fd in _reserved_here():
            if fd_low <= fd < fd_high:
                real_closerange(fd_low, fd)
                fd_low = fd + 1
        return real_closerange(fd_low, fd_high)

    @functools.wraps(real_dup2)
    def dup2(fd, fd2, inheritable=True):
        _quiet_writers(lambda n: n == fd2)
        return real_dup2(fd, fd2, inheritable)

    for wrapper in (close, closerange, dup2):
        wrapper._tracediff_guard = True
        setattr(os, wrapper.__name__, wrapper)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=release_in_parent,
                        after_in_child=_after_fork_in_child)
atexit.register(_close_at_exit)
