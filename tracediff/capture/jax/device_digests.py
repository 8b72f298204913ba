"""Hashes and statistics of JAX values computed where the values are (issue 37).

On an accelerator, copying every value to the host to hash and summarise it there costs
more than anything else (a 4096-wide MLP's Adam step: 14 GB of intermediates, 21
CPU-seconds a step on a TPU v5e's host). Here XLA computes, on the value's device, the
words64 hash of its exact bytes (trace/values.py: the very function numpy computes for
values already on the host, so traces from two backends compare hash to hash) and its
statistics (`values.STAT_FIELDS`), packed into 8 uint32 words a value: inside the values
program of a call (`--jax-values compiled`, probe.py), or, for a call's own inputs and
outputs and eager values, by one small jitted program per dtype and shape run as the value
is recorded. Only those words are copied to the host, asynchronously, and the writer's
reserved rows are filled when they are read (`drain`: at a flush, or when many are
pending). At level full the values are hashed from the arrays themselves, and the small
ones joined into one buffer for the host (`fetch_parts`): inside a values program, from
its values past an optimization barrier (probe), else by one program over the arrays
(`DeviceDigests.fetch`).

The same code runs on XLA:CPU (`record --hash words64`; tests/test_jax_digest.py), where
it is slower than hashing on the host (xxh3), so the CPU default stays xxh3_64.
"""

import contextlib
import math

import numpy as np

from ...trace import values

WORDS = 8                   # uint32 words a value: 2 hash lanes, 4 float32 stats, 2 counts
MAX_PENDING = 4096          # results not yet read

# At level full, values of at most JOIN_VALUE bytes come back from the device as one buffer
# of their words (`joined`), up to JOIN_CALL bytes at a time: a copy to the host costs
# ~0.5 ms on a TPU v5e whatever its size, and a jitted step of a small model has ~300 such
# values (docs/accelerators.md). Larger values come back one copy each.
JOIN_VALUE = 1 << 20
JOIN_CALL = 256 << 20


def _fmix32(x):
    x = x ^ (x >> 16)
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def words(x):
    """Traced: x's exact bytes as little-endian uint32 words, zero-padded (1-D)."""
    import jax.numpy as jnp
    from jax import lax

    dt = np.dtype(x.dtype)
    if dt.kind == "c":   # real and imaginary parts interleaved, as in memory
        part = np.dtype(np.float32) if dt.itemsize == 8 else np.dtype(np.float64)
        x = jnp.stack([jnp.real(x).astype(part), jnp.imag(x).astype(part)], axis=-1)
        dt = part
    if dt.kind == "b":
        x, dt = x.astype(jnp.uint8), np.dtype(np.uint8)
    flat = x.reshape(-1)
    size = dt.itemsize
    if size == 4:
        return lax.bitcast_convert_type(flat, jnp.uint32)
    if size == 8:
        return lax.bitcast_convert_type(flat, jnp.uint32).reshape(-1)
    narrow = jnp.uint16 if size == 2 else jnp.uint8
    u = lax.bitcast_convert_type(flat, narrow).astype(jnp.uint32)
    per = 4 // size
    pad = (-u.shape[0]) % per
    if pad:
        u = jnp.concatenate([u, jnp.zeros((pad,), jnp.uint32)])
    u = u.reshape(-1, per)
    out = u[:, 0]
    for k in range(1, per):
        out = out | (u[:, k] << (8 * size * k))
    return out


def _positions(shape, a, b):
    """Traced: i*a + b (mod 2^32) for the flat index i of each element of a 1-D or 2-D
    shape; for 2-D (rows, cols) as a row term plus a column term, i = r*cols + c, so an
    element costs one add instead of a multiply and an add (measured on a TPU v5e: the
    hash of 805 MB in 1.67 ms instead of 1.81, the memory's own pace)."""
    import jax.numpy as jnp
    from jax import lax

    if len(shape) == 1:
        return lax.iota(jnp.uint32, shape[0]) * np.uint32(a) + np.uint32(b)
    rows, cols = shape
    col = lax.iota(jnp.uint32, cols) * np.uint32(a) + np.uint32(b)
    row = lax.iota(jnp.uint32, rows) * np.uint32((cols * a) & 0xFFFFFFFF)
    return row[:, None] + col[None, :]


