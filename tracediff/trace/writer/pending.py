"""The value bytes of the next flush (`_PendingBytes`: copied small values and held large
buffers, in blob order) and how a flush cuts them into the blob's chunks (`_regions`).
"""

import numpy as np

from . import settings


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
            grown = np.empty(max(end, 2 * len(self._arr), settings.FIRST_FLUSH_BYTES), "u1")
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
