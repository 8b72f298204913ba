"""Append-only trace writer: rows and bytes are buffered and flushed in chunks.

One HDF5 dataset per table plus one byte arena (`blob`) for all values: creating a
dataset per tensor was measured 10-170x slower. `TraceWriter` is put together from one
part per concern, each in its own module:

- events.py: interned strings, events, their inputs, devices, source lines and optimizer
  settings;
- value_rows.py: values stored as they come (bytes, or hash and statistics);
- reserved_values.py: value rows reserved now and completed before the flush;
- statistics.py: the statistics of values kept as hash + statistics;
- device_copies.py: per-device copies of a value (shards) and DTensor placements;
- flushing.py: the two-phase flush and commit that keep the file consistent at every
  instant (durability);
- closing.py: the manifest, `close`, compaction, a lost trace or a forked child's.

Under them: pending.py (the value bytes of the next flush), trace_file.py (the file HDF5
writes through, checked before every call), fsync.py (the flush's fsync and write-behind
thread), process_hooks.py (fork, exit and descriptor guards), signals.py (signal
handlers held back while in HDF5; a forked child's handlers made the script's before any
signal reaches it) and settings.py (the tunables).
"""

import os
import time

import h5py

from .. import codec as codecs, schema, values
from . import settings
from .closing import _Closing, write_finished
from .device_copies import _DeviceCopies
from .events import _Events
from .flushing import _Flushing, _no_metadata_evictions
from .pending import _PendingBytes
from .process_hooks import (_guard_descriptors, _live_writers, release_descriptor,
                            reserve_descriptor)
from .reserved_values import _ReservedValues
from .signals import _signals_deferred, installed_handler, on_fork_in_child
from .statistics import _Statistics
from .trace_file import TraceFile
from .value_rows import _Values

__all__ = ["TraceWriter", "TraceFile", "write_finished", "installed_handler",
           "on_fork_in_child", "reserve_descriptor", "release_descriptor"]


class TraceWriter(_Events, _Values, _ReservedValues, _Statistics, _DeviceCopies, _Flushing,
                  _Closing):
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
            f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dt,
                             chunks=(settings.CHUNK_ROWS,))
        f.create_dataset("blob", shape=(0,), maxshape=(None,), dtype="u1",
                         chunks=(settings.CHUNK_BYTES,), **self._blob_filter)
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
        self._flush_bytes = settings.FIRST_FLUSH_BYTES
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
        # sets its framework's own (capture/torch/stats.py: torch ops on the value's device)
        self.stats_reducer = values.segment_stats
        # the hash of every value's exact bytes (values.DIGESTS): xxh3_64, or words64 where a
        # JAX capture hashes on an accelerator (capture/jax/device_digests.py); one per trace, named
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
        if settings.WRITE_BEHIND:
            _guard_descriptors()