def _terms(w):
    """Traced: the two arrays of uint32 terms whose sums are the words64 lanes of words
    `w` (1-D, or (rows, cols) in memory order)."""
    one = _fmix32(w + _positions(w.shape, values._A1, values._B1))
    two = _fmix32((w ^ np.uint32(values._C2)) * np.uint32(values._M2) +
                  _positions(w.shape, values._A2, values._B2))
    return one, two


def lanes(x):
    """Traced: the two words64 lanes of x (uint32[2]), as values.words_lanes. A value of
    4-byte numbers is hashed in place (`_in_place`; two or more axes as (rows, last
    axis)): the same words in the same order, without flattening it (a copy on a TPU's
    tiled layout) or a multiply per position."""
    import jax.numpy as jnp
    from jax import lax

    pair = _in_place(x) if x.size else None
    w = words(x) if pair is None else pair[0]
    if w.size == 0:
        return jnp.zeros((2,), jnp.uint32)
    one, two = _terms(w)
    if one_pass():   # measured on a TPU v5e: 1.77 ms over 805 MB; one variadic: 4.55
        return jnp.stack([one.sum(dtype=jnp.uint32), two.sum(dtype=jnp.uint32)])
    add = (np.uint32(0), lax.add)   # XLA:CPU: 1.0 ms over 16 MB; two sums: 9.8
    return jnp.stack(_reduce([(one, add), (two, add)]))


def _numbers(x):
    """Traced: x's numbers as float32 (complex: its real and imaginary parts, on a last
    axis of 2)."""
    import jax.numpy as jnp

    if np.dtype(x.dtype).kind == "c":
        return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1).astype(jnp.float32)
    return x.astype(jnp.float32)


def _in_place(x):
    """Traced: (words, numbers) of a non-empty value whose every number is one 4-byte word
    (4-byte reals and integers, complex64's parts), both of one shape: 1-D, or (rows,
    last axis) in memory order; else None (narrower elements share a word)."""
    import jax.numpy as jnp
    from jax import lax

    dt = np.dtype(x.dtype)
    if dt.kind == "c" and dt.itemsize == 8:
        x = _numbers(x)            # the float32 parts, interleaved as in memory
    elif not (dt.itemsize == 4 and dt.kind in "fiu"):
        return None
    x = x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(-1)
    return lax.bitcast_convert_type(x, jnp.uint32), x.astype(jnp.float32)


def _reduce(pairs, together=True):
    """Traced: reductions over all axes of same-shaped operands, `pairs` = [(operand,
    (identity, combine))]. `together`: one variadic reduction, which reads the value once
    for all of them, in two stages where it has two or more axes (over all but the last
    axis, then over that one), so that no float sum runs in a chain longer than the
    number of rows or columns even where the reduction is sequential (XLA:CPU's: an L2
    norm 1.4% off over 16 M numbers in one stage, where locate's bounds allow ~eps *
    sqrt n: diff/compare/levels.py; a 1-D value is reduced in one stage). Otherwise
    each float reduction alone: XLA:CPU vectorises a lone float sum, min or max, not one
    inside a variadic reduction (the hash and unmasked statistics of 16 MB there: 1.2 ms
    apart, 7.0 in one stage)."""
    from jax import lax

    def variadic(ops, dims):
        return lax.reduce(tuple(ops), tuple(p[1][0] for p in rest),
                          lambda a, b: tuple(p[1][1](x, y) for p, x, y in zip(rest, a, b)),
                          dims)

    ndim = pairs[0][0].ndim
    alone = [not together and p[0].dtype == np.float32 for p in pairs]
    rest = [p for p, a in zip(pairs, alone) if not a]
    got = ()
    if rest and together and ndim >= 2 and any(p[0].dtype == np.float32 for p in rest):
        got = variadic(variadic([p[0] for p in rest], tuple(range(ndim - 1))), (0,))
    elif rest:
        got = variadic([p[0] for p in rest], tuple(range(ndim)))
    got = iter(got)
    return tuple(lax.reduce(p[0], p[1][0], p[1][1], tuple(range(ndim))) if a else next(got)
                 for p, a in zip(pairs, alone))


