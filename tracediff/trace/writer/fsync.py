"""The end of a pipelined flush in a thread (`_Fsync`): the whole chunks of value bytes
left to it, then the fsync of the trace, while the program computes on; the commit that
follows waits for it (flushing.py).
"""

import os
import threading

from .trace_file import _dont_need


class _Fsync:
    """The end of a pipelined flush's phase 1, in a thread: the whole chunks of value
    bytes HDF5 placed and left to it (`writes`, `TraceFile.behind`: each run of adjacent
    ones one os.pwritev), then an fsync of the trace on a duplicate of its descriptor
    (both let go of the GIL: the program computes on). `wait` returns once the data is
    on disk, raising what the writes or the fsync raised; where no thread or duplicate
    can be had, they happen at once.

    The chunks go through the trace's own descriptor, checked before each run
    (`TraceFile._fd`); the script's `os.close`, `os.closerange` and `os.dup2` of that
    number wait for the thread first (`_guard_descriptors`). The script may close the
    duplicate while the thread runs (`os.closerange(3, 4096)` closes every number, ours
    included) and may get the number back for a file of its own. Then the thread's
    fsync failed (EBADF) or synced the script's file: neither says anything about the
    trace, so `wait` syncs it again through `TraceFile.sync`, which reopens the trace by
    path (seen in CI: the EBADF was taken for a write error and the trace was cut after
    0 events)."""

    def __init__(self, trace_file, writes=(), sync=True):
        self.error = None
        self.thread = None
        self.again = False      # the thread's fsync did not reach the trace
        self.trace_file = trace_file
        self.writes = writes
        fd = trace_file._fd()
        if fd is None:      # discarding: nothing of ours to write or sync
            self.writes = ()
            return
        dup = None
        if sync:
            try:
                dup = os.dup(fd)
            except OSError:
                self.again = True   # synced by `wait`, after the writes
        if dup is None and not writes:
            return
        self.ident = trace_file.ident
        self.thread = threading.Thread(target=self._run, args=(dup,), daemon=True,
                                       name="tracediff-fsync")
        try:
            self.thread.start()
        except RuntimeError:   # interpreter shutting down
            self.thread = None
            self._run(dup)

    def _is_trace(self, fd):
        try:
            st = os.fstat(fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.ident

    def _run(self, fd):
        if self.writes:
            try:
                self.trace_file.write_behind(self.writes)
            except Exception as exc:   # disk full, I/O error: the next commit raises it
                self.error = exc
                if fd is not None and self._is_trace(fd):
                    os.close(fd)
                return
        if fd is None:
            return
        try:
            os.fsync(fd)
        except OSError as exc:
            error = exc
        else:
            error = None
        if not self._is_trace(fd):   # closed under us, maybe reused: not ours to close
            self.again = True
            return
        if error is not None:
            self.error = error
        else:
            _drop_cached(fd)
        os.close(fd)

    def join(self):
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()

    def wait(self):
        self.join()
        if self.error is not None:
            raise self.error
        if self.again:
            self.trace_file.sync()


def _drop_cached(fd):
    """Let the kernel drop the trace's pages from its cache once they are on disk.

    A recording writes GBs that nobody reads back soon; left in the page cache they take
    fresh memory for every new page. On a VM whose host hands memory in lazily, a
    first touch costs up to ~50 us a page (the JAX MLP at full: 12 s of system time for
    1.9 GB); the pages dropped here are the ones the next flush reuses."""
    _dont_need(fd, 0, 0)
