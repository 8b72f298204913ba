"""Statistics of values kept as hash + statistics (`--level stats`, past `--max-bytes`):
small values are copied into one arena per dtype and reduced in batches, large ones at
once (with a memo by hash), both through the capture's `stats_reducer`.

A part of `TraceWriter` (writer/__init__.py), whose `__init__` sets the state used here:
`_pstats`, `_pstats_bytes`, `_arenas`, `_stats_memo`, `stats_reducer`, `stats_values`.
"""

import numpy as np

from .. import values
from . import settings


class _Statistics:
    """Queue a value's statistics (`_add_stats`) and reduce the queued batches."""

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
                    if len(memo) >= settings.STATS_MEMO_VALUES:
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
        if self._pstats_bytes >= settings.STATS_BATCH_BYTES:
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


class _StatsArena:
    """The bytes of one dtype's batch of small values queued for statistics (`pbuf +=
    data`, `len(pbuf)`), in one buffer reused by every batch. A fresh bytearray per batch
    grew into fresh pages each time, and first touches of fresh pages cost ~30-50 us a
    page on this VM: that made `--level stats` dearer than `full`, whose byte arena
    (`_PendingBytes`) is reused."""

    __slots__ = ("arr", "mem", "used")

    def __init__(self):
        self.arr = np.empty(settings.STATS_BATCH_BYTES + values.WHOLE_VALUE_BYTES, "u1")
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