def one_pass():
    """Are a value's hash and statistics reduced together (`_reduce`)? On an accelerator,
    not on XLA:CPU."""
    import jax

    return jax.default_backend() != "cpu"


def _digest(x, masked, together):
    """Traced: (x's 8 words: the two words64 lanes, its statistics as 4 float32 bit
    patterns (`values.STAT_FIELDS`: min, max, mean, L2) and NaN and Inf counts, is every
    number finite?) of a non-empty value; `together`: in one pass over its memory where
    its numbers are its words (`_in_place`; measured on a TPU v5e over 805 MB in one
    stage: 1.93 ms, against 2.85 in separate reductions; in `_reduce`'s two stages not
    yet measured there). Unmasked, the statistics are sum, sum of squares, min and max
    alone, exact only where every number is finite, which a finite sum proves (an
    infinity or NaN stays one through any order of additions); masked, the definitions
    of values.segment_stats (min and max without NaNs, mean and L2 over the finite
    numbers, NaN and Inf counts; 2.17 ms over those 805 MB)."""
    import jax.numpy as jnp
    from jax import lax

    u32, f32 = jnp.uint32, jnp.float32
    add = (np.uint32(0), lax.add)
    fadd = (np.float32(0), lax.add)
    low = (np.float32(np.inf), lax.min)
    high = (np.float32(-np.inf), lax.max)
    pair = _in_place(x)
    if pair is None:   # narrow elements: the hash over words, the statistics over numbers
        hashed, v = [], _numbers(x)
        hash_lanes = lanes(x)
    else:
        w, v = pair
        hashed = list(zip(_terms(w), (add, add)))
    if masked:
        nan, fin = jnp.isnan(v), jnp.isfinite(v)
        vf = jnp.where(fin, v, 0)
        stats = [(vf, fadd), (vf * vf, fadd), (jnp.where(nan, jnp.inf, v), low),
                 (jnp.where(nan, -jnp.inf, v), high), (nan.astype(u32), add),
                 (fin.astype(u32), add)]
    else:
        stats = [(v, fadd), (v * v, fadd), (v, low), (v, high)]
    got = _reduce(hashed + stats, together)
    if hashed:
        hash_lanes, got = jnp.stack(got[:2]), got[2:]
    n = v.size
    if masked:
        total, squares, mn, mx, n_nan, n_fin = got
        all_nan = n_nan == n
        mn, mx = jnp.where(all_nan, jnp.nan, mn), jnp.where(all_nan, jnp.nan, mx)
        mean = jnp.where(n_fin > 0, total / jnp.maximum(n_fin, 1).astype(f32), jnp.nan)
        counts = jnp.stack([n_nan, np.uint32(n) - n_fin - n_nan])
    else:
        total, squares, mn, mx = got
        mean, counts = total / np.float32(n), jnp.zeros((2,), u32)
    floats = lax.bitcast_convert_type(jnp.stack([mn, mx, mean, jnp.sqrt(squares)]), u32)
    return jnp.concatenate([hash_lanes, floats, counts]), jnp.isfinite(total)


