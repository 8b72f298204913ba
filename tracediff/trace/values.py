"""Exact value encoding: any array becomes (bytes, logical dtype, storage dtype, shape).

Dtypes numpy/h5py cannot hold natively (bfloat16, float8, PRNG keys) are stored as
their raw bits in an unsigned integer of the same width plus a tag naming the logical
dtype, so nothing is lost and nothing needs pickle to read back.
"""

import hashlib

import numpy as np

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
    a = np.asarray(array)
    dname = _dtype_name(a.dtype)
    name = logical_dtype or dname
    if dname in _NATIVE:
        storage = dname
        raw = np.ascontiguousarray(a).tobytes()
    else:
        storage = _UINT_OF_SIZE.get(a.dtype.itemsize)
        if storage is None or a.dtype.kind == "O":
            raise TypeError(f"cannot store dtype {a.dtype}")
        raw = np.ascontiguousarray(a).view(storage).tobytes()
    return raw, name, storage, a.shape


def digest(raw):
    """64-bit hash of exact bytes; equal hashes are taken as bitwise equality."""
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


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
