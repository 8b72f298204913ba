"""Append-only trace writer: rows and bytes are buffered and flushed in chunks.

One HDF5 dataset per table plus one byte arena (`blob`) for all values: creating a
dataset per tensor was measured 10-170x slower.

Durability (docs/format.md, "Durability"): a writer can die at any instant (SIGKILL,
power loss, full disk), so the file on disk must be consistent at every instant:

- HDF5's metadata cache never writes between flushes (evictions are disabled), so the
  structures on disk only change inside `flush`;
- `flush` writes in two phases: first the new data (strings, blob, tables) and an
  `H5Fflush` (and an `fsync`), then the `committed_*` counts on the root and a second
  `H5Fflush`. A reader trusts only committed rows, so a writer killed during phase one
  leaves the previous commit intact, one killed during phase two the new one. The
  flushes the buffers' thresholds start are pipelined with the disk (`_auto_flush`): the
  fsync runs in a thread (with write-behind, `WRITE_BEHIND`, after the whole chunks of
  value bytes, which that thread then writes: HDF5 placed them, the program computes on
  while they are written), and phase two waits for it at the next flush; the disk is
  started on each whole chunk as it is written (`EARLY_WRITEBACK`), not at the fsync;
- `flush` restarts from the committed counts, so an exception raised into it (Ctrl-C,
  SIGTERM) and a later retry cannot leave gaps or duplicated rows;
- besides the row and byte thresholds, `flush` runs at least every `FLUSH_SECONDS` while
  events come in, so a killed run loses at most a few seconds; the byte threshold starts
  at `FIRST_FLUSH_BYTES` and doubles up to `FLUSH_BYTES`, so the first values are
  committed early even when they arrive faster than the clock flushes them (and before a
  small disk or file size limit is reached);
- a write error (disk full, file size limit, I/O error) stops recording instead of
  reaching the script: the writer closes, `error` says why, the file keeps its last
  commit, and `close` adds the reason to the manifest when the disk lets it.

The recorded script owns the process, and may fork, close every file descriptor or
delete the trace (docs/multiprocess.md, docs/format.md "Recording an unfriendly
script"): HDF5 writes through `TraceFile`, which checks before every write that its
descriptor is still the trace's, never writes from a forked child, and says when the
trace was lost.
"""

import atexit
import contextlib
import errno
import functools
import json
import math
import os
import shutil
import signal
import stat
import sys
import threading
import time
import weakref

try:
    import resource
except ImportError:  # Windows
    resource = None

import h5py
import numpy as np

from ...errors import one_line
from .. import codec as codecs, schema, values
from ..sources import LIB_SEP, split_site

FLUSH_ROWS = 20_000
FLUSH_BYTES = 64 << 20
# Small values queued for statistics are reduced once their bytes reach this (not at the
# flush): batches that stay in the CPU's cache, and temporaries that malloc reuses. At
# 64 MB a batch's float64 temporaries were fresh pages on every reduction, and first
# touches of fresh pages cost ~30-50 us a page on this VM (the GRU loop at stats:
# 2.8 s of 5.3 in four reductions).
STATS_BATCH_BYTES = 1 << 20
STATS_MEMO_VALUES = 4096   # large values whose statistics are kept by hash (_add_stats)
FIRST_FLUSH_BYTES = 1 << 20
FLUSH_SECONDS = 2.0
CHUNK_ROWS = 8192
CHUNK_BYTES = 1 << 20
RESERVE_BYTES = 3 * CHUNK_BYTES + (1 << 20)  # chunk allocations and metadata of one flush
FSYNC = os.environ.get("TRACEDIFF_FSYNC", "1") != "0"
# 1: the whole blob chunks of a pipelined flush are written by its fsync's thread
# (write-behind, `TraceFile.behind`), not the program's. Unset: on where the host has
# cores to spare for it (the TPU v5e host, 13 cores: `full` 12.5-12.9 ms a step behind,
# 16.2-17.3 in the program's thread); off on fewer (the 2-core VM: 2x slower there, the
# thread and the program took turns), docs/performance.md
WRITE_BEHIND = os.environ.get("TRACEDIFF_WRITE_BEHIND",
                              "1" if (os.cpu_count() or 1) >= 8 else "0") == "1"
# 1: the disk starts writing a large write's bytes as soon as they are in the page cache
# (`_start_writeback`), as `dd oflag=nocache` does, instead of all of a flush's at its
# fsync: the fsync then waits for the last few MB, not for the whole flush after it was
# copied (on the TPU v5e host, copy then fsync took ~2x dd's time for the same bytes)
EARLY_WRITEBACK = os.environ.get("TRACEDIFF_EARLY_WRITEBACK", "1") != "0"
WRITEBACK_BYTES = 8 << 20   # the bytes written behind between two starts of writeback
# A finished trace at most this big is rewritten without the unused tails of its chunks
# (a 3-op script: ~2.2 MB of empty chunk space -> tens of KB); above it the tails are a
# small part of the file and the rewrite would cost more than it saves.
COMPACT_BELOW = 32 << 20


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


