"""Reading many stored values fast: the byte arena in memory when it is small, gathered
slabs when it is not.

`Trace.read_value` reads one value by its row; the differ reads thousands, so
`ValueReader` keeps the whole arena (`blob`) in memory up to `BLOB_IN_MEMORY` and
`gather` concatenates the bytes of many values with one read of the slab that covers
them (values of consecutive events lie close together). In a compressed trace every value
read is checked against its recorded hash (`Trace.stored_bytes`): the whole arena once
when it is kept in memory, each value as it is gathered otherwise.
"""

import numpy as np

from ..errors import TraceError
from . import schema
from .values import _NATIVE, decode, parse_shape

BLOB_IN_MEMORY = 256 << 20   # larger byte arenas are read value by value (bounded memory)


class ValueReader:
    """Reads stored values; keeps the whole byte arena in memory when it is small."""

    def __init__(self, trace):
        self.t = trace
        self.blob = None
        if trace.blob_size <= BLOB_IN_MEMORY:
            if trace.chunks is not None:
                trace.chunks.span(0, trace.blob_size)
            self.blob = trace._blob[:trace.blob_size] if trace.blob_size else np.zeros(0, "u1")
            if trace.chunks is not None:
                self._check_all()

    def _check_all(self):
        """Every stored value (and shard) of a compressed trace against its hash."""
        t = self.t
        for rows in (t.values, t.shard_rows):
            stored = rows[rows["offset"] >= 0]
            if rows is t.values:
                stored = stored[(stored["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT)) == 0]
            for off, n, h in zip(stored["offset"].tolist(), stored["nbytes"].tolist(),
                                 stored["hash"].tolist()):
                t.check_digest(self.blob[off:off + n], off, h)

    def gather(self, offsets, lengths, hashes):
        """Concatenated bytes of many stored values (offsets/lengths checked by the caller;
        `hashes` their recorded hashes, checked in a compressed trace). Streams from the
        file when the arena is not in memory: one read of the slab that covers the values
        (they lie close together: a chunk of consecutive events), so memory stays bounded
        by the caller's chunk size."""
        if self.blob is not None:
            return gather_slices(self.blob, offsets, lengths)
        if self.t.chunks is not None:
            return np.frombuffer(b"".join(self.t.stored_bytes(int(o), int(n), h) for o, n, h in
                                          zip(offsets, lengths, hashes)), "u1")
        lo = int(offsets.min())
        hi = int((offsets + lengths).max())
        if hi > self.t.blob_size:
            raise TraceError(f"{self.t.path}: value bytes lie outside the stored data")
        total = int(lengths.sum())
        if hi - lo <= 4 * total + (1 << 20):
            slab = self.t._blob[lo:hi]
            return gather_slices(slab, offsets - lo, lengths)
        ds = self.t._blob
        return np.concatenate([ds[int(o):int(o) + int(n)] for o, n in zip(offsets, lengths)]) \
            if len(offsets) else np.zeros(0, "u1")

    def read(self, row):
        if self.blob is None:
            return self.t.read_value(row)
        if row["offset"] < 0 or row["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT):
            return None
        s = self.t.string
        off, n = int(row["offset"]), int(row["nbytes"])
        if n < 0 or off + n > len(self.blob):
            raise TraceError(f"{self.t.path}: value bytes lie outside the stored data (truncated?)")
        storage = s(row["storage"])
        try:
            shape = parse_shape(s(row["shape"]))
        except ValueError as exc:
            raise TraceError(f"{self.t.path}: bad value shape ({exc})") from None
        if storage not in _NATIVE:
            raise TraceError(f"{self.t.path}: unknown storage dtype {storage!r}")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * np.dtype(storage).itemsize != n:
            raise TraceError(f"{self.t.path}: value size does not match its shape and dtype")
        return decode(self.blob[off:off + n].tobytes(), s(row["dtype"]), storage, shape)


def gather_slices(buf, offsets, lengths):
    """Like `_gather`, faster and without per-byte index arrays (whose memory grows with 16x
    the bytes gathered): back-to-back values are one slice, values of >= 64 bytes on average
    are sliced and concatenated, only tiny ones go through `_gather`."""
    n = len(offsets)
    if not n:
        return np.zeros(0, "u1")
    offsets = offsets.astype(np.int64)
    ends = offsets + lengths.astype(np.int64)
    if n == 1 or (offsets[1:] == ends[:-1]).all():
        return buf[int(offsets[0]):int(ends[-1])]
    if int(lengths.sum()) >= 64 * n:
        return np.concatenate([buf[o:e] for o, e in zip(offsets.tolist(), ends.tolist())])
    return _gather(buf, offsets, lengths)


def _gather(blob, offsets, lengths):
    """Concatenated byte slices blob[o:o+n] for many (o, n), vectorised."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    starts = np.repeat(offsets.astype(np.int64) - np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                       lengths)
    return blob[starts + np.arange(total, dtype=np.int64)]

