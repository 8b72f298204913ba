"""How many NaN and Inf elements each recorded value holds: the one fact the search for a
non-finite value's origin needs, at every level.

A stats-level value carries its counts in the `/stats` table (exact, computed where the
value lay); a stored value's counts come from its bytes, read in large slabs (a float's
class is in its exponent bits, so float32, float64, float16 and bfloat16 are told apart
with integer masks on the stored words, no conversion). Integers and booleans are always
finite. A value with neither bytes nor statistics (metadata only, uninitialised memory, an
`--ops` window) is unknown: -1.
"""

import numpy as np

from ...trace import schema, values

# (exponent mask, mantissa mask) of the stored words of each float dtype: every exponent bit
# set is Inf (mantissa 0) or NaN
_EXPONENT = {
    "float16": (np.uint16, 0x7C00, 0x03FF),
    "bfloat16": (np.uint16, 0x7F80, 0x007F),
    "float32": (np.uint32, 0x7F800000, 0x007FFFFF),
    "float64": (np.uint64, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
    "complex64": (np.uint32, 0x7F800000, 0x007FFFFF),
    "complex128": (np.uint64, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
}
_NEVER = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "int4", "uint4", "int2", "uint2"}
SLAB_BYTES = 64 << 20    # the value bytes read at a time


def word_counts(raw, logical):
    """(NaN count, Inf count) of one value's stored bytes, or None for a dtype with no
    known float layout. Exact: the exponent and mantissa bits decide."""
    if logical in _NEVER or logical.startswith("key<"):
        return 0, 0
    layout = _EXPONENT.get(logical)
    if layout is None:
        return _decoded_counts(raw, logical)
    word, exp, man = layout
    w = np.frombuffer(raw, dtype=word)
    top = (w & word(exp)) == word(exp)
    if not top.any():
        return 0, 0
    nan = int(np.count_nonzero(top & ((w & word(man)) != 0)))
    return nan, int(np.count_nonzero(top)) - nan


def _decoded_counts(raw, logical):
    """float8, float6, float4 (one byte an element, stored as uint8): decoded, then
    counted (rare, small)."""
    try:
        x = values.decode(raw, logical, "uint8", (len(raw),)).astype(np.float32)
    except (ValueError, TypeError, AttributeError):
        return None
    nan = int(np.count_nonzero(np.isnan(x)))
    return nan, int(np.count_nonzero(np.isinf(x)))


class Counts:
    """NaN and Inf counts of every value row of one trace: `nan[row]`, `inf[row]`, -1 where
    unknown. Stats rows are read from their table, stored rows from their bytes, in
    slabs of `SLAB_BYTES` (a slab is one read of the value bytes)."""

    def __init__(self, t):
        self.t = t
        v = t.values
        n = len(v)
        self.nan = np.full(n, -1, np.int64)
        self.inf = np.full(n, -1, np.int64)
        st = t.stats_rows
        if len(st):
            st = st[(st["value"] >= 0) & (st["value"] < n)]
            st = st[(v["flags"][st["value"]] & schema.VFLAG_STATS) != 0]
            self.nan[st["value"]] = st["nan"]
            self.inf[st["value"]] = st["inf"]
        stored, _ = values.rows_with_data(v)
        pending = np.flatnonzero(stored & (self.nan < 0))
        pending = pending[np.argsort(v["offset"][pending], kind="stable")]
        done = 0
        while done < len(pending):
            stop = self._slab_end(pending, done)
            self._read(pending[done:stop])
            done = stop

    def _slab_end(self, pending, start):
        """The end of the run of rows from `start` (in byte order) that one slab holds."""
        v = self.t.values
        end = v["offset"][pending[start:]] + v["nbytes"][pending[start:]]
        lo = int(v["offset"][pending[start]])
        fits = int(np.searchsorted(np.maximum.accumulate(end) - lo, SLAB_BYTES, side="right"))
        return start + max(1, fits)

    def _read(self, rows):
        """Counts of `rows` (a run in byte order): one read of their bytes, then one pass of
        integer masks per float layout and alignment over the slab, each row's counts the
        difference of two running sums; other dtypes (float8) value by value."""
        t = self.t
        v = t.values[rows]
        if t.chunks is not None:   # compressed: each value's chunks checked against its hash
            for row, r in zip(rows.tolist(), v):
                got = word_counts(t.stored_bytes(int(r["offset"]), int(r["nbytes"]), r["hash"]),
                                  t.string(r["dtype"]))
                if got is not None:
                    self.nan[row], self.inf[row] = got
            return
        lo = int(v["offset"][0])   # one read; offsets were checked against the bytes at open
        slab = t.stored_bytes(lo, int((v["offset"] + v["nbytes"]).max()) - lo, 0)
        names = np.array([t.string(d) for d in v["dtype"].tolist()], dtype=object)
        rel = v["offset"] - lo
        for name in np.unique(names).tolist():
            sel = np.flatnonzero(names == name)
            if name in _NEVER or name.startswith("key<"):
                self.nan[rows[sel]] = self.inf[rows[sel]] = 0
            elif name in _EXPONENT:
                self._masked(slab, rows[sel], rel[sel], v["nbytes"][sel], _EXPONENT[name])
            else:
                for i in sel.tolist():
                    got = word_counts(slab[rel[i]:rel[i] + v["nbytes"][i]], name)
                    if got is not None:
                        self.nan[rows[i]], self.inf[rows[i]] = got

    def _masked(self, slab, rows, rel, nbytes, layout):
        word, exp, man = layout
        size = np.dtype(word).itemsize
        for r in np.unique(rel % size).tolist():
            sel = np.flatnonzero(rel % size == r)
            w = np.frombuffer(slab, dtype=word, offset=r, count=(len(slab) - r) // size)
            top = (w & word(exp)) == word(exp)
            if not top.any():
                self.nan[rows[sel]] = self.inf[rows[sel]] = 0
                continue
            start = (rel[sel] - r) // size
            stop = start + nbytes[sel] // size
            at = np.flatnonzero(top)                       # the non-finite words, in order
            nan_at = at[(w[at] & word(man)) != 0]
            nan = np.searchsorted(nan_at, stop) - np.searchsorted(nan_at, start)
            self.nan[rows[sel]] = nan
            self.inf[rows[sel]] = np.searchsorted(at, stop) - np.searchsorted(at, start) - nan

    def of_rows(self, rows):
        """(nan, inf) arrays of these row numbers."""
        return self.nan[rows], self.inf[rows]
