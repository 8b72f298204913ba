"""Flushing: buffered rows and bytes written, then committed, so the file on disk is
consistent at every instant (docs/format.md, "Durability").

A writer can die at any instant (SIGKILL, power loss, full disk):

- HDF5's metadata cache never writes between flushes (evictions are disabled,
  `_no_metadata_evictions`), so the structures on disk only change inside `flush`;
- `flush` writes in two phases: first the new data (strings, blob, tables) and an
  `H5Fflush` (and an `fsync`), then the `committed_*` counts on the root and a second
  `H5Fflush`. A reader trusts only committed rows, so a writer killed during phase one
  leaves the previous commit intact, one killed during phase two the new one. The
  flushes the buffers' thresholds start are pipelined with the disk (`_auto_flush`): the
  fsync runs in a thread (with write-behind, `settings.WRITE_BEHIND`, after the whole
  chunks of value bytes, which that thread then writes: HDF5 placed them, the program
  computes on while they are written), and phase two waits for it at the next flush; the
  disk is started on each whole chunk as it is written (`settings.EARLY_WRITEBACK`), not
  at the fsync;
- `flush` restarts from the committed counts, so an exception raised into it (Ctrl-C,
  SIGTERM) and a later retry cannot leave gaps or duplicated rows;
- besides the row and byte thresholds, `flush` runs at least every
  `settings.FLUSH_SECONDS` while events come in, so a killed run loses at most a few
  seconds; the byte threshold starts at `settings.FIRST_FLUSH_BYTES` and doubles up to
  `settings.FLUSH_BYTES`, so the first values are committed early even when they arrive
  faster than the clock flushes them (and before a small disk or file size limit is
  reached);
- a write error (disk full, file size limit, I/O error) stops recording instead of
  reaching the script: the writer closes, `error` says why, the file keeps its last
  commit, and `close` adds the reason to the manifest when the disk lets it (closing.py).

A part of `TraceWriter` (writer/__init__.py).
"""

import contextlib
import os
import shutil
import time

try:
    import resource
except ImportError:  # Windows
    resource = None

import numpy as np

from ...errors import one_line
from .. import schema
from . import settings
from .fsync import _Fsync
from .pending import _PendingBytes, _regions
from .signals import _signals_deferred


