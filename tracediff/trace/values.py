"""Exact value encoding: any array becomes (bytes, logical dtype, storage dtype, shape).

Dtypes numpy/h5py cannot hold natively (bfloat16, float8, PRNG keys) are stored as
their raw bits in an unsigned integer of the same width plus a tag naming the logical
dtype, so nothing is lost and nothing needs pickle to read back.
"""

import re

import numpy as np
import xxhash

from . import norms
from .schema import VFLAG_NOT_STORED, VFLAG_STATS, VFLAG_UNINIT

# Name of the value hash, written to every trace's manifest (recording.hash). One hash
# function only: a fallback would make traces from two installs incomparable hash to hash.
HASH_NAME = "xxh3_64"

# Logical dtypes that are stored as raw bits and need ml_dtypes to decode.
_ML_DTYPES = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
              "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu",
              "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "int4", "uint4", "int2", "uint2"}
_NATIVE = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"}
_UINT_OF_SIZE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def shape_str(shape):
    return ",".join(str(int(d)) for d in shape)


def parse_shape(text, limit=64):
    """Shape from its stored string; refuses absurd ranks or negative dims."""
    if not text:
        return ()
    parts = text.split(",")
    if len(parts) > limit:
        raise ValueError(f"shape has {len(parts)} dimensions")
    dims = tuple(int(p) for p in parts)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {text!r}")
    return dims


_DTYPE_NAMES = {}


def _dtype_name(dt):
    """numpy dtype name, cached: `dtype.name` costs microseconds and this runs per value."""
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = dt.name
    return name


def encode(array, logical_dtype=None):
    """Return (bytes, logical dtype name, storage dtype name, shape) for a numpy array."""
    c, name, storage, shape = prepare(array, logical_dtype)
    return c.tobytes(), name, storage, shape


def prepare(array, logical_dtype=None):
    """Like `encode` without copying: (C-contiguous array in its storage dtype, logical
    dtype name, storage dtype name, shape). The writer hashes and appends its buffer."""
    a = array if type(array) is np.ndarray else np.asarray(array)
    dname, storage = storage_names(a.dtype)
    name = logical_dtype or dname
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    if storage == dname:
        return a, name, dname, a.shape
    return a.view(storage), name, storage, a.shape


def storage_names(dtype):
    """(dtype name, storage dtype name) of a numpy dtype, as `prepare` names them."""
    name = _dtype_name(dtype)
    if name in _NATIVE:
        return name, name
    storage = _UINT_OF_SIZE.get(dtype.itemsize)
    if storage is None or dtype.kind == "O":
        raise TypeError(f"cannot store dtype {dtype}")
    return name, storage


def as_bytes(c):
    """The bytes of a C-contiguous array as a buffer (no copy)."""
    if c.size == 0:
        return b""
    try:
        return c.data.cast("B")
    except (TypeError, ValueError):
        return c.tobytes()


digest = xxhash.xxh3_64_intdigest  # 64-bit hash of exact bytes (any buffer)


# -- words64: a hash of exact bytes that XLA computes on the device (issue 37) ------------
# The bytes, zero-padded to whole little-endian uint32 words w_0..w_{n-1}, give two 32-bit
# lanes, each a sum mod 2^32 of a bijective mix of (word, position):
#     lane1 = sum_i fmix32(w_i + i*A1 + B1)
#     lane2 = sum_i fmix32((w_i ^ C2) * M2 + i*A2 + B2)
# and the hash is fmix64(lane1 << 32 | lane2, xor the byte count times a constant), never 0.
# Sums are associative, so XLA reduces them in any order on any backend and gets the same
# bits (capture/jax/digest_programs.py); numpy computes the same here for values already on the host.
# Each term is a bijection of its word for a fixed position, so two values that differ in
# exactly one word (one float32 element, one ULP) always hash differently; other accidental
# differences collide with probability about 2^-64 (docs/format.md). It is not keyed against
# an adversary, like xxh3.
WORDS_HASH_NAME = "words64"
_A1, _B1, _A2, _B2, _C2, _M2 = 0x9E3779B1, 0x7F4A7C15, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, \
    0x165667B1
_M64 = (1 << 64) - 1