class TraceWriter:
    """Writes one trace file. Not thread-safe: capture code serialises calls.

    `closed` turns True when the trace is closed or recording stopped on a write error
    (`error` then says why); captures stop recording when it does."""

    @_signals_deferred
    def __init__(self, path, manifest, codec="none"):
        """`codec`: "none" or "zstd", the byte arena's compression (trace/codec.py)."""
        self._blob_filter = codecs.blob_filter(codec)   # ValueError before any file is made
        self.path = os.path.abspath(path)   # the script may chdir
        self._file = TraceFile(self.path)
        try:
            self._f = h5py.File(self._file, "w", libver="earliest")
        except BaseException:
            self._file.close()
            raise
        f = self._f
        _no_metadata_evictions(f)
        f.attrs["format"] = schema.FORMAT_NAME
        f.attrs["schema_version"] = schema.SCHEMA_VERSION
        f.attrs["complete"] = False
        for name, dt in schema.TABLES.items():
            f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dt, chunks=(CHUNK_ROWS,))
        f.create_dataset("blob", shape=(0,), maxshape=(None,), dtype="u1", chunks=(CHUNK_BYTES,),
                         **self._blob_filter)
        f.create_dataset("strings", shape=(0,), maxshape=(None,),
                         dtype=h5py.string_dtype("utf-8"), chunks=(4096,))
        self._manifest = dict(manifest)
        f.create_dataset("manifest", data=self._manifest_text(), dtype=h5py.string_dtype("utf-8"))
        self._strings = {}
        self._new_strings = []
        self._rows = {name: [] for name in schema.TABLES}
        self._counts = {name: 0 for name in schema.TABLES}   # rows on disk
        self._blob = _PendingBytes()   # value bytes not yet written
        self._spare_blob = None    # the other one, while a write-behind reads the last
        self._blob_size = 0        # bytes recorded, buffered ones included
        self._blob_written = 0     # bytes on disk
        self._n_strings = 0        # strings on disk
        self._last_flush = time.monotonic()
        self._flush_bytes = FIRST_FLUSH_BYTES
        self._held = 0             # `held()` depth: automatic flushes wait until it ends
        self._flush_wanted = False
        self._synced = None        # (counts, _Fsync) of data written, not yet committed
        self._committed_events = 0
        self.before_event = None   # callable run before each event is appended, or None
        # callable(source) -> (first line, lines text, file sha256) or None, run once per
        # new events.source string: the `sources` table (trace/sources.py)
        self.source_lines = None
        self._source_ids = {None: -1}
        self.bytes_recorded = 0
        self.closed = False
        self.error = None
        self.unclosed = False
        self.lost = None           # why the trace is gone (deleted, replaced), or None
        self.forked = False        # True in a forked child: it never writes (_after_fork)
        self.flushes = 0
        self.compacted = False     # rewritten without chunk tails at close (_compact)
        # --level stats / --max-bytes (docs/format.md, "Levels"): "full" stores every
        # value's bytes; "stats" stores its hash and a stats row instead. Past `max_bytes`
        # of stored bytes, values fall back to stats (`capped_at_event` says where).
        self.level = "full"
        self.max_bytes = None
        self.capped_at_event = None
        self.stats_values = 0
        self._pstats = {}          # (storage, logical) -> [arena, rows, starts, counts, size]
        self._pstats_bytes = 0
        self._arenas = {}          # (storage, logical) -> _StatsArena, kept between batches
        self._stats_memo = {}
        self._shape_ids = {}
        self._slice_digests = {}   # add_shard: digests of the last global value's slices
        self._dtype_ids = {}       # numpy dtype -> (interned name, storage name) for add_array
        # statistics of a batch of values (values.segment_stats's signature); a capture
        # sets its framework's own (capture/torch_stats.py: torch ops on the value's device)
        self.stats_reducer = values.segment_stats
        # the hash of every value's exact bytes (values.DIGESTS): xxh3_64, or words64 where a
        # JAX capture hashes on an accelerator (capture/jax_digest.py); one per trace, named
        # in the manifest's recording.hash (`use_hash`)
        self.hash_name = values.HASH_NAME
        self.digest = values.digest
        self.stats_backend = "numpy"
        # callables run at the start of every flush: captures that defer values (device
        # tensors copied asynchronously) complete their reserved rows there
        self.flush_hooks = []
        for name in schema.TABLES:
            f.attrs[f"committed_{name}"] = 0
        f.attrs["committed_blob"] = 0
        f.attrs["committed_strings"] = 0
        f.attrs["last_flush_unix"] = time.time()
        f.flush()
        _live_writers.add(self)
        if WRITE_BEHIND:
            _guard_descriptors()

    # -- strings ---------------------------------------------------------------------------
    def intern(self, text):
        """Index of `text` in the strings table (-1 for None)."""
        if text is None:
            return -1
        idx = self._strings.get(text)
        if idx is None:
            idx = self._strings[text] = len(self._strings)
            self._new_strings.append(text)
        return idx

    # -- rows ------------------------------------------------------------------------------
    @property
    def committed_events(self):
        """Events on disk as of the last commit (what a reader of a killed run gets)."""
        return self._committed_events

    @property
    def n_events(self):
        return self._counts["events"] + len(self._rows["events"])

    def add_event(self, *, framework, kind, op, phase=schema.PHASE_FWD, origin=schema.ORIGIN_NONE,
                  params=None, name_stack=None, source=None, node=None, call=-1, parent=-1,
                  step=0, iter=-1, device=None):
        """Append an event; returns its id (row number). `device` ("cpu:3"): the one
        device the event ran on (a row of the `devices` table), None for none."""
        if self.before_event is not None:   # e.g. a Ctrl-C to hand back (runner.py)
            self.before_event()
        eid = self.n_events
        s = self.intern
        src = self._source_ids.get(source)
        if src is None:
            src = self._new_source(source)
        self._rows["events"].append((framework, kind, phase, origin, s(op), s(params),
                                     s(name_stack), src, s(node), call, parent, step, iter))
        if device:
            self._rows["devices"].append((eid, s(device)))
        if len(self._rows["events"]) >= FLUSH_ROWS or \
                time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self._auto_flush()
        return eid

    def forget_slices(self):
        """Drop the global value add_shard compared against (do not keep it alive)."""
        self._slice_digests.clear()

    def set_device(self, event, device):
        """Tie an event already added to one device ("cpu:3")."""
        self._rows["devices"].append((int(event), self.intern(device)))
    def add_event_ids(self, framework, kind, phase, origin, op_id, params_id, ns_id, src_id,
                      node_id, call, parent, step, it=-1):
        """`add_event` with its strings already interned (`intern`, `source_id`): the
        recorders' hot path, one row append and the flush checks."""
        if self.before_event is not None:
            self.before_event()
        rows = self._rows["events"]
        eid = self._counts["events"] + len(rows)
        rows.append((framework, kind, phase, origin, op_id, params_id, ns_id, src_id, node_id,
                     call, parent, step, it))
        if len(rows) >= FLUSH_ROWS or time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self._auto_flush()
        return eid

    def event_head(self, framework, kind, phase, origin, op, params, name_stack, source,
                   node=None):
        """The constant part of an event row (`add_event_row`), its strings interned as
        `add_event` interns them: built once per equation site by the JAX recorder."""
        src = self.source_id(source)
        s = self.intern
        return (framework, kind, phase, origin, s(op), s(params), s(name_stack), src, s(node))

    def add_event_row(self, head, call, parent, step, it, device_id=-1):
        """`add_event` from a row head (`event_head`) and the per-event fields: the same
        row, the same device row (`device_id`, an interned "platform:id", or -1) and the
        same flush checks; what is constant per site is not interned again."""
        if self.before_event is not None:
            self.before_event()
        rows = self._rows["events"]
        eid = self._counts["events"] + len(rows)
        rows.append(head + (call, parent, step, it))
        if device_id >= 0:
            self._rows["devices"].append((eid, device_id))
        if len(rows) >= FLUSH_ROWS or time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self._auto_flush()
        return eid

    def after_rows(self):
        """The flush checks of rows appended in bulk (a planned call's events and values)."""
        if len(self._rows["events"]) >= FLUSH_ROWS or len(self._rows["values"]) >= FLUSH_ROWS or \
                len(self._blob) >= self._flush_bytes or \
                time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self._auto_flush()

    def add_inputs(self, event, refs):
        """`add_input` for slots 0.. of `event`: refs is a list of (producer, slot)."""
        self._rows["inputs"].extend([(event, slot, p, q) for slot, (p, q) in enumerate(refs)])

    def value_ids(self, dtype_name, storage, shape):
        """(dtype, storage, shape) string ids of a value row, for `reserve_ids`."""
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        return (self.intern(dtype_name), self.intern(storage), sid)

    def add_meta_rows(self, event, rows):
        """`add_meta_value` for many values of one event whose rows were made once (a
        jitted call's arguments at every step): rows = [(slot, role, flags, dtype id,
        dtype id, shape id, name id, -1, 0, 0)] (`meta_row`)."""
        self._rows["values"].extend([(event, *row) for row in rows])

    def meta_row(self, slot, dtype_name, shape, role=schema.ROLE_OUT, name=None,
                 flags=schema.VFLAG_NOT_STORED):
        """The row `add_meta_value` appends, less its event (for `add_meta_rows`)."""
        return (slot, role, flags, *self.value_ids(dtype_name, dtype_name, tuple(shape)),
                self.intern(name), -1, 0, 0)

    def reserve_rows(self, event, role, ids):
        """`reserve_ids` for slots 0.. of one event: ids = [(string ids, name id)]; returns
        the first row's handle (the others follow it)."""
        rows = self._rows["values"]
        first = len(rows)
        rows.extend([(event, slot, role, 0, *i, name_id, -1, 0, 0)
                     for slot, (i, name_id) in enumerate(ids)])
        return first

    def reserve_ids(self, event, slot, role, ids, name_id=-1):
        """`reserve_value` with the row's string ids already made (`value_ids`)."""
        rows = self._rows["values"]
        rows.append((event, slot, role, 0, *ids, name_id, -1, 0, 0))
        return len(rows) - 1

    def host_value(self, array):
        """A small host value added again and again (a jaxpr literal): prepared, interned
        and hashed once (`add_host_value`)."""
        c, dtype_name, storage, shape = values.prepare(array, None)
        return (c, dtype_name, storage, self.value_ids(dtype_name, storage, shape), c.nbytes,
                self.digest(c), bytes(values.as_bytes(c)), c.itemsize or 1)

    def add_fetched(self, event, slot, ids, data, nbytes, h):
        """`add_value(event, slot, data, h=h)` for a value fetched from its device with its
        hash (a planned values program's output at level full, `ids` from `value_ids`):
        the same row and bytes, in a few steps. False, having written nothing, where a
        byte cap applies (the caller takes `add_value`, which keeps statistics past it)."""
        if self.max_bytes is not None or self.level != "full":
            return False
        self.add_fetched_row(event, slot, ids, self._keep_bytes(event, data, nbytes), nbytes, h)
        return True

    def keep_joined(self, data):
        """The blob offset of `data`, the bytes of many values fetched as one buffer
        (`add_fetched_row` rows point into it), or None where they are not kept so (no
        buffer, or a byte cap, which `add_fetched` applies value by value). `data`: a
        uint8 array nobody writes to, or a callable returning one with an `nbytes`, read
        when the flush writes it (a copy from a device still under way); held, not copied."""
        if data is None or self.max_bytes is not None or self.level != "full":
            return None
        offset = self._blob_size
        self._blob.hold(data, data.nbytes)
        self._blob_size += data.nbytes
        self.bytes_recorded += data.nbytes
        return offset

    def add_fetched_row(self, event, slot, ids, offset, nbytes, h):
        """`add_fetched`'s row for a value whose bytes are kept already at `offset`
        (`keep_joined`)."""
        self._rows["values"].append((event, slot, schema.ROLE_OUT, 0, *ids, -1, offset,
                                     nbytes, h))

    def add_kept_value(self, event, slot, dtype, shape, offset, h, role=schema.ROLE_OUT,
                       name=None):
        """`add_value(event, slot, array, h=h)`'s row, from the array's dtype and shape
        alone, for a value whose bytes the blob holds already at `offset` (`keep_joined`),
        which need not have reached the host yet."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        self._rows["values"].append((event, slot, role, 0,
                                     *self.value_ids(*values.storage_names(dt), shape),
                                     self.intern(name), offset, nbytes, h))
        if len(self._rows["values"]) >= FLUSH_ROWS:
            self._auto_flush()

    def add_host_value(self, event, slot, hv, role=schema.ROLE_OUT):
        """`add_value(event, slot, array, role=role)` for a `host_value`: the same row, bytes
        and statistics (queued with the other small values, as `add_value` queues them)."""
        c, dtype_name, storage, ids, nbytes, h, raw, itemsize = hv
        offset = self._keep_bytes(event, c, nbytes) if self.level == "full" else -1
        flags = 0
        rows = self._rows["values"]
        if offset < 0:
            flags = schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
            if nbytes >= self.STATS_DIRECT_BYTES:
                self._add_stats(c, storage, dtype_name, h=h)
            else:   # `_add_stats` inlined for a small value: its bytes join its dtype's batch
                self.stats_values += 1
                p = self._pstats.get((storage, dtype_name))
                if p is None:
                    p = self._pstats[(storage, dtype_name)] = self._batch((storage, dtype_name),
                                                                          itemsize)
                pbuf = p[0]
                p[2].append(len(pbuf))
                p[3].append(nbytes)
                p[1].append(self._counts["values"] + len(rows))
                pbuf += raw
                self._pstats_bytes += nbytes
                if self._pstats_bytes >= STATS_BATCH_BYTES:
                    self._reduce_stats()
        rows.append((event, slot, role, flags, *ids, -1, offset, nbytes, h))
        if len(self._blob) >= self._flush_bytes or len(self._rows["values"]) >= FLUSH_ROWS:
            self._auto_flush()

    def source_id(self, source):
        """Interned id of an events.source string (its lines stored the first time)."""
        src = self._source_ids.get(source)
        if src is None:
            src = self._new_source(source)
        return src

    def _new_source(self, source):
        """Intern a source string seen for the first time and store its lines."""
        idx = self._source_ids[source] = self.intern(source)
        if self.source_lines is not None and LIB_SEP in source:   # the library line's too
            self.source_id(split_site(source)[1])
        if self.source_lines is not None:
            try:
                got = self.source_lines(source)
            except Exception:  # context only: never fail a recording over it
                got = None
            if got is not None:
                first, text, sha = got
                self._rows["sources"].append((idx, first, self.intern(text), self.intern(sha)))
        return idx

    def add_value(self, event, slot, array, *, role=schema.ROLE_OUT, name=None, flags=0,
                  logical_dtype=None, store=True, stats=None, h=None):
        """Append one value of `event`. `array` must be a host numpy array (or scalar).
        `stats`: its statistics already computed by the framework (STAT_FIELDS order),
        used when the value is kept as hash + statistics; `h`: its hash already computed
        (on the device, with this trace's hash function). A value whose bytes the blob
        holds already: `add_kept_value`.

        `store=False`: metadata only (no hash). Otherwise the bytes (level "full", under
        `max_bytes`) or the hash and statistics (level "stats", or past the cap); the
        bytes are hashed and copied once, straight from the array's buffer."""
        c, dtype_name, storage, shape = values.prepare(array, logical_dtype)
        if not store or flags & (schema.VFLAG_UNINIT | schema.VFLAG_NOT_STORED):
            flags |= schema.VFLAG_NOT_STORED if not (flags & schema.VFLAG_UNINIT) else 0
            offset, nbytes, h = -1, 0, 0
        else:
            nbytes = c.nbytes
            h = self.digest(c) if h is None else h
            offset = self._keep_bytes(event, c, nbytes)
            if offset < 0:
                flags |= schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
                if stats is None:
                    self._add_stats(c, storage, dtype_name, h=h)
                else:
                    self.stats_values += 1
                    self._rows["stats"].append((self._counts["values"] + len(self._rows["values"]),
                                                *(float(v) for v in stats[:4]), int(stats[4]),
                                                int(stats[5])))
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        self._rows["values"].append((event, slot, role, flags, self.intern(dtype_name),
                                     self.intern(storage), sid, self.intern(name), offset,
                                     nbytes, h))
        if len(self._blob) >= self._flush_bytes or len(self._rows["values"]) >= FLUSH_ROWS:
            self._auto_flush()

    def _keep_bytes(self, event, data, nbytes):
        """Append a value's bytes (a buffer, or a C-contiguous array) to the blob when the
        level and the byte cap allow: their offset, or -1 (the value keeps its hash and
        statistics; the event where the cap was reached is noted once)."""
        if self.level == "full" and (self.max_bytes is None or (
                self.capped_at_event is None and self.bytes_recorded + nbytes <= self.max_bytes)):
            offset = self._blob_size
            if nbytes:
                self._blob.append(data if isinstance(data, (bytes, bytearray, memoryview))
                                  else values.as_bytes(data))
            self._blob_size += nbytes
            self.bytes_recorded += nbytes
            return offset
        if self.level == "full" and self.capped_at_event is None:
            self.capped_at_event = int(event)
        return -1

    def add_array(self, event, slot, a, role=schema.ROLE_OUT, name_id=-1):
        """`add_value` for a host numpy array of a native dtype, stored whole (no window,
        no logical dtype): the torch recorder's hot path. Same rows and bytes as
        `add_value`; fewer Python steps (dtype and shape ids cached, no `prepare`)."""
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        dt = a.dtype
        ids = self._dtype_ids.get(dt)
        if ids is None:
            name = values._dtype_name(dt)
            if name not in values._NATIVE:
                return self.add_value(event, slot, a, role=role,
                                      name=self._strings_rev(name_id))
            ids = self._dtype_ids[dt] = (self.intern(name), name, (name, name))
        nbytes = a.nbytes
        flags = 0
        if nbytes:
            try:
                buf = a.data.cast("B")
            except (TypeError, ValueError):
                buf = a.tobytes()
        else:
            buf = b""
        h = self.digest(buf)
        offset = self._keep_bytes(event, buf, nbytes)
        if offset < 0:
            flags = schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
            if nbytes >= self.STATS_DIRECT_BYTES:
                self._add_stats(a, ids[1], ids[1], h=h)
            else:  # `_add_stats` inlined: a small value's bytes join its dtype's batch
                self.stats_values += 1
                p = self._pstats.get(ids[2])
                if p is None:
                    p = self._pstats[ids[2]] = self._batch(ids[2], a.itemsize or 1)
                arena = p[0]   # `arena += buf`, inlined
                start = arena.used
                p[2].append(start)
                p[3].append(nbytes)
                p[1].append(self._counts["values"] + len(self._rows["values"]))
                if nbytes:
                    end = start + nbytes
                    if end > len(arena.arr):
                        arena += buf
                    else:
                        arena.mem[start:end] = buf
                        arena.used = end
                self._pstats_bytes += nbytes
                if self._pstats_bytes >= STATS_BATCH_BYTES:
                    self._reduce_stats()
        shape = a.shape
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        rows = self._rows["values"]
        rows.append((event, slot, role, flags, ids[0], ids[0], sid, name_id, offset, nbytes, h))
        if len(self._blob) >= self._flush_bytes or len(rows) >= FLUSH_ROWS:
            self._auto_flush()

    def _strings_rev(self, idx):
        """The string of an interned id (-1: None); rare paths only (linear)."""
        if idx < 0:
            return None
        for text, i in self._strings.items():
            if i == idx:
                return text
        return None

    def reserve_value(self, event, slot, dtype_name, storage, shape, *, role=schema.ROLE_OUT,
                      name=None, logical=None):
        """Append a value row whose bytes, hash (and statistics) arrive later through
        `fill_value` (a device tensor copied to the host asynchronously); returns a
        handle. Must be filled before the next flush ends: `flush_hooks` run first."""
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        rows = self._rows["values"]
        rows.append((event, slot, role, 0, self.intern(logical or dtype_name),
                     self.intern(storage), sid, self.intern(name), -1, 0, 0))
        return len(rows) - 1

    def fill_value(self, handle, c, storage, logical, stats=None):
        """Complete a reserved row with the host bytes `c` (C-contiguous, storage dtype):
        hash, and bytes (full level, under the cap) or statistics (`stats`: a tuple in
        `values.STAT_FIELDS` order, computed on the device; else computed here)."""
        rows = self._rows["values"]
        row = rows[handle]
        nbytes = c.nbytes
        buf = values.as_bytes(c)
        h = self.digest(buf)
        flags = row[3]
        offset = self._keep_bytes(row[0], buf, nbytes)
        if offset < 0:
            flags |= schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
            if stats is None:
                self._add_stats(c, storage, logical, row=self._counts["values"] + handle, h=h)
            else:
                self.stats_values += 1
                self._rows["stats"].append((self._counts["values"] + handle, *stats[:4],
                                            int(stats[4]), int(stats[5])))
        rows[handle] = row[:3] + (flags,) + row[4:8] + (offset, nbytes, h)

    def fill_digest(self, handle, nbytes, h, stats=None):
        """Complete a reserved row with a value's hash (and statistics, STAT_FIELDS order)
        computed on its device: no bytes cross (levels stats and calls)."""
        rows = self._rows["values"]
        row = rows[handle]
        flags = row[3] | schema.VFLAG_NOT_STORED
        if stats is not None:
            flags |= schema.VFLAG_STATS
            self.stats_values += 1
            self._rows["stats"].append((self._counts["values"] + handle, *stats[:4],
                                        int(stats[4]), int(stats[5])))
        rows[handle] = row[:3] + (flags,) + row[4:8] + (-1, int(nbytes), int(h))

    def fill_digests(self, rows, hashes, floats=None, counts=None):
        """`fill_digest` for many reserved rows: rows = [(handle or None, nbytes)], with
        their hashes and (levels stats/calls) statistics' floats and counts."""
        vrows = self._rows["values"]
        base = self._counts["values"]
        if floats is None:
            flag = schema.VFLAG_NOT_STORED
            for (handle, nbytes), h in zip(rows, hashes):
                if handle is not None:
                    row = vrows[handle]
                    vrows[handle] = (*row[:3], row[3] | flag, *row[4:8], -1, nbytes, h)
            return
        flag = schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
        srows = self._rows["stats"]
        n = 0
        for (handle, nbytes), h, f, c in zip(rows, hashes, floats, counts):
            if handle is not None:
                row = vrows[handle]
                vrows[handle] = (*row[:3], row[3] | flag, *row[4:8], -1, nbytes, h)
                srows.append((base + handle, *f, *c))
                n += 1
        self.stats_values += n

    def use_hash(self, name):
        """Hash this trace's values with `name` (values.DIGESTS); only before any value."""
        if name == self.hash_name:
            return True
        if self._counts["values"] or self._rows["values"] or name not in values.DIGESTS:
            return False
        self.hash_name, self.digest = name, values.DIGESTS[name]
        rec = dict(self._manifest.get("recording") or {}, hash=name)
        self.update_manifest(recording=rec)
        return True

    STATS_DIRECT_BYTES = values.WHOLE_VALUE_BYTES

    def _add_stats(self, c, storage, logical, row=None, h=None):
        """Queue the statistics of the value about to be appended (row = next values row).
        Small values are copied into one buffer per dtype and reduced in batches
        (reductions on tiny arrays cost more than the copy); large ones now. Both go
        through `stats_reducer` (the capture's framework ops, else numpy).

        A large value whose hash `h`, size and dtype equal a recent one's takes that
        one's statistics: equal hashes already stand for equal bytes in every comparison
        (values.digest), and a JAX step holds many copies (optax's tags, the optimizer
        snapshot, a call's outputs beside its equations': ~half the MLP's 220 MB a step)."""
        if row is None:
            row = self._counts["values"] + len(self._rows["values"])
        self.stats_values += 1
        nbytes = c.nbytes
        if nbytes >= self.STATS_DIRECT_BYTES:
            memo = self._stats_memo
            key = (h, nbytes, storage, logical) if h is not None else None
            st = memo.get(key) if key is not None else None
            if st is None:
                flat = c.reshape(-1)
                st = self.stats_reducer(flat, [0], [flat.size], logical)[0]
                st = (*st[:4], int(st[4]), int(st[5]))
                if key is not None:
                    if len(memo) >= STATS_MEMO_VALUES:
                        memo.clear()
                    memo[key] = st
            self._rows["stats"].append((row, *st))
            return
        key = (storage, logical)
        p = self._pstats.get(key)
        if p is None:
            p = self._pstats[key] = self._batch(key, c.itemsize or 1)
        buf = p[0]
        p[2].append(len(buf))
        p[3].append(nbytes)
        p[1].append(row)
        if nbytes:
            buf += values.as_bytes(c)
        self._pstats_bytes += nbytes
        if self._pstats_bytes >= STATS_BATCH_BYTES:
            self._reduce_stats()

    def _batch(self, key, itemsize):
        """A new batch of small values for statistics: [bytes, rows, starts, counts,
        itemsize], its bytes in the dtype's arena, reused from batch to batch."""
        arena = self._arenas.get(key)
        if arena is None:
            arena = self._arenas[key] = _StatsArena()
        arena.used = 0
        return [arena, [], [], [], itemsize]

    def _reduce_stats(self):
        """Statistics of the queued small values, vectorised per dtype, as stats rows."""
        for (storage, logical), (buf, rows, starts, counts, size) in self._pstats.items():
            flat = buf.arr[:buf.used].view(storage) if buf.used else np.zeros(0, storage)
            starts = np.asarray(starts, np.int64) // size
            counts = np.asarray(counts, np.int64) // size
            st = self.stats_reducer(flat, starts, counts, logical)
            self._rows["stats"].extend(
                zip(rows, st[:, 0].tolist(), st[:, 1].tolist(), st[:, 2].tolist(),
                    st[:, 3].tolist(), st[:, 4].astype(np.int64).tolist(),
                    st[:, 5].astype(np.int64).tolist()))
        self._pstats = {}
        self._pstats_bytes = 0

    def add_shard(self, event, slot, array, *, device, index, replica, whole=None,
                  role=schema.ROLE_OUT, logical_dtype=None):
        """Append one per-device copy of a value just added (same event, slot, role).

        `index`: the shard's place in the global value as a tuple of slices (() or all
        full slices: the whole value); `whole`: the global host array as stored in
        `values`, or None. A shard equal to `whole[index]` is marked SHARD_SLICE and its
        bytes are not stored twice; a differing shard's bytes are stored (level full,
        under the byte cap), else only its hash (SHARD_DIGEST)."""
        c, _dtype_name, _storage, shape = values.prepare(array, logical_dtype)
        h = self.digest(c)
        text = values.shard_index_text(index)
        flags, offset, nbytes = 0, -1, 0
        same = False
        if whole is not None:
            # the digest of the global value's slice, once per index of this value (a
            # replicated array has 8 copies of one index on 8 devices)
            cache = self._slice_digests
            if cache.get("whole") is not whole:
                cache.clear()
                cache["whole"] = whole
            expected = cache.get(text)
            if expected is None:
                try:
                    part = values.prepare(whole[tuple(index)] if text else whole, logical_dtype)[0]
                    expected = cache[text] = (part.shape, part.dtype, self.digest(part))
                except Exception:   # an index the global value does not take: compared by hash
                    expected = cache[text] = ()
            same = expected == (c.shape, c.dtype, h)
        if same:
            flags = schema.SHARD_SLICE
        elif self.level == "full" and (self.max_bytes is None or (
                self.capped_at_event is None and self.bytes_recorded + c.nbytes <= self.max_bytes)):
            offset, nbytes = self._blob_size, c.nbytes
            if nbytes:
                self._blob.append(values.as_bytes(c))
            self._blob_size += nbytes
            self.bytes_recorded += nbytes
        else:
            flags = schema.SHARD_DIGEST
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        self._rows["shards"].append((event, slot, role, flags, self.intern(device),
                                     self.intern(text), int(replica), sid, offset, nbytes, h))

    def add_placement(self, event, slot, role, placements, mesh, coord, global_shape, offset,
                      param=None):
        """Where value (event, slot, role), one rank's local shard of a DTensor, sits in
        the global tensor (strings as the `placements` table documents them)."""
        s = self.intern
        self._rows["placements"].append((int(event), int(slot), int(role), s(placements),
                                         s(mesh), s(coord), s(global_shape), s(offset),
                                         s(param)))

    def add_optim_setting(self, event, group, key, value, text):
        """One scalar setting of optimizer-step `event` (the `optim_settings` table): `value`
        a float (NaN where the setting is no number), `text` how the framework prints it."""
        self._rows["optim_settings"].append((int(event), int(group), self.intern(key),
                                             float(value), self.intern(text)))

    def add_meta_value(self, event, slot, dtype_name, shape, *, role=schema.ROLE_OUT, name=None,
                       flags=schema.VFLAG_NOT_STORED):
        """A value whose bytes are not stored (uninitialised memory, meta tensors)."""
        self._rows["values"].append((event, *self.meta_row(slot, dtype_name, shape, role,
                                                           name, flags)))

    def add_input(self, event, slot, producer, producer_slot=0):
        self._rows["inputs"].append((event, slot, producer, producer_slot))

    # -- manifest --------------------------------------------------------------------------
    @_signals_deferred
    def update_manifest(self, **fields):
        self._manifest.update(fields)
        self._quiet()
        if not self.closed and not self._check_file():
            self._f["manifest"][()] = self._manifest_text()

    def _manifest_text(self):
        return json.dumps(self._manifest, sort_keys=True, default=str)

    # -- flushing --------------------------------------------------------------------------
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
        self._flush(wait=not (FSYNC or WRITE_BEHIND))

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
            self._write_pending(behind=WRITE_BEHIND and not wait)
            if wait:
                self._commit_synced()
        except Exception as exc:  # disk full, file size limit, I/O error
            self._fail(exc)
        if self._file.lost:       # the flush went nowhere: stop now, not at the next one
            self._check_file()
        self._last_flush = time.monotonic()
        self._flush_bytes = min(2 * self._flush_bytes, FLUSH_BYTES)

    def _no_room(self):
        """Why the next flush may not fit on the disk (free space, file size limit), or None.

        Checked before writing because HDF5 cannot recover from a failed write: measured
        with HDF5 2.0, closing a file after ENOSPC/EFBIG crashes the process."""
        need = len(self._blob) + self._pstats_bytes + RESERVE_BYTES + sum(
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
        self._synced = (counts, _Fsync(self._file, writes, FSYNC) if FSYNC or writes else None)

    def _write_blob(self, ds, n, pieces, k):
        """Write `k` bytes, the concatenation of `pieces` (uint8 arrays, taken one by one as
        the writing reaches them), at byte `n` of the blob. Whole chunks of an unfiltered
        blob go to HDF5 as chunks (`write_direct_chunk`: no copy through the chunk cache,
        ~0.7 s per GB less, measured), straight from the piece that holds them where one
        does; the partial chunks at either end and the chunks pieces share are joined
        first, then written."""
        head = min(k, -n % CHUNK_BYTES)
        whole = (k - head) // CHUNK_BYTES
        tail = k - head - whole * CHUNK_BYTES
        if self._blob_filter or whole == 0 or not hasattr(ds.id, "write_direct_chunk"):
            pieces = list(pieces)
            ds[n:n + k] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            return
        sizes = ([head] if head else []) + [CHUNK_BYTES] * whole + ([tail] if tail else [])
        at = n
        for size, parts in zip(sizes, _regions(pieces, sizes)):
            data = parts[0] if len(parts) == 1 else np.concatenate(parts)
            if size == CHUNK_BYTES:
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

    @_signals_deferred
    def close(self, **manifest_fields):
        """Flush, store the final manifest fields (how the run ended) and mark complete.

        After a write error the trace stays incomplete (`complete` False, its last commit
        readable); the final fields and the error are added to its manifest if the disk
        lets us, which it may not. A lost trace (`lost`) and a forked child's writer are
        not touched."""
        if self.forked or self.lost:
            self.closed = True
            return
        if self.closed:
            if self.error and not getattr(self, "_error_noted", False):
                self._error_noted = True
                self._manifest.update(manifest_fields)
                self._manifest["recording_error"] = self.error
                if not self.unclosed and self._file.at_path():
                    self._note_error()
            return
        self.flush()
        if self.closed:  # the flush failed
            return self.close(**manifest_fields)
        try:
            if manifest_fields:
                self.update_manifest(**manifest_fields)
            if self._check_file():
                return
            self._f.flush()
            self._f.attrs["complete"] = True
            self._f.close()
        except Exception as exc:
            self._fail(exc)
            return self.close(**manifest_fields)
        self.closed = True
        # deleted or replaced after the last write: the complete trace is not at the path
        self.lost = self._file.lost or self._file.check_path()
        if not self.lost and self._file.size() <= COMPACT_BELOW:
            self._compact()
        self._file.close()

    def _note_error(self):
        """Put the final manifest (how the run ended, `recording_error`) into a trace whose
        recording stopped early, never at the cost of its last commit: the disk may be full,
        and a write failing half-way through the file would leave it unreadable. A small
        trace is rewritten beside itself and moved over it (`_compact`: a failed copy leaves
        the original); a large one is updated in place only with room to spare."""
        path, text = self._file.path, self._manifest_text()
        try:
            size = os.path.getsize(path)
            free = shutil.disk_usage(os.path.dirname(path)).free
            if size <= COMPACT_BELOW:
                if free >= size + RESERVE_BYTES:
                    self._compact(manifest=text)
            elif free >= RESERVE_BYTES + 4 * len(text):
                with h5py.File(path, "r+", libver="earliest") as f:
                    f["manifest"][()] = text
        except Exception:
            pass

    def _compact(self, manifest=None):
        """Rewrite the finished trace without the empty tails of its chunks
        (`write_finished`, replacing it atomically), with `manifest` (JSON text) if given.
        Any failure keeps the chunked original, which is just as valid, so a problem here
        never costs the trace."""
        try:
            with h5py.File(self._file.path, "r", locking=False) as src:
                tables = {}
                for name in list(schema.TABLES) + ["blob", "strings"]:
                    ds = src[name]
                    tables[name] = ds[:int(src.attrs.get(f"committed_{name}", ds.shape[0]))]
                manifest = src["manifest"][()] if manifest is None else manifest
                attrs = dict(src.attrs)
            if self._file.check_path():   # the path changed hands meanwhile: leave it
                return
            write_finished(self._file.path, tables, manifest, attrs, replace=True,
                           blob_filter=self._blob_filter)
            self.compacted = True
        except Exception:
            pass

    @property
    def reopened(self):
        """How many times the script closed the trace's descriptor and it was reopened."""
        return self._file.reopened

    def _check_file(self):
        """True (and recording stopped, `lost` set) once the trace is gone: the script
        deleted or replaced it, or closed its descriptor and the path no longer holds it."""
        if self.lost is None:
            self.lost = self._file.lost or self._file.check_path()
            if self.lost is None:
                return False
        self._drop_buffers()
        if not self.closed:
            self.closed = True
            self._file.discard()    # HDF5 may write while closing: into nothing
            try:
                self._f.close()
            except Exception:
                pass
            self._file.close()
        return True

    def _drop_buffers(self):
        self._quiet()
        self._synced = None
        self._rows = {name: [] for name in schema.TABLES}
        self._blob = _PendingBytes()
        self._new_strings = []
        self._pstats, self._pstats_bytes, self._arenas = {}, 0, {}

    def _after_fork_in_child(self):
        """In a forked child: never write, flush or close the parent's trace. HDF5's own
        clean-up (h5py finalizers, the library's exit handler) still runs in the child;
        `TraceFile.discard` makes whatever it writes go nowhere."""
        self.forked = True
        self.closed = True
        self.before_event = None
        self._file.discard()
        self._drop_buffers()


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


class _PendingBytes:
    """The value bytes of the next flush, in blob order: small values copied into one
    buffer reused from flush to flush, large buffers that nobody can change (a device's
    joined values, `hold`) kept as they are and read only when written.

    A fresh `bytearray` per flush cost ~1.6 s per GB recorded (measured on the JAX MLP at
    full): its growth reallocates, and each new buffer's pages fault in again. Copying
    every value into one buffer grown to the flush size cost ~0.2 s in the first dozen
    steps of the same MLP (each doubling copies and faults in again) and a memcpy of every
    byte after that; a held buffer costs neither, and one still on its way from a device
    is waited for at the flush, not when its rows are written."""

    __slots__ = ("_arr", "_mem", "_used", "_parts", "_len")

    def __init__(self):
        self._arr = np.empty(0, "u1")
        self._mem = memoryview(self._arr)
        self._used = 0      # bytes of _arr in use
        self._parts = []    # [start, end) ranges of _arr, or held sources, in blob order
        self._len = 0

    def __len__(self):
        return self._len

    def __bool__(self):
        return self._len > 0

    def append(self, data):
        """Copy `data` (bytes or a 1-byte-format buffer) after the bytes held."""
        k = len(data)
        if not k:
            return
        end = self._used + k
        if end > len(self._arr):
            grown = np.empty(max(end, 2 * len(self._arr), FIRST_FLUSH_BYTES), "u1")
            grown[:self._used] = self._arr[:self._used]
            self._arr, self._mem = grown, memoryview(grown)
        self._mem[self._used:end] = data
        last = self._parts[-1] if self._parts else None
        if type(last) is list and last[1] == self._used:
            last[1] = end
        else:
            self._parts.append([self._used, end])
        self._used = end
        self._len += k

    def hold(self, source, nbytes):
        """Keep `nbytes` bytes after those held without copying them: `source` is a uint8
        array nobody writes to, or a callable returning one (read at the flush)."""
        if nbytes:
            self._parts.append((source, nbytes))
            self._len += nbytes

    def pieces(self):
        """The bytes held, as uint8 arrays in order. A generator: each held source is read
        when the writer reaches it, so a device's copy of the last values of a flush goes
        on while the bytes before it are written (on a TPU v5e, waiting for every copy
        before the first write was ~3 ms of a 17 ms step at full)."""
        for part in self._parts:
            if type(part) is list:
                yield self._arr[part[0]:part[1]]
                continue
            source, nbytes = part
            data = np.asarray(source() if callable(source) else source).reshape(-1).view("u1")
            if len(data) != nbytes:
                raise ValueError("a held buffer changed size before it was written")
            yield data

    def clear(self):
        self._used = self._len = 0
        self._parts = []


class _StatsArena:
    """The bytes of one dtype's batch of small values queued for statistics (`pbuf +=
    data`, `len(pbuf)`), in one buffer reused by every batch. A fresh bytearray per batch
    grew into fresh pages each time, and first touches of fresh pages cost ~30-50 us a
    page on this VM: that made `--level stats` dearer than `full`, whose byte arena
    (`_PendingBytes`) is reused."""

    __slots__ = ("arr", "mem", "used")

    def __init__(self):
        self.arr = np.empty(STATS_BATCH_BYTES + values.WHOLE_VALUE_BYTES, "u1")
        self.mem = memoryview(self.arr)
        self.used = 0

    def __len__(self):
        return self.used

    def __iadd__(self, data):
        end = self.used + len(data)
        if end > len(self.arr):   # only when a batch outgrows its usual size
            grown = np.empty(max(end, 2 * len(self.arr)), "u1")
            grown[:self.used] = self.arr[:self.used]
            self.arr, self.mem = grown, memoryview(grown)
        self.mem[self.used:end] = data
        self.used = end
        return self


def _regions(pieces, sizes):
    """For consecutive regions of these byte counts over the concatenation of `pieces` (an
    iterable, taken only as far as the region asked for needs): each region's slices of
    the pieces (one slice where a single piece covers it)."""
    pieces = iter(pieces)
    p, off = None, 0
    for size in sizes:
        parts = []
        while size:
            if p is None or off == len(p):
                p, off = next(pieces), 0
                continue
            take = min(size, len(p) - off)
            parts.append(p[off:off + take])
            off += take
            size -= take
        yield parts


def write_finished(path, tables, manifest, attrs, replace=False, blob_filter=None):
    """Write a finished trace in one go: `tables` maps each table (schema.TABLES) and
    "blob" / "strings" to its rows, `manifest` is the JSON text, `attrs` the root
    attributes (the committed_* counts are set from the rows). Each dataset is one chunk of
    about its size (appendable like a recorded trace, no empty tails).

    Written to a temporary file beside `path`, fsynced, then moved there atomically: with
    `replace`, over whatever is there; without, only if nothing is (FileExistsError).
    `blob_filter`: the codec's dataset options for "blob" (trace/codec.py), or None."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w-", libver="earliest") as f:
            for key, value in attrs.items():
                f.attrs[key] = value
            dtypes = {**schema.TABLES, "blob": np.dtype("u1"),
                      "strings": h5py.string_dtype("utf-8")}
            for name, dt in dtypes.items():
                rows = tables.get(name)
                rows = np.zeros(0, dt) if rows is None else (
                    np.asarray(rows, dtype=object) if name == "strings" else np.asarray(rows, dt))
                chunk = max(len(rows), 4096 // max(np.dtype(dt).itemsize, 1), 1)
                f.create_dataset(name, data=rows, dtype=dt, maxshape=(None,), chunks=(chunk,),
                                 **((blob_filter or {}) if name == "blob" else {}))
                f.attrs[f"committed_{name}"] = len(rows)
            f.create_dataset("manifest", data=manifest, dtype=h5py.string_dtype("utf-8"))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)      # fails if `path` exists: never overwrites
            os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
            if n >= CHUNK_BYTES:
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
            if run and (offset != at or at - start >= WRITEBACK_BYTES):
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


def _drop_cached(fd):
    """Let the kernel drop the trace's pages from its cache once they are on disk.

    A recording writes GBs that nobody reads back soon; left in the page cache they take
    fresh memory for every new page. On a VM whose host hands memory in lazily, a
    first touch costs up to ~50 us a page (the JAX MLP at full: 12 s of system time for
    1.9 GB); the pages dropped here are the ones the next flush reuses."""
    _dont_need(fd, 0, 0)


def _start_writeback(fd, offset, length):
    """Have the disk start writing these bytes now (`EARLY_WRITEBACK`), without waiting:
    POSIX_FADV_DONTNEED starts the writeback of a range's dirty pages (and drops the
    clean ones, none of which a recording reads back)."""
    if EARLY_WRITEBACK:
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


# Writers and files of this process. A forked child (a DataLoader worker, a fork Pool, a
# script's own os.fork) inherits them; the hook below stops the child from writing the
# parent's trace, flushing it or closing it (os.register_at_fork hooks cannot be removed:
# one hook for the process, whatever number of recordings it makes).
_live_writers = weakref.WeakSet()
_live_files = weakref.WeakSet()


def _before_fork():
    """No chunk is written behind while the process forks: the child would not have the
    thread, and its copy of the buffers would be half written."""
    for w in list(_live_writers):
        w._quiet()


def _after_fork_in_child():
    for tf in list(_live_files):
        tf.discard()
    for w in list(_live_writers):
        w._after_fork_in_child()


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
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
atexit.register(_close_at_exit)


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


