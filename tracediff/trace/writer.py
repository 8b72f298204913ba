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
  leaves the previous commit intact, one killed during phase two the new one;
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
"""

import json
import os
import shutil
import time

try:
    import resource
except ImportError:  # Windows
    resource = None

import h5py
import numpy as np

from . import schema, values

FLUSH_ROWS = 20_000
FLUSH_BYTES = 64 << 20
FIRST_FLUSH_BYTES = 1 << 20
FLUSH_SECONDS = 2.0
CHUNK_ROWS = 8192
CHUNK_BYTES = 1 << 20
RESERVE_BYTES = 3 * CHUNK_BYTES + (1 << 20)  # chunk allocations and metadata of one flush
FSYNC = os.environ.get("TRACEDIFF_FSYNC", "1") != "0"


class TraceWriter:
    """Writes one trace file. Not thread-safe: capture code serialises calls.

    `closed` turns True when the trace is closed or recording stopped on a write error
    (`error` then says why); captures stop recording when it does."""

    def __init__(self, path, manifest):
        self.path = os.fspath(path)
        self._f = h5py.File(self.path, "w", libver="earliest")
        f = self._f
        _no_metadata_evictions(f)
        f.attrs["format"] = schema.FORMAT_NAME
        f.attrs["schema_version"] = schema.SCHEMA_VERSION
        f.attrs["complete"] = False
        for name, dt in schema.TABLES.items():
            f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dt, chunks=(CHUNK_ROWS,))
        f.create_dataset("blob", shape=(0,), maxshape=(None,), dtype="u1", chunks=(CHUNK_BYTES,))
        f.create_dataset("strings", shape=(0,), maxshape=(None,),
                         dtype=h5py.string_dtype("utf-8"), chunks=(4096,))
        self._manifest = dict(manifest)
        f.create_dataset("manifest", data=self._manifest_text(), dtype=h5py.string_dtype("utf-8"))
        self._strings = {}
        self._new_strings = []
        self._rows = {name: [] for name in schema.TABLES}
        self._counts = {name: 0 for name in schema.TABLES}   # rows on disk
        self._blob = bytearray()
        self._blob_size = 0        # bytes recorded, buffered ones included
        self._blob_written = 0     # bytes on disk
        self._n_strings = 0        # strings on disk
        self._last_flush = time.monotonic()
        self._flush_bytes = FIRST_FLUSH_BYTES
        self.before_event = None   # callable run before each event is appended, or None
        # callable(source) -> (first line, lines text, file sha256) or None, run once per
        # new events.source string: the `sources` table (trace/sources.py)
        self.source_lines = None
        self._source_ids = {None: -1}
        self.bytes_recorded = 0
        self.closed = False
        self.error = None
        self.unclosed = False
        self.flushes = 0
        # --level stats / --max-bytes (docs/format.md, "Levels"): "full" stores every
        # value's bytes; "stats" stores its hash and a stats row instead. Past `max_bytes`
        # of stored bytes, values fall back to stats (`capped_at_event` says where).
        self.level = "full"
        self.max_bytes = None
        self.capped_at_event = None
        self.stats_values = 0
        self._pstats = {}          # (storage, logical) -> [bytearray, rows, starts, counts]
        self._pstats_bytes = 0
        self._shape_ids = {}
        for name in schema.TABLES:
            f.attrs[f"committed_{name}"] = 0
        f.attrs["committed_blob"] = 0
        f.attrs["committed_strings"] = 0
        f.attrs["last_flush_unix"] = time.time()
        f.flush()

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
        return self._counts["events"]

    @property
    def n_events(self):
        return self._counts["events"] + len(self._rows["events"])

    def add_event(self, *, framework, kind, op, phase=schema.PHASE_FWD, origin=schema.ORIGIN_NONE,
                  params=None, name_stack=None, source=None, node=None, call=-1, parent=-1,
                  step=0, iter=-1):
        """Append an event; returns its id (row number)."""
        if self.before_event is not None:   # e.g. a Ctrl-C to hand back (runner.py)
            self.before_event()
        eid = self.n_events
        s = self.intern
        src = self._source_ids.get(source)
        if src is None:
            src = self._new_source(source)
        self._rows["events"].append((framework, kind, phase, origin, s(op), s(params),
                                     s(name_stack), src, s(node), call, parent, step, iter))
        if len(self._rows["events"]) >= FLUSH_ROWS or \
                time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()
        return eid

    def _new_source(self, source):
        """Intern a source string seen for the first time and store its lines."""
        idx = self._source_ids[source] = self.intern(source)
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
                  logical_dtype=None, store=True):
        """Append one value of `event`. `array` must be a host numpy array (or scalar).

        `store=False`: metadata only (no hash). Otherwise the bytes (level "full", under
        `max_bytes`) or the hash and statistics (level "stats", or past the cap); the
        bytes are hashed and copied once, straight from the array's buffer."""
        c, dtype_name, storage, shape = values.prepare(array, logical_dtype)
        if not store or flags & (schema.VFLAG_UNINIT | schema.VFLAG_NOT_STORED):
            flags |= schema.VFLAG_NOT_STORED if not (flags & schema.VFLAG_UNINIT) else 0
            offset, nbytes, h = -1, 0, 0
        else:
            nbytes = c.nbytes
            h = values.digest(c)
            if self.level == "full" and (self.max_bytes is None or (
                    self.capped_at_event is None and
                    self.bytes_recorded + nbytes <= self.max_bytes)):
                offset = self._blob_size
                if nbytes:
                    self._blob += values.as_bytes(c)
                self._blob_size += nbytes
                self.bytes_recorded += nbytes
            else:
                if self.level == "full" and self.capped_at_event is None:
                    self.capped_at_event = int(event)
                offset = -1
                flags |= schema.VFLAG_NOT_STORED | schema.VFLAG_STATS
                self._add_stats(c, storage, dtype_name)
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = self.intern(values.shape_str(shape))
        self._rows["values"].append((event, slot, role, flags, self.intern(dtype_name),
                                     self.intern(storage), sid, self.intern(name), offset,
                                     nbytes, h))
        if len(self._blob) >= self._flush_bytes or len(self._rows["values"]) >= FLUSH_ROWS or \
                self._pstats_bytes >= FLUSH_BYTES:
            self.flush()

    STATS_DIRECT_BYTES = 1 << 16

    def _add_stats(self, c, storage, logical):
        """Queue the statistics of the value about to be appended (row = next values row).
        Small values are copied into one buffer per dtype and reduced together at flush
        (numpy reductions on tiny arrays cost more than the copy); large ones now."""
        row = self._counts["values"] + len(self._rows["values"])
        self.stats_values += 1
        flat = c.reshape(-1)
        if c.nbytes >= self.STATS_DIRECT_BYTES:
            st = values.segment_stats(flat, [0], [flat.size], logical)[0]
            self._rows["stats"].append((row, *st[:4], int(st[4]), int(st[5])))
            return
        key = (storage, logical)
        p = self._pstats.get(key)
        if p is None:
            p = self._pstats[key] = [bytearray(), [], [], []]
        p[2].append(len(p[0]) // max(c.itemsize, 1))
        p[3].append(flat.size)
        p[1].append(row)
        if c.nbytes:
            p[0] += values.as_bytes(c)
        self._pstats_bytes += c.nbytes

    def _reduce_stats(self):
        """Statistics of the queued small values, vectorised per dtype, as stats rows."""
        for (storage, logical), (buf, rows, starts, counts) in self._pstats.items():
            flat = np.frombuffer(buf, dtype=storage) if buf else np.zeros(0, storage)
            st = values.segment_stats(flat, starts, counts, logical)
            self._rows["stats"].extend(
                zip(rows, st[:, 0].tolist(), st[:, 1].tolist(), st[:, 2].tolist(),
                    st[:, 3].tolist(), st[:, 4].astype(np.int64).tolist(),
                    st[:, 5].astype(np.int64).tolist()))
        self._pstats = {}
        self._pstats_bytes = 0

    def add_meta_value(self, event, slot, dtype_name, shape, *, role=schema.ROLE_OUT, name=None,
                       flags=schema.VFLAG_NOT_STORED):
        """A value whose bytes are not stored (uninitialised memory, meta tensors)."""
        self._rows["values"].append((event, slot, role, flags, self.intern(dtype_name),
                                     self.intern(dtype_name), self.intern(values.shape_str(shape)),
                                     self.intern(name), -1, 0, 0))

    def add_input(self, event, slot, producer, producer_slot=0):
        self._rows["inputs"].append((event, slot, producer, producer_slot))

    # -- manifest --------------------------------------------------------------------------
    def update_manifest(self, **fields):
        self._manifest.update(fields)
        if not self.closed:
            self._f["manifest"][()] = self._manifest_text()

    def _manifest_text(self):
        return json.dumps(self._manifest, sort_keys=True, default=str)

    # -- flushing --------------------------------------------------------------------------
    def flush(self):
        """Write buffered rows and bytes, then advance the committed counts (see the module
        docstring). A write error stops recording; it is never raised to the caller."""
        if self.closed:
            return
        short = self._no_room()
        if short:
            self._stop_cleanly(short)
            return
        try:
            self._write_pending()
            self._commit()
        except Exception as exc:  # disk full, file size limit, I/O error
            self._fail(exc)
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
                size = os.path.getsize(self.path)
                if size + need > limit:
                    return f"file size limit: {limit >> 20} MiB (ulimit -f)"
        except OSError:
            return None
        return None

    def _stop_cleanly(self, reason):
        """Stop recording while the disk still has room to close the file properly."""
        self.error = reason
        self._rows = {name: [] for name in schema.TABLES}
        self._blob = bytearray()
        self._new_strings = []
        self._pstats, self._pstats_bytes = {}, 0
        try:
            self._f.close()
        except Exception:
            pass
        self.closed = True

    def _write_pending(self):
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
        if self._blob:
            n, k = self._blob_written, len(self._blob)
            ds = f["blob"]
            ds.resize((n + k,))
            ds[n:n + k] = np.frombuffer(self._blob, dtype="u1")
            self._blob_written, self._blob = n + k, bytearray()
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
        if FSYNC:
            os.fsync(f.id.get_vfd_handle())

    def _commit(self):
        # Phase 2: the counts a reader trusts, written only once phase 1 is on disk.
        f = self._f
        for name in schema.TABLES:
            f.attrs[f"committed_{name}"] = self._counts[name]
        f.attrs["committed_blob"] = self._blob_written
        f.attrs["committed_strings"] = self._n_strings
        f.attrs["last_flush_unix"] = time.time()
        f.flush()
        self.flushes += 1

    def _fail(self, exc):
        """A write failed although `_no_room` found room (another process filled the disk,
        an I/O error). The HDF5 file is left unclosed: closing it now can crash the
        process (HDF5 2.0); `tracediff record` then exits without closing it."""
        self.error = f"{type(exc).__name__}: {_one_line(exc)}"
        self.closed = True
        self.unclosed = True
        self._rows = {name: [] for name in schema.TABLES}
        self._blob = bytearray()
        self._new_strings = []
        self._pstats, self._pstats_bytes = {}, 0

    def close(self, **manifest_fields):
        """Flush, store the final manifest fields (how the run ended) and mark complete.

        After a write error the trace stays incomplete (`complete` False, its last commit
        readable); the final fields and the error are added to its manifest if the disk
        lets us, which it may not."""
        if self.closed:
            if self.error and not getattr(self, "_error_noted", False):
                self._error_noted = True
                self._manifest.update(manifest_fields)
                self._manifest["recording_error"] = self.error
                if not self.unclosed:
                    try:
                        with h5py.File(self.path, "r+", libver="earliest") as f:
                            f["manifest"][()] = self._manifest_text()
                    except Exception:
                        pass
            return
        self.flush()
        if self.closed:  # the flush failed
            return self.close(**manifest_fields)
        try:
            if manifest_fields:
                self.update_manifest(**manifest_fields)
            self._f.flush()
            self._f.attrs["complete"] = True
            self._f.close()
        except Exception as exc:
            self._fail(exc)
            return self.close(**manifest_fields)
        self.closed = True


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


def _one_line(exc):
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
