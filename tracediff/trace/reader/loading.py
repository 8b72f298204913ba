"""Loading a trace: its format and version, the committed rows of each table (sizes
against the file's), the value bytes' extent (or a compressed blob's checked chunks),
the strings the tables refer to (bounded, lengths checked before HDF5 reads them) and
the manifest (JSON of the types the reports read). The cross-checks of the rows that
follow are checks.py's.

A part of `Trace` (reader/__init__.py): `_load` sets the state the other parts read.
"""

import json
import os

import h5py
import numpy as np

from ...errors import TraceError
from .. import codec, schema, values
from .heaps import _check_heap, _Heaps, _manifest_size, _scan_heaps, _vlen_spans
from .limits import (MAX_MANIFEST_BYTES, MAX_ONE_STRING_BYTES, MAX_STRING_BYTES, MAX_STRING_LEN,
                     MAX_STRINGS, SLACK_BYTES)
from .opening import _attr, _dataset, _int_attr

# manifest sections the reports read, and the JSON types they must have
_MANIFEST_OBJECTS = ("os", "python", "cpu", "packages", "env", "threads", "recording", "script",
                     "end", "frameworks", "distributed")
_MANIFEST_STRINGS = ("tracediff_version", "created", "hostname")
_SECTION_STRINGS = {"script": ("path", "name", "sha256"), "end": ("status", "exception", "message",
                                                                   "traceback"),
                    "os": ("system", "release", "version", "platform"),
                    "cpu": ("machine", "processor", "model")}


