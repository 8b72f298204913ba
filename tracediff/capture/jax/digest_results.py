"""What is hashed on the device, and what comes back to the host.

Which JAX values take the device path (`dtype_ok`, `can_digest`, `on_device`), which
come back at level full inside one joined buffer (`joined`, `JOIN_VALUE`), and the
results of the digest programs (digest_programs.py) on their way to the host: `Result`
(one dispatched program and the rows it fills), `Ref` (one value of it), `Fetched`,
`Joined` and `HostView` (bytes read only when first needed), unpacked with numpy
(`unpack_all`, `finish_all`: the hashes, no Python loop a value).
"""

import math

import numpy as np

from ...trace import values
from . import digest_stats

# uint32 words a value: 2 hash lanes; min, max and digest_stats.TERMS sums as float32; NaN,
# Inf and finite counts
WORDS = 2 + 2 + digest_stats.TERMS + 3

# At level full, values of at most JOIN_VALUE bytes come back from the device as one buffer
# of their words (`joined`), up to JOIN_CALL bytes at a time: a copy to the host costs
# ~0.5 ms on a TPU v5e whatever its size, and a jitted step of a small model has ~300 such
# values (docs/accelerators.md). Larger values come back one copy each.
JOIN_VALUE = 1 << 20
JOIN_CALL = 256 << 20


def joined(shapes):
    """Per value ((shape, dtype) pairs): is it returned inside the joined buffer? Values of
    at most JOIN_VALUE bytes, while the total stays within JOIN_CALL; never on a process
    with several devices (a value spread over them is recorded shard by shard,
    devices.store_shards, from the array itself)."""
    import jax

    if jax.local_device_count() != 1 or jax.process_count() != 1:
        return [False] * len(shapes)
    out, total = [], 0
    for shape, dtype in shapes:
        n = math.prod(shape) * np.dtype(dtype).itemsize
        j = n <= JOIN_VALUE and total + n <= JOIN_CALL
        total += n if j else 0
        out.append(j)
    return out


def join_groups(avals):
    """The joined values' order in their buffer ((shape, dtype) of each, in value order):
    lists of indices of one shape and dtype, in order of first appearance, so that `join`
    may stack a group's values and take their words at once (one relayout a shape instead
    of one a value: a Flax block's ~300 small values joined value by value took a TPU v5e
    17 s to compile)."""
    groups = {}
    for i, (shape, dtype) in enumerate(avals):
        groups.setdefault((tuple(shape), np.dtype(dtype)), []).append(i)
    return list(groups.values())