def packed(xs, with_stats, inside=False, together=None):
    """Traced: one uint32 vector, WORDS (or 2) words per value of xs (`_digest`;
    `together`: `one_pass()` where not given). A batch's statistics are the unmasked ones
    when every number of it is finite, else, by one `lax.cond`, the masked ones.
    `inside`: xs are intermediates of the program being traced (a values program),
    summarised by the masked pass alone: a conditional over them would take them all as
    operands, written out to memory, where XLA otherwise fuses their reductions into the
    equations that make them."""
    import jax.numpy as jnp
    from jax import lax

    xs = list(xs)
    if not xs:
        return jnp.zeros((0,), jnp.uint32)
    if not with_stats:
        return jnp.stack([lanes(x) for x in xs]).reshape(-1)
    together = one_pass() if together is None else together
    full = [x for x in xs if x.size]
    if not full:
        rows = []
    elif inside:
        rows = [_digest(x, True, together)[0] for x in full]
    else:
        quick = [_digest(x, False, together) for x in full]
        finite = jnp.stack([ok for _, ok in quick]).all()
        rows = lax.cond(finite, lambda xs: jnp.stack([r for r, _ in quick]),
                        lambda xs: jnp.stack([_digest(x, True, together)[0] for x in xs]),
                        full)
    empty = jnp.array([0, 0] + [0x7FC00000] * 4 + [0, 0], jnp.uint32)  # hash of no bytes: 0
    out, k = [], 0                                                    # lanes; NaN statistics
    for x in xs:
        if x.size:
            out.append(rows[k])
            k += 1
        else:
            out.append(empty)
    return jnp.stack(out).reshape(-1)


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


def fetch_parts(xs, small):
    """Traced: (the words64 lanes of xs, the words of those marked in `small` end to end
    or None), for `DeviceDigests.fetched`."""
    return packed(xs, False), join([x for x, j in zip(xs, small) if j])


def join(xs):
    """Traced: the words of xs end to end (one uint32 vector), or None for no value."""
    import jax.numpy as jnp

    parts = [words(x) for x in xs]
    return jnp.concatenate(parts) if parts else None


def joined_starts(avals, small):
    """The byte offset of each joined value in its buffer (`join`: each starts on a word),
    None for the others."""
    out, at = [], 0
    for (shape, dtype), j in zip(avals, small):
        out.append(at if j else None)
        if j:
            at += (math.prod(shape) * np.dtype(dtype).itemsize + 3) // 4 * 4
    return out