class _Loading:
    """Read and bound-check the file's tables, strings, value bytes and manifest."""

    def _load(self):
        f = self._f
        self.file_size = os.path.getsize(self.path)
        try:  # before any heap is parsed or read: its size is in its reference
            msize = _manifest_size(f, self.path, self.file_size)
        except TraceError:
            raise
        except Exception:
            msize = None  # damaged: the full checks below say how
        if msize is not None and msize > MAX_MANIFEST_BYTES:
            raise TraceError(f"the manifest is {msize:,} bytes, more than the "
                             f"{MAX_MANIFEST_BYTES >> 20} MiB a manifest may hold")
        _scan_heaps(self.path, self.file_size)
        fmt = _attr(f, "format")
        if fmt != schema.FORMAT_NAME:
            raise TraceError(f"{self.path}: an HDF5 file, but not a tracediff trace")
        version = _int_attr(f, "schema_version", -1)
        if version > schema.SCHEMA_VERSION:
            raise TraceError(f"{self.path}: trace schema version {version} is newer than this "
                             f"tracediff reads ({schema.SCHEMA_VERSION}); upgrade tracediff")
        if version < 1:
            raise TraceError(f"{self.path}: invalid schema version {version}")
        self.schema_version = version
        complete = _attr(f, "complete", False)
        self.complete = complete is True or (isinstance(complete, int) and complete == 1)
        budget = self.file_size + SLACK_BYTES
        tables = {}
        for name, dt in schema.TABLES.items():
            if name in schema.OPTIONAL_TABLES and name not in f:
                tables[name] = np.zeros(0, dt)
                continue
            ds = _dataset(f, name)
            if ds.dtype != dt or ds.ndim != 1:
                raise TraceError(f"{self.path}: table {name!r} has an unexpected layout")
            n = max(0, min(_int_attr(f, f"committed_{name}", 0), ds.shape[0]))
            if n * dt.itemsize > budget:
                raise TraceError(f"{self.path}: table {name!r} claims {n} rows, more than the "
                                 f"file can hold")
            tables[name] = ds[:n] if n else np.zeros(0, dt)
            if len(tables[name]) != n:
                raise TraceError(f"{self.path}: table {name!r} is shorter than recorded")
        self.events, self.values, self.inputs = tables["events"], tables["values"], tables["inputs"]
        self.stats_rows = tables["stats"]  # statistics of values stored as stats + hash only
        self._stats_index = None
        self.source_rows = tables["sources"]  # recorded source lines (empty in older traces)
        self.device_rows = tables["devices"]  # the device of per-device events (empty: none)
        self.shard_rows = tables["shards"]    # per-device copies of global values (empty: none)
        self.placement_rows = tables["placements"]  # DTensor local shards (empty: none)
        self.optim_setting_rows = tables["optim_settings"]  # optimizer settings (empty: none)
        self.strings = self._load_strings(_dataset(f, "strings"), _int_attr(f, "committed_strings", 0))
        blob = _dataset(f, "blob", codec_ok=True)
        if blob.dtype != np.uint8 or blob.ndim != 1:
            raise TraceError(f"{self.path}: the value bytes have an unexpected layout")
        self.codec = codec.blob_codec(blob)
        self.chunks = None   # compressed: each chunk checked whole before its bytes are used
        if self.codec != "none":   # compressed: bounded by its checked chunks, not the file
            codec.need_plugin(self.path)
            n_chunks, packed = codec.check_blob_chunks(blob, self.path, self.file_size)
            budget = min(n_chunks * blob.chunks[0], codec.MAX_RATIO * packed)
            self.chunks = codec.ChunkCheck(blob, self.path)
        self.blob_size = max(0, min(_int_attr(f, "committed_blob", 0), blob.shape[0]))
        self._blob = blob   # kept: looking a dataset up by name costs more than a small read
        if self.blob_size > budget:
            more = f"{codec.MAX_RATIO}x its compressed chunks can hold" if self.chunks else \
                "the file holds"
            raise TraceError(f"{self.path}: the trace claims {self.blob_size} value bytes, more "
                             f"than {more}")
        self.manifest = self._load_manifest(_dataset(f, "manifest"))
        self.hash_name, self.hash_function = self._hash_function()
        dist = self.manifest.get("distributed") or {}
        self.rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
        ws = dist.get("world_size")
        self.world_size = ws if isinstance(ws, int) and not isinstance(ws, bool) else None
        self._check_tables()
        self._v_order = np.argsort(self.values["event"], kind="stable")
        self._v_sorted = self.values["event"][self._v_order]
        self._i_order = np.argsort(self.inputs["event"], kind="stable")
        self._i_sorted = self.inputs["event"][self._i_order]

    def _hash_function(self):
        """(name, function) of the hash the trace's values were recorded with (manifest
        recording.hash; older traces: xxh3_64). A compressed trace's bytes are checked
        with it (`check_digest`), so one naming a hash this reader does not know is
        refused; an uncompressed one opens (function None: its bytes are not rehashed)."""
        rec = self.manifest.get("recording")
        name = rec.get("hash", values.HASH_NAME) if isinstance(rec, dict) else values.HASH_NAME
        fn = values.DIGESTS.get(name) if isinstance(name, str) else None
        if fn is None and self.chunks is not None:
            raise TraceError(f"{self.path}: the values are hashed with {str(name)[:40]!r}, "
                             f"which this tracediff cannot check (it knows "
                             f"{', '.join(values.DIGESTS)})")
        return name if fn is not None else str(name)[:40], fn

    def _referenced_strings(self, n):
        """Sorted indices of the strings that the events, values and sources tables refer to."""
        cols = [self.events[c] for c in ("op", "params", "name_stack", "source", "node")] + \
            [self.values[c] for c in ("dtype", "storage", "shape", "name")] + \
            [self.source_rows[c] for c in ("source", "lines", "sha256")] + \
            [self.device_rows["device"]] + [self.shard_rows[c] for c in ("device", "index", "shape")] + \
            [self.placement_rows[c] for c in schema.PLACEMENT_STRINGS] + \
            [self.optim_setting_rows[c] for c in schema.OPTIM_SETTING_STRINGS]
        ref = np.unique(np.concatenate([np.asarray(c, np.int64) for c in cols])) if cols else \
            np.zeros(0, np.int64)
        return ref[(ref >= 0) & (ref < n)]

    def _load_strings(self, ds, committed):
        """The strings table as a list; entries no table refers to are "" (never read)."""
        info = h5py.check_string_dtype(ds.dtype)
        if ds.ndim != 1 or info is None:
            raise TraceError(f"{self.path}: the strings table has an unexpected layout")
        n = max(0, min(committed, ds.shape[0]))
        if n > MAX_STRINGS:
            raise TraceError(f"{self.path}: the strings table holds {n:,} strings, more than "
                             f"the {MAX_STRINGS:,} a trace may hold")
        # every stored string takes >= 16 bytes (variable length) or its fixed length
        if n * max(16, ds.dtype.itemsize) > self.file_size + SLACK_BYTES:
            raise TraceError(f"{self.path}: the strings table claims {n} strings, more than "
                             f"the file can hold")
        if info.length is not None and ds.dtype.itemsize > MAX_ONE_STRING_BYTES:
            raise TraceError(f"{self.path}: the strings table has {ds.dtype.itemsize:,}-byte "
                             f"strings, more than the {MAX_ONE_STRING_BYTES >> 20} MiB a string "
                             f"may hold")
        ref = self._referenced_strings(n)
        out = [""] * n
        heaps = _Heaps(self.path, self.file_size) if info.length is None else None
        spans = _vlen_spans(ds) if heaps is not None and len(ref) else None
        limit = min(MAX_STRING_BYTES, self.file_size + SLACK_BYTES)
        total, step = 0, 1 << 16
        for lo in range(0, n, step):  # in slices, only where a string is referred to
            a, b = np.searchsorted(ref, [lo, lo + step])
            if a == b:
                continue
            sel = ref[a:b]
            lo_, hi_ = int(sel[0]), int(sel[-1]) + 1
            if heaps is not None:   # lengths first: HDF5 reads every string of the range
                lengths = heaps.lengths(ds, lo_, hi_, spans)
                longest = int(lengths.max())
                if longest > MAX_ONE_STRING_BYTES:
                    raise TraceError(f"{self.path}: the strings table holds a string of "
                                     f"{longest:,} bytes, more than the "
                                     f"{MAX_ONE_STRING_BYTES >> 20} MiB a string may hold")
                if total + int(lengths.sum()) > limit:
                    raise TraceError(f"{self.path}: the strings table is implausibly large")
            chunk = ds[lo_:hi_]
            for i in sel.tolist():
                s = chunk[i - lo_]
                s = s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s)
                total += len(s)
                if len(s) > MAX_STRING_LEN:  # names, sources, params are short; a report
                    s = s[:MAX_STRING_LEN] + "…"  # must not spend minutes laying out one
                out[i] = s
            if total > limit:
                raise TraceError(f"{self.path}: the strings table is implausibly large")
        return out

    def _load_manifest(self, mds):
        if mds.shape != () or h5py.check_string_dtype(mds.dtype) is None:
            raise TraceError(f"{self.path}: manifest is not a JSON string")
        if h5py.check_string_dtype(mds.dtype).length is not None and \
                mds.dtype.itemsize > MAX_MANIFEST_BYTES:
            raise TraceError(f"{self.path}: manifest is implausibly large")
        if h5py.check_string_dtype(mds.dtype).length is None:
            size = int(_check_heap(mds, self.path, self.file_size)[0])
            if size > MAX_MANIFEST_BYTES:
                raise TraceError(f"{self.path}: the manifest is {size:,} bytes, more than the "
                                 f"{MAX_MANIFEST_BYTES >> 20} MiB a manifest may hold")
        text = mds[()]
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if not isinstance(text, str):
            raise TraceError(f"{self.path}: manifest is not a JSON string")
        if len(text) > MAX_MANIFEST_BYTES:
            raise TraceError(f"{self.path}: manifest is implausibly large")
        try:
            manifest = json.loads(text)
        except (ValueError, RecursionError):
            raise TraceError(f"{self.path}: manifest is not valid JSON") from None
        if not isinstance(manifest, dict):
            raise TraceError(f"{self.path}: manifest is not a JSON object")
        for key in _MANIFEST_OBJECTS:
            if manifest.get(key) is not None and not isinstance(manifest[key], dict):
                raise TraceError(f"{self.path}: manifest field {key!r} is not an object")
        for key in _MANIFEST_STRINGS:
            if manifest.get(key) is not None and not isinstance(manifest[key], str):
                raise TraceError(f"{self.path}: manifest field {key!r} is not a string")
        for section, keys in _SECTION_STRINGS.items():
            for key in keys:
                v = (manifest.get(section) or {}).get(key)
                if v is not None and not isinstance(v, str):
                    raise TraceError(f"{self.path}: manifest field {section}.{key} is not a string")
        for key, value in (manifest.get("frameworks") or {}).items():
            if key in ("jax", "torch") and value is not None and not isinstance(value, dict):
                raise TraceError(f"{self.path}: manifest field frameworks.{key} is not an object")
        code = (manifest.get("end") or {}).get("exit_code")
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            raise TraceError(f"{self.path}: manifest field end.exit_code is not an integer")
        return manifest
