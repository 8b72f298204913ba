"""Opening a file that claims to be a trace: one-line errors for what is no HDF5 file or
cannot be opened (`_open`), and the only ways the reader looks at the file's objects:
small root attributes of plain types (`_attr`, `_int_attr`) and plain datasets of this
file, without links, external storage, virtual mappings or filters but the codec's
(`_dataset`).
"""

import os

import h5py
import numpy as np

from ...errors import TraceError, one_line
from .. import codec
from .limits import MAX_ATTR_BYTES, MAX_CHUNK_BYTES

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def _open(path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such file")
    if os.path.isdir(path):
        raise TraceError(f"{path}: is a directory, not a trace file")
    if not os.path.isfile(path):
        raise TraceError(f"{path}: not a regular file")
    if os.path.getsize(path) == 0:
        raise TraceError(f"{path}: empty file, not a trace (a recording killed at its very start leaves one)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return h5py.File(path, "r", locking=False)
    except Exception as exc:
        first = one_line(exc, 160, with_type=True)
    if "already open for write" in first:
        # a file left by a writer in SWMR mode (a newer writer, or another tool) that died
        try:
            return h5py.File(path, "r", locking=False, swmr=True)
        except Exception as exc:
            first = one_line(exc, 160, with_type=True)
    if head != HDF5_MAGIC:
        raise TraceError(f"{path}: not an HDF5 file (is this a tracediff trace?)")
    raise TraceError(f"{path}: HDF5 file cannot be opened, it may be truncated or corrupt "
                     f"({first})")


def _attr(f, name, default=None):
    """A root attribute, read only when it is small (a hostile file may hold huge ones)."""
    attrs = f.attrs   # (a new AttributeManager each time it is asked for)
    if name not in attrs:
        return default
    try:
        aid = attrs.get_id(name)
        size = aid.get_storage_size()
    except Exception:
        aid, size = None, MAX_ATTR_BYTES + 1
    if size > MAX_ATTR_BYTES:
        raise TraceError(f"attribute {name!r} is implausibly large ({size} bytes)")
    # Only plain numbers and strings: HDF5 crashes (segfault, measured) converting some
    # damaged types, e.g. a string type garbled into a variable-length sequence.
    try:
        tclass, space = aid.get_type().get_class(), aid.get_space()
        npoints = space.get_simple_extent_npoints()
    except Exception as exc:
        raise TraceError(f"attribute {name!r} is damaged ({one_line(exc, 160, with_type=True)})") from None
    if tclass not in (h5py.h5t.INTEGER, h5py.h5t.FLOAT, h5py.h5t.STRING, h5py.h5t.ENUM) or \
            npoints != 1:
        raise TraceError(f"attribute {name!r} is not a single number or string")
    value = attrs[name]
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise TraceError(f"attribute {name!r} is not a single value")
        value = value.reshape(()).item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value


def _int_attr(f, name, default):
    value = _attr(f, name, default)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TraceError(f"attribute {name!r} is not an integer")
    return int(value)


def _dataset(f, name, codec_ok=False):
    """A plain dataset of this file: no external links, external storage, virtual
    mappings or filters (which could read other files or load filter plugins);
    `codec_ok`: the one filter of `record --codec` is allowed (trace/codec.py)."""
    link = f.get(name, getlink=True)
    if link is None:
        raise TraceError(f"missing dataset {name!r}")
    if not isinstance(link, h5py.HardLink):
        raise TraceError(f"{name!r} is a link to elsewhere, not part of the trace")
    ds = f[name]
    if not isinstance(ds, h5py.Dataset):
        raise TraceError(f"{name!r} is not a dataset")
    plist = ds.id.get_create_plist()
    if (plist.get_nfilters() and not codec_ok) or plist.get_external_count() or ds.is_virtual:
        raise TraceError(f"dataset {name!r} uses filters, external or virtual storage")
    if codec_ok:
        codec.blob_codec(ds)   # no filter but the codec's
    if ds.chunks is not None and int(np.prod(ds.chunks, dtype=object)) * ds.dtype.itemsize > MAX_CHUNK_BYTES:
        raise TraceError(f"dataset {name!r} has implausibly large chunks")
    return ds