def view_at(data, start, dtype, shape):
    """A joined value's bytes on the host (`data`: the joined buffer as uint8, `start`:
    from `joined_starts`) as an array of its dtype and shape, without a copy."""
    dtype = np.dtype(dtype)
    return data[start:start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


def unpack_all(host, with_stats):
    """(hashes-to-be lanes as two uint64 arrays, stats rows or None) of a packed result:
    `unpack` for every value at once (numpy, no Python loop)."""
    width = WORDS if with_stats else 2
    rows = np.asarray(host, np.uint32).reshape(-1, width)
    st = None
    if with_stats:
        st = rows[:, 2:6].copy().view(np.float32).astype(np.float64)
    return rows[:, 0].astype(np.uint64), rows[:, 1].astype(np.uint64), st, \
        (rows[:, 6:8].astype(np.int64) if with_stats else None)


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
    (a batch run one program a value)."""

    __slots__ = ("out", "rows", "extra", "host")

    def __init__(self, out=None, rows=None):
        self.out, self.rows, self.extra, self.host = out, [] if rows is None else rows, [], None


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

    __slots__ = ("_array", "_host", "nbytes")

    def __init__(self, flat, copy=True):
        """copy: start the copy now (False: bytes that will most likely never be read)."""
        if copy:
            try:
                flat.copy_to_host_async()
            except Exception:
                pass
        self._array, self._host, self.nbytes = flat, None, flat.nbytes

    def __call__(self):
        """The bytes, as a flat uint8 array (read now if not yet)."""
        if self._host is None:
            self._host = np.asarray(self._array).reshape(-1).view(np.uint8)
            self._array = None
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


class DeviceDigests:
    """The values of one recording hashed on their device (callers hold the
    session's lock and run with tracediff's own JAX work unrecorded)."""

    def __init__(self, writer, quiet):
        self.writer = writer
        self.quiet = quiet            # context manager: tracediff's JAX work, not recorded
        self.with_stats = writer.level != "full"
        self.pending = []             # Results dispatched, not yet read
        self.values = self.batches = 0
        self._batch = None            # values of a call's outputs, run as one program
        self._batch_result = None     # ... and the Result they will fill
        self._programs = {}
        self.checks = []              # `same_later` / `compare_later` answers to read
        self._ids = {}                # (dtype, shape, logical) -> (row string ids, nbytes)
        writer.flush_hooks.append(self.drain)

    def add(self, eid, slot, x, role, name, logical=None):
        """Reserve the row of a value (stats/calls levels: no bytes will cross) and run its
        program now (`can_digest`); its 8 words are copied to the host asynchronously.
        One program per dtype and shape, not per batch: a batch's signature changes with
        what a call stores (its first call stores its arguments, later ones not), and each
        new one was a compile inside the script's timed loop. Returns the value's `Ref`."""
        handle, nbytes = self.reserve(eid, slot, x, role, name, logical)
        if self._batch is not None:
            res = self._batch_result
            self._batch.append(x)
            res.rows.append((handle, nbytes))
            return Ref(res, len(res.rows) - 1, x.dtype, tuple(x.shape), nbytes)
        with self.quiet():
            out = self._program(self.with_stats)(x)
        res = self.adopt(out, [(handle, nbytes)])
        if len(self.pending) > MAX_PENDING:
            self.drain()
        return Ref(res, 0, x.dtype, tuple(x.shape), nbytes)

    def add_rows(self, xs, first, nbytes):
        """`add` for values whose rows are reserved already, one after another from handle
        `first` (a call's outputs: `TraceWriter.reserve_rows`), run as one program."""
        self._run_batch(list(xs), Result(None, [(first + i, n) for i, n in enumerate(nbytes)]))

    def add_ref(self, eid, slot, ref, role, name=None):
        """A row for a value already digested (`Ref`): filled from its result, now if it
        was read already, else at the drain that reads it. No program runs."""
        handle, nbytes = self.reserve(eid, slot, ref, role, name)
        res = ref.result
        if res.host is not None:
            self._fill(handle, nbytes, res.host, ref.index)
        else:
            res.extra.append((handle, nbytes, ref.index))
        self.values += 1

    @contextlib.contextmanager
    def outputs(self):
        """The values added inside run as one program (a call's outputs, an optimizer
        step's values: the same dtypes and shapes at every step, one compile; one dispatch
        instead of one a value, measured ~0.25 ms each on a TPU v5e)."""
        if self._batch is not None:   # inside another batch (a call's optimizer step): one
            yield
            return
        self._batch, self._batch_result = [], Result()
        with self.writer.held():    # the batch's rows stay reserved until it has run
            try:
                yield
            finally:
                batch, res = self._batch, self._batch_result
                self._batch = self._batch_result = None
                if batch:
                    self._run_batch(batch, res)

    def _run_batch(self, batch, res):
        """One program for a batch of values filling `res`; one program a value where the
        batch cannot be one (values committed to different devices)."""
        ws = self.with_stats
        fn = self._programs.get(("batch", ws))
        if fn is None:
            import jax

            fn = self._programs[("batch", ws)] = jax.jit(lambda xs: packed(xs, ws))
        try:
            with self.quiet():
                out = fn(batch)
        except Exception:
            out = self._one_by_one(batch)
        res.out = out
        self._adopt(res)

    def _one_by_one(self, batch):
        outs = []
        for x in batch:
            with self.quiet():
                outs.append(self._program(self.with_stats)(x))
        return outs

    def _program(self, with_stats):
        fn = self._programs.get(with_stats)
        if fn is None:
            import jax

            fn = self._programs[with_stats] = jax.jit(lambda x: packed([x], with_stats))
        return fn

    def fetch(self, xs, copy=True):
        """Level full: [(words64 hash, bytes on the host or None)] of arrays on their
        device, by one program for all of them (a call's outputs, an optimizer step's
        values: one dispatch and one read, not one a value) that also joins the small
        ones' words into one buffer (`fetch_parts`): one copy to the host for those, read
        as `HostView`s when first asked; the others' copies are started here and left to
        the caller (None). The hashes are of the arrays given, not of a recomputation.
        copy=False: no copy starts (the caller expects to need the hashes only)."""
        avals = [(x.shape, x.dtype) for x in xs]
        small = tuple(joined(avals))
        fn = self._programs.get(("fetch", small))
        if fn is None:
            import jax

            fn = self._programs[("fetch", small)] = jax.jit(
                lambda xs: fetch_parts(xs, small))
        with self.quiet():
            lanes, flat = fn(list(xs))
        hashes, data = self.fetched([x.nbytes for x in xs], lanes, flat,
                                    [x for x, j in zip(xs, small) if not j and copy], copy)
        return [(h, None if at is None else HostView(data, at, dtype, shape))
                for h, at, (shape, dtype) in zip(hashes, joined_starts(avals, small), avals)]

    def fetched(self, nbytes, lanes, flat, rest, copy=True):
        """(words64 hashes, the joined buffer as a `Joined`, or None) from `fetch_parts`'
        results (lanes, joined words) of values of these byte counts, computed in some
        program (`fetch`'s, or a values program's), `rest` the values not joined, whose
        copies start here. Waits for the hashes only: the joined bytes are read when first
        needed (`HostView`, `Joined`)."""
        for x in rest:
            try:
                x.copy_to_host_async()
            except Exception:
                pass
        with self.quiet():
            joined = Joined(flat, copy) if flat is not None else None
            lanes = np.asarray(lanes)
        self.values += len(nbytes)
        self.batches += 1
        a, b, _, _ = unpack_all(lanes, False)
        return finish_all(a, b, nbytes).tolist(), joined

    def adopt(self, out, rows):
        """A packed result computed elsewhere (the values program of a call) for rows
        reserved by `reserve`: read and filled at the next drain. Returns its `Result`."""
        res = Result(out, rows)
        self._adopt(res)
        return res

    def adopt_result(self, res):
        """`adopt` for a `Result` made before its rows were reserved (`Ref`s to it were
        handed out while they were)."""
        self._adopt(res)

    def _adopt(self, res):
        for out in (res.out if isinstance(res.out, list) else (res.out,)):
            try:
                out.copy_to_host_async()
            except Exception:
                pass
        self.pending.append(res)
        self.values += len(res.rows)
        self.batches += 1

    def ids_of(self, x, logical=None):
        """(row string ids, nbytes) of a value's reserved row (x: an array, an aval or a
        `Ref`), made once per dtype and shape."""
        key = (x.dtype, x.shape, logical)
        hit = self._ids.get(key)
        if hit is None:
            storage, dname = storage_of(x.dtype)
            hit = self._ids[key] = (
                self.writer.value_ids(logical or dname, storage, tuple(x.shape)),
                math.prod(x.shape) * np.dtype(x.dtype).itemsize)
        return hit

    def reserve(self, eid, slot, x, role, name=None, logical=None):
        """Reserve a value's row (x: an array, an aval or a `Ref`); (handle, nbytes) for
        `adopt`. The row's string ids and byte count are made once per dtype and shape."""
        key = (x.dtype, x.shape, logical)
        hit = self._ids.get(key)
        if hit is None:
            storage, dname = storage_of(x.dtype)
            hit = self._ids[key] = (
                self.writer.value_ids(logical or dname, storage, tuple(x.shape)),
                math.prod(x.shape) * np.dtype(x.dtype).itemsize)
        w = self.writer
        return w.reserve_ids(eid, slot, role, hit[0], w.intern(name)), hit[1]

    def same_later(self, xs, ys, done):
        """Do two lists of arrays hold the same bytes? Compared on the device where both
        can be (one boolean crosses), else on the host; `done(bool)` is called at the next
        drain (or now, when the host decides alone). The device's boolean is copied to the
        host asynchronously: reading it inside the call (one per jit call, the values
        program checked against the script's program) made the host wait for the device
        at every step (measured on XLA:CPU: ~2-3 ms a step of jax_mlp.py, the two
        programs' own time)."""
        dev = [(x, y) for x, y in zip(xs, ys) if can_digest(x) and can_digest(y) and
               x.dtype == y.dtype and x.shape == y.shape]
        rest = [(x, y) for x, y in zip(xs, ys) if not any(x is a for a, _ in dev)]
        for x, y in rest:
            try:
                a, b = np.asarray(x), np.asarray(y)
            except Exception:   # keys, tokens: not compared
                continue
            if a.dtype != b.dtype or a.shape != b.shape or not values.same_bytes(a, b):
                done(False)
                return
        if not dev:
            done(True)
            return
        fn = self._programs.get("same")
        if fn is None:
            import jax
            import jax.numpy as jnp

            fn = self._programs["same"] = jax.jit(lambda a, b: jnp.stack(
                [jnp.array_equal(words(p), words(q)) for p, q in zip(a, b)]).all())
        with self.quiet():
            out = fn([x for x, _ in dev], [y for _, y in dev])
        try:
            out.copy_to_host_async()
        except Exception:
            pass
        self.checks.append((out, done))
        if len(self.checks) > MAX_PENDING:
            self.drain()

    def compare_later(self, xs, ys, done):
        """`same_later` for two lists of `Ref`s: equal dtypes, shapes and words64 hashes
        (equal hashes stand for equal bytes, docs/format.md), read at the next drain. No
        program runs: both sides were digested already (a call's outputs and its values
        program's final outputs)."""
        self.checks.append(((xs, ys), done))

    def settle_checks(self, drained=False):
        """Answer the pending checks, in the order they were asked (a drain first, when
        one compares results not read yet; a result never dispatched compares unequal)."""
        if not drained and any(type(c[0]) is tuple and any(
                r.result.host is None for r in c[0][0] + c[0][1]) for c in self.checks):
            self.drain()   # settles
            return
        checks, self.checks = self.checks, []
        for what, done in checks:
            if type(what) is tuple:
                done(all(x.result.host is not None and y.result.host is not None and
                         x.dtype == y.dtype and x.shape == y.shape and
                         self._hash(x) == self._hash(y) for x, y in zip(*what)))
                continue
            with self.quiet():
                answer = bool(np.asarray(what))
            done(answer)

    @staticmethod
    def _hash(ref):
        a, b = ref.result.host[:2]
        return values.words_finish(a[ref.index], b[ref.index], ref.nbytes)

    def dispatch(self):
        """Values are hashed as they are added (kept for callers that mark a call's end)."""

    def _fill(self, handle, nbytes, host, i):
        a, b, floats, counts = host
        h = values.words_finish(a[i], b[i], nbytes)
        self.writer.fill_digest(handle, nbytes, h, None if floats is None else
                                (*floats[i].tolist(), *counts[i].tolist()))

    def drain(self):
        """Read every dispatched result and fill the writer's reserved rows."""
        w = self.writer
        if self._batch:   # a flush inside a batch: the rows reserved so far are filled now,
            # by the programs of one value (already compiled, unlike a partial batch's);
            # the values added later go on in a new Result
            res = self._batch_result
            res.out = self._one_by_one(self._batch)
            self._adopt(res)
            self._batch, self._batch_result = [], Result()
        pending, self.pending = self.pending, []
        for res in pending:
            with self.quiet():
                out = res.out
                host = np.concatenate([np.asarray(o) for o in out]) if isinstance(out, list) \
                    else np.asarray(out)
            a, b, st, counts = unpack_all(host, self.with_stats)
            res.out = None
            res.host = (a, b, st, counts)
            rows = res.rows
            n = len(rows)
            hashes = finish_all(a[:n], b[:n], [nb for _, nb in rows]).tolist()
            if st is None:
                w.fill_digests(rows, hashes)
            else:
                w.fill_digests(rows, hashes, st[:n].tolist(), counts[:n].tolist())
            if res.extra:   # rows of other events taking this result's words (`add_ref`)
                idx = np.fromiter((i for _, _, i in res.extra), np.int64, len(res.extra))
                more = [(handle, nbytes) for handle, nbytes, _ in res.extra]
                hashes = finish_all(a[idx], b[idx], [nb for _, nb in more]).tolist()
                if st is None:
                    w.fill_digests(more, hashes)
                else:
                    w.fill_digests(more, hashes, st[idx].tolist(), counts[idx].tolist())
            res.rows, res.extra = (), ()
        if self.checks:
            self.settle_checks(drained=True)