def join_pieces(avals, most):
    """`join_groups`' groups cut into at most `most` runs of whole groups, as lists of value
    indices in buffer order: joined one program a run, compiled side by side, their
    buffers end to end are the one join's (a Flax block's ~300 small values in ~40 groups
    took one program 5-7 s to compile on a TPU v5e, past the end of a 2-step script)."""
    groups = join_groups(avals)
    n = min(most, len(groups))
    cuts = [len(groups) * k // n for k in range(n + 1)]
    return [[i for g in groups[a:b] for i in g] for a, b in zip(cuts, cuts[1:])]


def joined_starts(avals, small):
    """The byte offset of each joined value in its buffer (`join`: in `join_groups`' order,
    each starting on a word), None for the others."""
    at_small = [i for i, j in enumerate(small) if j]
    out, at = [None] * len(avals), 0
    for k in (k for group in join_groups([avals[i] for i in at_small]) for k in group):
        i = at_small[k]
        shape, dtype = avals[i]
        out[i] = at
        at += word_bytes(shape, dtype)
    return out


def word_bytes(shape, dtype):
    """The bytes a value takes in a joined buffer: its own, up to a whole word."""
    return (math.prod(shape) * np.dtype(dtype).itemsize + 3) // 4 * 4


def view_at(data, start, dtype, shape):
    """A joined value's bytes on the host (`data`: the joined buffer as uint8, `start`:
    from `joined_starts`) as an array of its dtype and shape, without a copy."""
    dtype = np.dtype(dtype)
    return data[start:start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


def unpack_all(host, with_stats):
    """(hashes-to-be lanes as two uint64 arrays, then the statistics and counts of
    `stat_rows`, or None and None without statistics) of a packed result, every value
    at once (numpy, no Python loop)."""
    width = WORDS if with_stats else 2
    rows = np.asarray(host, np.uint32).reshape(-1, width)
    st, counts = stat_rows(rows[:, 2:]) if with_stats else (None, None)
    return rows[:, 0].astype(np.uint64), rows[:, 1].astype(np.uint64), st, counts


def stat_rows(words):
    """(min, max, mean, L2 as float64 rows; NaN and Inf counts as int64 rows) of values
    from their statistics' words (`digest_programs.stat_words`, WORDS - 2 a value): mean
    and L2 from their sums by `digest_stats.finish`."""
    words = np.asarray(words, np.uint32).reshape(-1, WORDS - 2)
    floats = words[:, :2 + digest_stats.TERMS].copy().view(np.float32)
    counts = words[:, 2 + digest_stats.TERMS:].astype(np.int64)
    st = np.empty((len(words), 4))
    st[:, :2] = floats[:, :2]
    st[:, 2], st[:, 3] = digest_stats.finish(floats[:, 2:], counts[:, 2])
    return st, counts[:, :2]


def rows_of(outs, width, take=None):
    """Several programs' packed results (a list: the group programs', or one program a
    value) on the host as one (values, width) array, in the values' order where `take`
    gives it (`Result.take`); waits for them. No programs (every value of a batch went
    another way: 64-bit values are summarised on the host) is no rows."""
    if not outs:
        return np.zeros((0, width), np.uint32)
    host = np.concatenate([np.asarray(o).reshape(-1, width) for o in outs])
    return host if take is None else host[take]


def finish_all(lane1, lane2, nbytes):
    """`values.words_finish` of arrays of lanes and byte counts (uint64 arithmetic)."""
    m1, m2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
    s33 = np.uint64(33)
    with np.errstate(over="ignore"):
        h = ((lane1 << np.uint64(32)) | lane2) ^ (
            np.asarray(nbytes, np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        h ^= h >> s33
        h *= m1
        h ^= h >> s33
        h *= m2
        h ^= h >> s33
    h[h == 0] = 1
    return h


def storage_of(dtype):
    """(storage dtype name, logical name) of a JAX dtype, as values.prepare names them."""
    name, storage = values.storage_names(np.dtype(dtype))
    return storage, name


def dtype_ok(dtype):
    """Is this dtype hashed (and summarised) on the device? Real, integer, bool and
    complex64 values of at most 4-byte parts; not 64-bit floats, integers or complex128
    (emulated or unimplemented on a TPU, where a lone program over one can abort the
    process): those, PRNG keys (their key_data is) and float0 take the host path."""
    try:
        nd = np.dtype(dtype)
    except TypeError:   # PRNG key dtypes
        return False
    name = values._dtype_name(nd)
    if name in values._ML_DTYPES:        # bfloat16, float8s: numpy kind "V", 1-2 bytes
        return nd.itemsize <= 4
    if nd.kind not in "fiubc" or (nd.itemsize > 4 and nd != np.complex64):
        return False
    return name in values._NATIVE


_DTYPE_OK = {}       # dtype -> dtype_ok(dtype)
_ONE_DEVICE = {}     # id(sharding) -> (sharding, on one device): a call's outputs share theirs


def can_digest(x):
    """`dtype_ok` and a live array committed to one device (a global array over several
    keeps the host path, which also records its shards)."""
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        return False
    dtype = getattr(x, "dtype", None)
    try:
        ok = _DTYPE_OK.get(dtype)
    except TypeError:    # an unhashable dtype-like: not cached
        ok = None
    if ok is None:
        ok = dtype_ok(dtype)
        try:
            _DTYPE_OK[dtype] = ok
        except TypeError:
            pass
    if not ok:
        return False
    try:
        hit = _ONE_DEVICE.get(id(sharding))
        if hit is None or hit[0] is not sharding:
            if len(_ONE_DEVICE) > 4096:
                _ONE_DEVICE.clear()
            hit = _ONE_DEVICE[id(sharding)] = (sharding, len(sharding.device_set) == 1)
        return hit[1] and not x.is_deleted()
    except Exception:
        return False


def on_device():
    """Hash and summarise JAX values on their device? On an accelerator backend, unless
    TRACEDIFF_JAX_DIGEST_ON_DEVICE says otherwise (1: also on XLA:CPU, as the tests run the
    device code path; 0: never)."""
    import os

    forced = os.environ.get("TRACEDIFF_JAX_DIGEST_ON_DEVICE")
    if forced in ("0", "1"):
        return forced == "1"
    import jax

    return jax.default_backend() != "cpu"


class Result:
    """One dispatched packed result (`packed`: WORDS, or 2, uint32 words a value) and the
    rows it fills: `rows[i]` = (handle, nbytes) of value i (handle None: no row of its
    own, or outside an --ops/--modules window); `extra` = (handle, nbytes, i): rows
    reserved later for value i (`DeviceDigests.add_ref`); `host` = (lane1, lane2, stats
    floats, counts) once read at a drain. `out` is one device array, or a list of them
    (a batch run one program a value, or by groups: digest_groups.py, whose rows end to
    end are reordered by `take`)."""

    __slots__ = ("out", "rows", "extra", "host", "take")

    def __init__(self, out=None, rows=None, take=None):
        self.out, self.rows, self.extra, self.host = out, [] if rows is None else rows, [], None
        self.take = take


class Ref:
    """Value `index` of a `Result`, with its dtype, shape and byte count: its row in
    another event (an optimizer step's values are the tagged equations' outputs; a probe's
    final outputs are its equations' outputs), or its hash for `compare_later`."""

    __slots__ = ("result", "index", "dtype", "shape", "nbytes", "array")

    def __init__(self, result, index, dtype, shape, nbytes, array=None):
        self.result, self.index, self.dtype, self.shape, self.nbytes = \
            result, index, dtype, shape, nbytes
        self.array = array   # the value itself, where a caller may still need it


class Fetched:
    """Level full: a value already brought to the host by `DeviceDigests.fetch` and its
    hash (`value`: a host view, or the array whose copy was started): an optimizer step's
    row takes it as it is, with no second program or copy; `kept`: where the trace's blob
    holds its bytes already (`TraceWriter.keep_joined`), for a row that points there."""

    __slots__ = ("value", "h", "kept")

    def __init__(self, value, h, kept=None):
        self.value, self.h, self.kept = value, h, kept


class Joined:
    """The joined buffer of a values program (`fetch_parts`), or one value too large to
    join, on its way to the host: its copy starts when it is made and it is read once,
    when something first needs its bytes (`HostView`), at the latest when the trace writes
    it (`TraceWriter.keep_joined` holds it, not a copy). The wait for the copy then falls
    at the trace's next flush, a few steps later, instead of in every recorded call (~4 ms
    a step for 14 MB on a TPU v5e)."""

    __slots__ = ("_parts", "_host", "nbytes")

    def __init__(self, flat, copy=True):
        """flat: an array, or a list of arrays joined end to end (a join in pieces:
        `join_pieces`); copy: start the copies now (False: bytes that will most likely
        never be read)."""
        parts = flat if isinstance(flat, list) else [flat]
        if copy:
            for p in parts:
                try:
                    p.copy_to_host_async()
                except Exception:
                    pass
        self._parts, self._host, self.nbytes = parts, None, sum(p.nbytes for p in parts)

    def __call__(self):
        """The bytes, as a flat uint8 array (read now if not yet)."""
        if self._host is None:
            parts = [np.asarray(p).reshape(-1).view(np.uint8) for p in self._parts]
            self._host = parts[0] if len(parts) == 1 else np.concatenate(parts)
            self._parts = None
        return self._host


class HostView:
    """A joined value's bytes on the host (`view_at` of a `Joined`), read only when
    `np.asarray` asks: a row that points at bytes the trace holds already needs only the
    dtype and shape."""

    __slots__ = ("joined", "start", "dtype", "shape")

    def __init__(self, joined, start, dtype, shape):
        self.joined, self.start, self.dtype, self.shape = joined, start, np.dtype(dtype), shape

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.dtype.itemsize

    def __array__(self, dtype=None, copy=None):
        a = view_at(self.joined(), self.start, self.dtype, self.shape)
        return a if dtype is None else a.astype(dtype)