class _Flushing:
    """`flush` and the automatic, pipelined flushes; the two phases and their errors."""

    @_signals_deferred
    def flush(self):
        """Write buffered rows and bytes, then advance the committed counts (see the module
        docstring). A write error stops recording; it is never raised to the caller.
        Everything recorded so far is committed when it returns."""
        self._flush(wait=True)

    def _auto_flush(self):
        """The flush the buffers' thresholds ask for, pipelined with the disk: the data is
        written and its fsync started in a thread, and its commit (phase 2) waits for the
        next flush, so the program runs on while the disk writes (a commit still only
        ever counts data already on disk). Inside `held()` it waits for the end (asked
        at every value past a threshold: a flag, not a signal-deferring call each)."""
        if self._held:
            self._flush_wanted = True
            return
        self._pipelined_flush()

    @_signals_deferred
    def _pipelined_flush(self):
        self._flush(wait=not (settings.FSYNC or settings.WRITE_BEHIND))

    @contextlib.contextmanager
    def held(self):
        """No automatic flush inside: rows reserved here (`reserve_value`) are filled
        before the block ends, by hooks that cannot run in the middle (a values program's
        packed result is read only once all its rows are reserved). Before: a flush due by
        time in the middle wrote the rows unfilled and the fill hit a stale handle."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held and self._flush_wanted:
                self._flush_wanted = False
                self._auto_flush()

    def _flush(self, wait):
        if self.closed or self._check_file():
            return
        for hook in self.flush_hooks:
            hook()
        try:
            self._commit_synced()    # the previous flush's data, once its fsync is done
        except Exception as exc:
            self._fail(exc)
            return
        short = self._no_room()
        if short:
            self._stop_cleanly(short)
            return
        try:
            self._write_pending(behind=settings.WRITE_BEHIND and not wait)
            if wait:
                self._commit_synced()
        except Exception as exc:  # disk full, file size limit, I/O error
            self._fail(exc)
        if self._file.lost:       # the flush went nowhere: stop now, not at the next one
            self._check_file()
        self._last_flush = time.monotonic()
        self._flush_bytes = min(2 * self._flush_bytes, settings.FLUSH_BYTES)

    def _no_room(self):
        """Why the next flush may not fit on the disk (free space, file size limit), or None.

        Checked before writing because HDF5 cannot recover from a failed write: measured
        with HDF5 2.0, closing a file after ENOSPC/EFBIG crashes the process."""
        need = len(self._blob) + self._pstats_bytes + settings.RESERVE_BYTES + sum(
            len(rows) * schema.TABLES[name].itemsize for name, rows in self._rows.items()) + \
            sum(len(s) + 16 for s in self._new_strings)
        try:
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(self.path))).free
            if free < need:
                return f"disk full: {free >> 20} MiB free, the next flush needs {need >> 20} MiB"
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0] if resource else -1
            if limit not in (-1, resource.RLIM_INFINITY):
                size = self._file.size()
                if size + need > limit:
                    return f"file size limit: {limit >> 20} MiB (ulimit -f)"
        except OSError:
            return None
        return None

    def _stop_cleanly(self, reason):
        """Stop recording before a flush that may not fit, writing nothing more: HDF5's
        close goes nowhere (`TraceFile.discard`), so the file stays exactly as its last
        commit left it. (Closing it for real writes metadata; on a disk another process
        is filling, that write failed half-way and left a file that no longer opened.)"""
        self.error = reason
        self._drop_buffers()
        self._file.discard()
        try:
            self._f.close()
        except Exception:
            pass
        self.closed = True

    def _write_pending(self, behind=False):
        """Phase 1; `behind`: the blob's whole chunks left to the thread that fsyncs
        (`_Fsync`), which the next flush waits for before its commit."""
        f = self._f
        # Phase 1: data past the committed counts. Each write starts from the counts on
        # disk, so redoing an interrupted flush overwrites instead of appending twice.
        if self._new_strings:
            n, k = self._n_strings, len(self._new_strings)
            ds = f["strings"]
            ds.resize((n + k,))
            ds[n:n + k] = np.array(self._new_strings, dtype=object)
            self._n_strings, self._new_strings = n + k, []
        if self._pstats:
            self._reduce_stats()
        writes = []
        if self._blob:
            n, k = self._blob_written, len(self._blob)
            ds = f["blob"]
            ds.resize((n + k,))
            self._file.behind = writes if behind else None
            try:
                self._write_blob(ds, n, self._blob.pieces(), k)
            finally:
                self._file.behind = None
            self._blob_written = n + k
            if writes:   # they may point into its buffer: the next flush fills the other
                self._blob, self._spare_blob = self._spare_blob or _PendingBytes(), self._blob
            else:
                self._blob.clear()
        for name, dt in schema.TABLES.items():
            rows = self._rows[name]
            if not rows:
                continue
            n, k = self._counts[name], len(rows)
            ds = f[name]
            ds.resize((n + k,))
            ds[n:n + k] = np.array(rows, dtype=dt)
            self._counts[name], self._rows[name] = n + k, []
        f.flush()
        counts = dict(self._counts, blob=self._blob_written, strings=self._n_strings)
        self._synced = (counts, _Fsync(self._file, writes, settings.FSYNC)
                        if settings.FSYNC or writes else None)

    def _write_blob(self, ds, n, pieces, k):
        """Write `k` bytes, the concatenation of `pieces` (uint8 arrays, taken one by one as
        the writing reaches them), at byte `n` of the blob. Whole chunks of an unfiltered
        blob go to HDF5 as chunks (`write_direct_chunk`: no copy through the chunk cache,
        ~0.7 s per GB less, measured), straight from the piece that holds them where one
        does; the partial chunks at either end and the chunks pieces share are joined
        first, then written."""
        head = min(k, -n % settings.CHUNK_BYTES)
        whole = (k - head) // settings.CHUNK_BYTES
        tail = k - head - whole * settings.CHUNK_BYTES
        if self._blob_filter or whole == 0 or not hasattr(ds.id, "write_direct_chunk"):
            pieces = list(pieces)
            ds[n:n + k] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            return
        sizes = ([head] if head else []) + [settings.CHUNK_BYTES] * whole + ([tail] if tail else [])
        at = n
        for size, parts in zip(sizes, _regions(pieces, sizes)):
            data = parts[0] if len(parts) == 1 else np.concatenate(parts)
            if size == settings.CHUNK_BYTES:
                self._file.expect = data     # written behind if HDF5 hands it on as it is
                try:
                    ds.id.write_direct_chunk((at,), data)
                finally:
                    self._file.expect = None
            else:
                ds[at:at + size] = data
            at += size

    def _commit_synced(self):
        """Phase 2 of the last `_write_pending`, if not done yet: wait for its fsync
        (raising the fsync's error), then write the counts a reader trusts."""
        if self._synced is None:
            return
        counts, sync = self._synced
        if sync is not None:
            sync.wait()
            if sync.writes and self._spare_blob is not None:
                self._spare_blob.clear()   # written: its buffer is free for reuse
        self._synced = None
        self._commit(counts)

    def _quiet(self):
        """Wait until no chunk is being written behind (before the program's thread
        touches the file, forks, closes the trace's descriptor or exits): an error
        there is raised by the commit that follows."""
        sync = self._synced[1] if self._synced is not None else None
        if sync is not None and sync.writes:
            sync.join()

    def _commit(self, counts):
        # Phase 2: the counts a reader trusts, written only once phase 1 is on disk.
        f = self._f
        for name in schema.TABLES:
            f.attrs[f"committed_{name}"] = counts[name]
        f.attrs["committed_blob"] = counts["blob"]
        f.attrs["committed_strings"] = counts["strings"]
        f.attrs["last_flush_unix"] = time.time()
        f.flush()
        self._committed_events = counts["events"]
        self.flushes += 1

    def _fail(self, exc):
        """A write failed although `_no_room` found room (another process filled the disk,
        an I/O error). The HDF5 file is left unclosed: closing it now can crash the
        process (HDF5 2.0); `tracediff record` then exits without closing it."""
        self.error = one_line(exc, 200, with_type=True)
        self.closed = True
        self.unclosed = True
        self._file.discard()     # whatever HDF5 writes from now on would go half-way
        self._drop_buffers()


def _no_metadata_evictions(f):
    """Keep HDF5's dirty metadata in memory until `flush`: evicting it between flushes
    writes index nodes whose neighbours are not on disk yet (measured: a writer killed
    at random then leaves files that fail with "len exceeds EOA")."""
    try:
        cfg = f.id.get_mdc_config()
        cfg.incr_mode = cfg.flash_incr_mode = cfg.decr_mode = 0
        cfg.evictions_enabled = False
        f.id.set_mdc_config(cfg)
    except Exception:  # an HDF5 without this control: flushes still order the writes
        pass
