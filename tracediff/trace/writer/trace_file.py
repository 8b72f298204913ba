"""The trace file as HDF5 writes it (`TraceFile`, h5py's `fileobj` driver), and the
positioned reads and writes under it.

The recorded script owns the process, and may fork, close every file descriptor or
delete the trace (docs/multiprocess.md, docs/format.md "Recording an unfriendly
script"): HDF5 writes through `TraceFile`, which checks before every write that its
descriptor is still the trace's, never writes from a forked child, and says when the
trace was lost. Whole chunks a pipelined flush leaves behind are written by the fsync's
thread (`write_behind`, fsync.py); the disk is started on large writes at once
(`_start_writeback`, settings.EARLY_WRITEBACK).
"""

import os
import stat

import numpy as np

from . import settings
from .process_hooks import _live_files


class TraceFile:
    """The trace file as HDF5 sees it (h5py's `fileobj` driver): positioned reads and
    writes on a descriptor of our own, checked before every call.

    - A script may close the descriptor (`os.closerange(3, 4096)`) and get its number
      back for a file of its own. Before each read or write the descriptor's device,
      inode and size are compared with the trace's as of our last write (device and
      inode alone are not enough: once the script closed the descriptor of a trace it
      deleted, the next file it creates can get the same inode number; the mtime is not
      used, network file systems update it after the write returns). If they
      differ, that number is never used again (nor closed): the trace is opened again
      by its path when the path still holds it (`reopened` counts it), otherwise `lost`
      says why and writes go nowhere.
    - `discard()` (a forked child, a lost trace): writes and truncations are dropped.
    - `check_path()`: has the path been deleted or replaced since the file was opened?
    """

    def __init__(self, path):
        # absolute (the script may chdir) and resolved (reopening follows no symlink)
        self.path = os.path.realpath(path)
        self.shown = os.fspath(path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | _O_FLAGS, 0o666)
        st = os.fstat(self.fd)
        self.ident = (st.st_dev, st.st_ino)
        self.stamp = _stamp(st)
        self.pos = 0
        self.end = 0               # file size as far as we know (for seeks from the end)
        self.reopened = 0
        self.lost = None
        self.discarding = False
        self.pid = os.getpid()
        self.behind = None   # a list while a flush leaves its whole chunks to `_Fsync`
        self.expect = None   # the chunk HDF5 is writing: left behind if handed on as it is
        _live_files.add(self)

    # -- the descriptor --------------------------------------------------------------------
    def _is_trace(self, st):
        return (st.st_dev, st.st_ino) == self.ident and _stamp(st) == self.stamp

    def _ours(self, fd):
        try:
            return self._is_trace(os.fstat(fd))
        except OSError:
            return False

    def _restamp(self, fd):
        self.stamp = _stamp(os.fstat(fd))

    def _fd(self):
        """Our descriptor for I/O, reopened by path if the script closed it; None when
        writes must go nowhere."""
        if self.discarding or self.fd is None:
            return None
        if os.getpid() != self.pid:     # a forked child the fork hook did not reach
            self.discard()
            return None
        if self._ours(self.fd):
            return self.fd
        self.fd = None                  # never touch that number again: it is the script's
        why = "the script closed the trace's file descriptor"
        try:
            st = os.stat(self.path, follow_symlinks=False)
            if not self._is_trace(st) or not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError
            fd = os.open(self.path, os.O_RDWR | _O_FLAGS | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return self._lose(f"{why} and {self.shown} {self._path_state()}")
        if not self._ours(fd):
            os.close(fd)
            return self._lose(f"{why} and {self.shown} {self._path_state()}")
        self.fd = fd
        self.reopened += 1
        return fd

    def _path_state(self):
        try:
            os.stat(self.path, follow_symlinks=False)
        except OSError:
            return "was deleted"
        return "was replaced"

    def _lose(self, why):
        if self.lost is None:
            self.lost = why
        self.discard()
        return None

    def discard(self):
        """From now on, writes and truncations go nowhere (reads still see the file)."""
        self.discarding = True

    def check_path(self):
        """Why the path no longer holds this file (deleted, replaced), or None."""
        if self.lost:
            return self.lost
        try:
            st = os.stat(self.path)
        except OSError:
            return f"{self.shown} was deleted during recording"
        if (st.st_dev, st.st_ino) != self.ident:
            return f"{self.shown} was replaced during recording"
        return None

    def at_path(self):
        return self.check_path() is None

    def size(self):
        fd = self._fd()
        return os.fstat(fd).st_size if fd is not None else self.end

    def sync(self):
        fd = self._fd()
        if fd is not None:
            os.fsync(fd)

    def close(self):
        """Close our descriptor, only if it still is ours."""
        fd, self.fd = self.fd, None
        if fd is not None and os.getpid() == self.pid and self._ours(fd):
            os.close(fd)

    # -- the file object h5py's fileobj driver calls ----------------------------------------
    def seek(self, pos, whence=0):
        if whence == 0:
            self.pos = pos
        elif whence == 1:
            self.pos += pos
        else:
            self.pos = self.size() + pos
        return self.pos

    def tell(self):
        return self.pos

    def readinto(self, buf):
        view = memoryview(buf).cast("B")
        fd = self._fd() if not self.discarding else (self.fd if self.fd is not None and
                                                     self._ours(self.fd) else None)
        n = 0
        if fd is not None:
            while n < len(view):
                chunk = _pread_into(fd, view[n:], self.pos + n)
                if chunk <= 0:
                    break
                n += chunk
        view[n:] = bytes(len(view) - n)   # past the end (or nothing to read): zeros
        self.pos += len(view)
        return len(view)

    def read(self, size=-1):
        if size is None or size < 0:
            size = max(self.size() - self.pos, 0)
        buf = bytearray(size)
        self.readinto(buf)
        return bytes(buf)

    def write(self, data):
        view = memoryview(data).cast("B")
        if self.behind is not None and self.expect is not None and \
                _same_buffer(view, self.expect):
            self.behind.append((self.pos, self.expect))   # `write_behind` writes it
            self.pos += len(view)
            self.end = max(self.end, self.pos)
            return len(view)
        fd = self._fd()
        if fd is not None:
            n = 0
            while n < len(view):
                n += _pwrite(fd, view[n:], self.pos + n)
            if n >= settings.CHUNK_BYTES:
                _start_writeback(fd, self.pos, n)
            # the size our write leaves, without an fstat (~0.3 ms of a 17 ms TPU v5e
            # step at full); a change by anyone else still fails the next `_ours`
            self.stamp = max(self.stamp, self.pos + n)
        self.pos += len(view)
        self.end = max(self.end, self.pos)
        return len(view)

    def write_behind(self, writes):
        """In `_Fsync`'s thread: the chunks a flush left ((offset, uint8 array) pairs),
        each run of adjacent ones in as few calls as `WRITEBACK_BYTES` allows, the disk
        starting on each as it is written."""
        run, start, at = [], None, None    # the run's chunks, and where it starts and ends
        for offset, data in list(writes) + [(None, None)]:
            if run and (offset != at or at - start >= settings.WRITEBACK_BYTES):
                fd = self._fd()
                if fd is None:      # discarding, or lost: nowhere to write
                    return
                self.stamp = max(self.stamp, _write_all(fd, run, start))
                _start_writeback(fd, start, at - start)
                run = []
            if data is not None:
                if not run:
                    start = offset
                run.append(memoryview(data).cast("B"))
                at = offset + len(run[-1])

    def truncate(self, size=None):
        size = self.pos if size is None else size
        fd = self._fd()
        if fd is not None:
            os.ftruncate(fd, size)
            self._restamp(fd)
        self.end = size
        return size

    def flush(self):
        pass


def _stamp(st):
    return st.st_size


# not inherited by programs the script starts; binary on Windows
_O_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _pread_into(fd, view, offset):
    if hasattr(os, "preadv"):
        return os.preadv(fd, [view], offset)
    if hasattr(os, "pread"):
        data = os.pread(fd, len(view), offset)
    else:  # Windows
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, len(view))
    view[:len(data)] = data
    return len(data)