def _fmix32_into(x, tmp):
    """murmur3's fmix32 of x in place, through a scratch array of x's size."""
    np.right_shift(x, np.uint32(16), out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    np.multiply(x, np.uint32(0x85EBCA6B), out=x)
    np.right_shift(x, np.uint32(13), out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    np.multiply(x, np.uint32(0xC2B2AE35), out=x)
    np.right_shift(x, np.uint32(16), out=tmp)
    np.bitwise_xor(x, tmp, out=x)


_CHUNK = 1 << 16        # words a pass: three scratch arrays of 256 KB stay in the cache
_POSITIONS = {}         # (A, B) -> i*A + B for i < _CHUNK (the position term of a chunk)


def _positions(a, b):
    hit = _POSITIONS.get((a, b))
    if hit is None:
        with np.errstate(over="ignore"):
            hit = _POSITIONS[(a, b)] = np.arange(_CHUNK, dtype=np.uint32) * np.uint32(a) + \
                np.uint32(b)
    return hit


def words_lanes(buf):
    """(lane1, lane2) of a buffer's bytes (numpy, on the host).

    In chunks of 64K words with in-place operations: ~1.7 GB/s on one core here, where
    whole-buffer temporaries (each of ~20 passes going to memory) ran at ~0.6 GB/s."""
    raw = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else \
        buf.reshape(-1).view(np.uint8)
    pad = (-raw.size) % 4
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
    w = raw.view("<u4")
    p1, p2 = _positions(_A1, _B1), _positions(_A2, _B2)
    one, two, tmp = (np.empty(min(_CHUNK, w.size), np.uint32) for _ in range(3))
    lane1 = lane2 = 0
    with np.errstate(over="ignore"):
        for start in range(0, w.size, _CHUNK):
            part = w[start:start + _CHUNK]
            n = part.size
            a, b, t = one[:n], two[:n], tmp[:n]
            # lane1 terms: fmix32(w_i + i*A1 + B1), i = start + k
            np.add(p1[:n], np.uint32((start * _A1) & 0xFFFFFFFF), out=a)
            np.add(a, part, out=a)
            _fmix32_into(a, t)
            # lane2 terms: fmix32((w_i ^ C2) * M2 + i*A2 + B2)
            np.bitwise_xor(part, np.uint32(_C2), out=b)
            np.multiply(b, np.uint32(_M2), out=b)
            np.add(b, p2[:n], out=b)
            np.add(b, np.uint32((start * _A2) & 0xFFFFFFFF), out=b)
            _fmix32_into(b, t)
            lane1 += int(a.sum(dtype=np.uint32))
            lane2 += int(b.sum(dtype=np.uint32))
    return lane1 & 0xFFFFFFFF, lane2 & 0xFFFFFFFF


def words_finish(lane1, lane2, nbytes):
    """The 64-bit words64 hash from its two lanes and the value's byte count."""
    h = ((int(lane1) << 32) | int(lane2)) ^ ((int(nbytes) * 0x9E3779B97F4A7C15) & _M64)
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _M64
    h ^= h >> 33
    return h or 1


_SMALL_WORDS = {}       # bytes -> words64 of values of at most 64 bytes (see words_digest)


def words_digest(buf):
    """words64 of a buffer's exact bytes (the host path of the device hash).

    Values of at most 64 bytes are memoised by their bytes: a jitted step's literals and
    scalars (a learning rate, a step count) are hashed at every step, and numpy's dozen
    small operations cost ~140 us a value where the lookup costs ~1 us."""
    n = buf.nbytes if hasattr(buf, "nbytes") else len(buf)
    if n > 64:
        return words_finish(*words_lanes(buf), n)
    key = buf.tobytes() if isinstance(buf, np.ndarray) else bytes(buf)
    h = _SMALL_WORDS.get(key)
    if h is None:
        if len(_SMALL_WORDS) >= 1 << 16:
            _SMALL_WORDS.clear()
        h = _SMALL_WORDS[key] = words_finish(*words_lanes(buf), n)
    return h


DIGESTS = {HASH_NAME: digest, WORDS_HASH_NAME: words_digest}


def same_bytes(a, b):
    """Do two host arrays of one shape and dtype hold the same bytes? Compared as unsigned
    words of their item size, without two `tobytes()` copies (a JAX train step's call
    outputs are its parameters and optimizer state: megabytes, compared every call)."""
    size = a.dtype.itemsize
    if size in (1, 2, 4, 8) and a.flags.c_contiguous and b.flags.c_contiguous:
        word = np.dtype(f"u{size}")
        return bool(np.array_equal(a.reshape(-1).view(word), b.reshape(-1).view(word)))
    return a.tobytes() == b.tobytes()


# -- statistics (--level stats) -------------------------------------------------------------
# Per value: min and max over the non-NaN elements, mean and L2 norm over the finite ones,
# NaN and Inf counts. Complex values count their real and imaginary parts as elements;
# integers and bools are taken as numbers; PRNG keys and unknown dtypes get counts only.
STAT_FIELDS = ("min", "max", "mean", "l2", "nan", "inf")


def _as_numbers(arr, logical):
    """Float view (float32/float64) of a value's numbers, or None when it has none."""
    if logical in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            return None
        try:
            return arr.view(getattr(ml_dtypes, logical)).astype(np.float32)
        except (AttributeError, TypeError, ValueError):
            return None
    kind = arr.dtype.kind
    if kind == "c":
        return arr.view(arr.real.dtype)
    if kind == "f":
        return arr
    if kind in "iub" and not logical.startswith("key<"):
        return arr.astype(np.float64)
    return None


_WHOLE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _one_float_stats(x):
    """`segment_stats` of one whole 1-D float32/float64 value, without the batch path's
    set-up (~100 µs less a value, which is most of the cost for the ~300 large values a
    JAX MLP step stores); None where a number is NaN or Inf (the masked definitions of
    the batch path apply). min and max first: max|x| says whether the sums may run in
    the value's dtype (`norms.plain`) or scaled (issue 66: a float32 dot of squares below
    ~1e-19 is 0)."""
    with np.errstate(invalid="ignore", over="ignore"):
        mn, mx = np.minimum.reduce(x), np.maximum.reduce(x)
        if not (np.isfinite(mn) and np.isfinite(mx)):
            return None
        amax = max(-float(mn), float(mx))
        if norms.plain_one(x.dtype, x.size, amax):
            mean = np.float64(_whole_sum(x)) / x.size
            l2 = np.sqrt(np.float64(np.dot(x, x)))
        else:
            mean, l2 = norms.mean_l2(x, amax)
    return np.array([[mn, mx, mean, l2, 0.0, 0.0]])


def _whole_sum(x):
    """Sum of one large 1-D float32/float64 value in its own dtype. `einsum` adds in SIMD
    lanes (~66 GB/s here) where `np.add.reduce`'s pairwise sum is scalar (~26 GB/s): the
    sum was the dearest of a value's four passes, ~6 % of a JAX MLP step recorded at
    stats on the CPU (issue 55). Its rounding is a lane-blocked float32 sum, as the L2's
    BLAS dot is, whatever the buffer's alignment; measured on 2^16-2^22 elements, its
    error stays under 2 % of the allowance locate gives a mean (diff/compare/levels.py)."""
    return np.einsum("i->", x)


# A value of at least this many bytes has its statistics reduced alone, in its own dtype
# (pairwise sums, one dot: `_one_float_stats`); a smaller one always in float64 through
# reduceat, whether it is reduced alone or in a batch with others: which batch a small
# value lands in follows the writer's flush clock, and its statistics must not (two
# recordings of one run hold the same rows).
WHOLE_VALUE_BYTES = 1 << 16


def segment_stats(flat, starts, counts, logical):
    """Statistics of many values stored back to back in one 1-D array (one storage dtype).

    `starts`/`counts` give each value's first element and element count. Returns a float64
    array of shape (n, 6) in `STAT_FIELDS` order (NaN where undefined: empty values, keys).
    Vectorised: one pass of numpy reductions for the whole batch."""
    whole = len(counts) == 1 and flat.ndim == 1 and flat.dtype in _WHOLE_FLOATS and \
        starts[0] == 0 and counts[0] == flat.size > 0 and flat.nbytes >= WHOLE_VALUE_BYTES
    if whole:
        one = _one_float_stats(flat)
        if one is not None:
            return one
    n = len(starts)
    out = np.full((n, 6), np.nan)
    out[:, 4:] = 0
    nums = _as_numbers(flat, logical)
    if nums is None or not n:
        return out
    per = nums.size // max(flat.size, 1) if flat.size else 1  # complex: 2 numbers per element
    starts = np.asarray(starts, np.int64) * per
    counts = np.asarray(counts, np.int64) * per
    nz = counts > 0
    if not nz.any():
        return out
    s, c = starts[nz], counts[nz]
    res = np.empty((len(s), 6))
    # a single large value: plain reductions (faster, pairwise); small ones: reduceat
    one = len(s) == 1 and s[0] == 0 and flat.nbytes >= WHOLE_VALUE_BYTES

    def red(ufunc, x, **kw):
        return ufunc.reduce(x, **kw) if one else ufunc.reduceat(x, s, **kw)

    tot = None
    if one and nums.ndim == 1 and nums.dtype in _WHOLE_FLOATS:
        # one large value of float32 or float64 numbers (bfloat16 and complex64 as
        # float32, integers as float64): its own arithmetic (`_one_float_stats`: a float32
        # value accumulates in float32, in SIMD lanes, which locate allows for when it
        # bounds differences by mean and L2, diff/compare/levels.py); None: a NaN or Inf
        got = None if whole else _one_float_stats(nums)
        if got is not None:
            out[nz] = got
            return out
    else:
        # batches of small values go through reduceat, which sums sequentially, so they
        # accumulate in float64 (a large float16 value too)
        with np.errstate(invalid="ignore", over="ignore"):
            tot = np.asarray(red(np.add, nums, dtype=np.float64), dtype=np.float64)
    if tot is not None and np.isfinite(tot).all():
        # common case, fewer passes: no NaN/Inf anywhere (a float64 sum of float32/16
        # values cannot overflow), min/max in the value's own dtype
        res[:, 0] = red(np.minimum, nums)
        res[:, 1] = red(np.maximum, nums)
        res[:, 2] = tot / c
        # a batch of small values squares in float64, as the non-finite path below does: a
        # value's statistics then do not depend on whether a NaN or Inf shares its batch
        # (batches follow the writer's flush clock, so two recordings of one run would
        # differ in the last bits of an L2); a large float16 value squares in float32
        sq_dt = np.float32 if one else np.float64
        with np.errstate(over="ignore"):
            res[:, 3] = np.sqrt(np.asarray(red(np.add, np.square(nums, dtype=sq_dt),
                                               dtype=np.float64), dtype=np.float64))
        if nums.dtype == np.float64:   # float64 squares (and sums) may leave float64
            norms.scale_where_needed(res, nums, s, c, c, np.maximum(-res[:, 0], res[:, 1]))
        res[:, 4:] = 0
        out[nz] = res
        return out
    x = nums if nums.dtype == np.float64 else nums.astype(np.float64)
    # reduceat needs strictly usable starts: empty values were dropped above
    with np.errstate(invalid="ignore", over="ignore"):
        nan = np.isnan(x)
        fin = np.isfinite(x)
        cnt_nan = np.add.reduceat(nan, s) if nan.any() else np.zeros(len(s))
        cnt_fin = np.add.reduceat(fin, s)
        mn = np.fmin.reduceat(x, s)
        mx = np.fmax.reduceat(x, s)
        xf = np.where(fin, x, 0.0)
        tot = np.add.reduceat(xf, s)
        sq = np.add.reduceat(xf * xf, s)
    # reduceat reduces up to the next start: values lie back to back (no gaps).
    res[:, 0], res[:, 1] = mn, mx
    with np.errstate(invalid="ignore", divide="ignore"):
        res[:, 2] = np.where(cnt_fin > 0, tot / np.maximum(cnt_fin, 1), np.nan)
    res[:, 3] = np.sqrt(sq)
    if nums.dtype == np.float64:   # as the finite path: float64 numbers scaled where needed
        norms.scale_where_needed(res, xf, s, c, cnt_fin, np.maximum.reduceat(np.abs(xf), s))
    res[:, 4] = cnt_nan
    res[:, 5] = c - cnt_fin - cnt_nan
    out[nz] = res
    return out


def value_stats(arr, logical=None):
    """Statistics of one value (numpy array): a tuple in `STAT_FIELDS` order."""
    a = np.ascontiguousarray(np.asarray(arr)).reshape(-1)
    return tuple(segment_stats(a, [0], [a.size], logical or a.dtype.name)[0].tolist())


def decode(raw, logical, storage, shape):
    """Array from stored bytes. Unknown logical dtypes come back as their storage bits."""
    if storage not in _NATIVE:
        raise ValueError(f"unknown storage dtype {storage!r}")
    arr = np.frombuffer(raw, dtype=np.dtype(storage))
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if arr.size != count:
        raise ValueError(f"value holds {arr.size} elements, shape {shape} needs {count}")
    arr = arr.reshape(shape)
    if logical in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            return arr
        return arr.view(getattr(ml_dtypes, logical))
    if logical in _NATIVE and logical != storage:
        return arr.view(np.dtype(logical))
    return arr


def as_float64(array):
    """Float64 (or complex128) view of a value's numbers for comparing, None if not numeric."""
    a = np.asarray(array)
    if a.dtype.kind in "c":
        return a.astype(np.complex128)
    if a.dtype.kind in "fiub" or a.dtype.name in _ML_DTYPES:
        try:
            return a.astype(np.float64)
        except (TypeError, ValueError):
            return None
    return None


def has_bytes(row):
    """True when a values-table row has its bytes stored (not a shape-only, uninitialised
    or unstored value): only then can its numbers be read and compared."""
    return row is not None and row["offset"] >= 0 and not (
        row["flags"] & (VFLAG_UNINIT | VFLAG_NOT_STORED))


def rows_with_data(rows):
    """(stored, with data) per values-table row, vectorised: bytes stored (`has_bytes`),
    and bytes or the hash of the exact bytes (`--level stats`), never uninitialised
    memory. What a comparison can compare: equal hash is equal bytes."""
    flags = rows["flags"]
    stored = (rows["offset"] >= 0) & ((flags & (VFLAG_UNINIT | VFLAG_NOT_STORED)) == 0)
    hashed = ((flags & VFLAG_STATS) != 0) & ((flags & VFLAG_UNINIT) == 0)
    return stored, stored | hashed


def shard_index_text(index):
    """A shard's index as stored in `shards.index`: "0:4,:" (start:stop per dimension,
    ":" for a whole dimension), "" when it covers the whole value."""
    parts = []
    for sl in index or ():
        if isinstance(sl, slice):
            if sl.step not in (None, 1):
                raise ValueError("strided shard index")
            lo = "" if sl.start in (None, 0) and sl.stop is None else str(sl.start or 0)
            hi = "" if sl.stop is None else str(int(sl.stop))
            parts.append(f"{lo}:{hi}" if lo or hi else ":")
        else:
            raise ValueError("shard index parts must be slices")
    return "" if all(p == ":" for p in parts) else ",".join(parts)


MAX_INDEX_DIGITS = 18      # a start or stop of a shard index (any dimension fits in int64)
_INDEX_PART = re.compile(r"([0-9]{0,%d}):([0-9]{0,%d})" % (MAX_INDEX_DIGITS, MAX_INDEX_DIGITS))


def shard_index_parts(text, max_dims=64):
    """[(start or None, stop or None)] per dimension of a `shards.index` text ([] for "",
    the whole value); ValueError unless it is at most `max_dims` parts of `:`, `A:B` or
    `A:` with A, B of at most 18 ASCII digits. The text's length is bounded before any
    of it is parsed (a stranger's trace may hold a 4,000-digit "index")."""
    if text == "":
        return []
    if len(text) > max_dims * (2 * MAX_INDEX_DIGITS + 2):
        raise ValueError(f"shard index of {len(text):,} characters, longer than an index "
                         f"of {max_dims} dimensions can be")
    out = []
    for part in text.split(","):
        m = _INDEX_PART.fullmatch(part)
        if m is None:
            raise ValueError(f"shard index {text[:40]!r} is not start:stop per dimension "
                             f"(at most {MAX_INDEX_DIGITS} digits each)")
        out.append((int(m.group(1)) if m.group(1) else None,
                    int(m.group(2)) if m.group(2) else None))
    if len(out) > max_dims:
        raise ValueError(f"shard index {text[:40]!r} has {len(out)} dimensions")
    return out


def parse_shard_index(text, shape):
    """`shards.index` text -> tuple of slices into a value of `shape`; ValueError unless
    every part is `:`, `A:B` or `A:` with 0 <= A <= B <= dim, one per dimension."""
    parts = shard_index_parts(text, max(64, len(shape)))
    if not parts:
        return tuple(slice(None) for _ in shape)
    if len(parts) != len(shape):
        raise ValueError(f"shard index {text[:40]!r} does not fit a value of {len(shape)} dims")
    out = []
    for (lo, hi), dim in zip(parts, shape):
        a = 0 if lo is None else lo
        b = dim if hi is None else hi
        if not 0 <= a <= b <= dim:
            raise ValueError(f"shard index {text[:40]!r} lies outside a value of shape {tuple(shape)}")
        out.append(slice(a, b))
    return tuple(out)
