"""Reading recorded values: an event's outputs, one row's array (bounds, shape and dtype
checked; a compressed trace's bytes checked against their recorded hash), its
statistics (the stats table's, or computed from its bytes) and its metadata.

A part of `Trace` (reader/__init__.py).
"""

import numpy as np

from ...errors import TraceError, one_line
from .. import schema, values
from .limits import MAX_DIMS


class _ValueReads:
    """Values of the trace as numpy arrays, statistics and metadata."""

    def outputs(self, eid):
        """The output values of event `eid` as numpy arrays, by slot (None where a value
        was not stored, e.g. uninitialised memory)."""
        rows = self.value_rows(int(eid), schema.ROLE_OUT)
        rows = rows[np.argsort(rows["slot"], kind="stable")]
        return [self.read_value(r) for r in rows]

    def read_value(self, row):
        """The numpy array stored for one values-table row, or None if not stored."""
        if row["offset"] < 0 or row["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT):
            return None
        off, n = int(row["offset"]), int(row["nbytes"])
        if n < 0 or off + n > self.blob_size:
            raise TraceError(f"{self.path}: value bytes lie outside the stored data (truncated?)")
        storage = self.string(row["storage"])
        shape = self._shape(row)
        itemsize = np.dtype(storage).itemsize if storage in values._NATIVE else 0
        count = 1
        for d in shape:
            count *= d
        if itemsize == 0 or count * itemsize != n:
            raise TraceError(f"{self.path}: value size does not match its shape and dtype")
        raw = self.stored_bytes(off, n, row["hash"])
        try:
            return values.decode(raw, self.string(row["dtype"]), storage, shape)
        except Exception as exc:
            raise TraceError(f"{self.path}: damaged trace ({one_line(exc, 160, with_type=True)})") from None

    def stored_bytes(self, off, n, digest):
        """Bytes [off, off+n) of the value arena (bounds checked by the caller). In a
        compressed trace, its chunks are checked and the bytes must match the recorded
        hash: a damaged chunk reads as zeros, which are never shown as the value."""
        try:
            if self.chunks is not None:
                self.chunks.span(off, n)
            raw = self._blob[off:off + n].tobytes()
        except TraceError:
            raise
        except Exception as exc:
            raise TraceError(f"{self.path}: damaged trace ({one_line(exc, 160, with_type=True)})") from None
        if self.chunks is not None:
            self.check_digest(raw, off, digest)
        return raw

    def check_digest(self, raw, off, digest):
        """TraceError unless `raw` (the value at byte `off`) hashes to `digest` with the
        trace's own hash function (`hash_name`)."""
        if self.hash_function(raw) != int(digest):
            raise TraceError(f"{self.path}: the value at byte {off} of the compressed value bytes "
                             f"does not match its recorded hash (a damaged chunk)")

    def _shape(self, row):
        try:
            return values.parse_shape(self.string(row["shape"]), MAX_DIMS)
        except ValueError as exc:
            raise TraceError(f"{self.path}: damaged trace (value shape: {exc})") from None

    def value_meta(self, row):
        s = self.string
        return {"dtype": s(row["dtype"]), "shape": list(self._shape(row)),
                "name": s(row["name"]) if row["name"] >= 0 else None,
                "stored": bool(row["offset"] >= 0 and not row["flags"] & schema.VFLAG_NOT_STORED),
                "uninitialized": bool(row["flags"] & schema.VFLAG_UNINIT),
                "hash": f"{int(row['hash']):016x}", "nbytes": int(row["nbytes"])}

    def value_stats(self, row):
        """Statistics of one values-table row as a dict (`values.STAT_FIELDS`: min, max, mean,
        l2, nan, inf), from the stats table for a stats-only value (VFLAG_STATS) or computed
        from the stored bytes; None when neither exists (metadata-only values)."""
        if row["flags"] & schema.VFLAG_STATS:
            if self._stats_index is None:
                self._build_stats_index()
            keys, order = self._stats_index
            k = (int(row["event"]) << 21) | (int(row["role"]) << 20) | (int(row["slot"]) & 0xFFFFF)
            i = int(np.searchsorted(keys, k))
            if i < len(keys) and keys[i] == k:
                r = self.stats_rows[order[i]]
                return {f: (int(r[f]) if f in ("nan", "inf") else float(r[f]))
                        for f in values.STAT_FIELDS}
            return None
        x = self.read_value(row)
        if x is None:
            return None
        st = values.value_stats(np.asarray(x).view(self.string(row["storage"])),
                                self.string(row["dtype"]))
        return dict(zip(values.STAT_FIELDS, (int(v) if f in ("nan", "inf") else v
                                             for f, v in zip(values.STAT_FIELDS, st))))

    def _build_stats_index(self):
        st = self.stats_rows
        ok = (st["value"] >= 0) & (st["value"] < len(self.values))
        st_idx = np.flatnonzero(ok)
        v = self.values[st["value"][ok]]
        keys = (v["event"].astype(np.int64) << 21) | (v["role"].astype(np.int64) << 20) | \
            (v["slot"].astype(np.int64) & 0xFFFFF)
        order = np.argsort(keys, kind="stable")
        self._stats_index = (keys[order], st_idx[order])