def _start_writeback(fd, offset, length):
    """Have the disk start writing these bytes now (`EARLY_WRITEBACK`), without waiting:
    POSIX_FADV_DONTNEED starts the writeback of a range's dirty pages (and drops the
    clean ones, none of which a recording reads back)."""
    if settings.EARLY_WRITEBACK:
        _dont_need(fd, offset, length)


def _dont_need(fd, offset, length):
    """POSIX_FADV_DONTNEED of a range (length 0: to the end), where the system has it."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        try:
            advise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def _same_buffer(view, array):
    """Does `view` (what HDF5 hands `TraceFile.write`) show `array`'s memory?"""
    return len(view) == array.nbytes and \
        np.frombuffer(view, np.uint8).ctypes.data == array.ctypes.data


_IOV_MAX = 1024


def _write_all(fd, views, offset):
    """Write `views` one after the other at `offset`, in as few calls as the system takes;
    returns the offset after them."""
    views = list(views)
    while views:
        if hasattr(os, "pwritev"):
            n = _pwritev(fd, views[:_IOV_MAX], offset)
        else:
            n = _pwrite(fd, views[0], offset)
        if n <= 0:
            raise OSError(f"a write of the trace returned {n}")
        offset += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]
    return offset


def _pwritev(fd, views, offset):
    return os.pwritev(fd, views, offset)


def _pwrite(fd, view, offset):
    if hasattr(os, "pwrite"):
        return os.pwrite(fd, view, offset)
    os.lseek(fd, offset, os.SEEK_SET)   # Windows
    return os.write(fd, view)
