"""Read a trace safely: plain h5py reads of numbers, strings and JSON; nothing executed.

Tables are loaded whole (a few dozen bytes per row); values are read lazily from the
byte arena, one slice each, after checking that the slice lies inside it.

Sizes are checked before anything is read (a hostile file must not make the reader
allocate or work in proportion to what it claims): tables by rows x row size against the
file's size; the manifest by the length in its heap reference (`MAX_MANIFEST_BYTES`);
every variable-length string object in the file against `MAX_HEAP_OBJECT_BYTES`; the
strings table by its count (`MAX_STRINGS`), and only the strings that the events and
values tables refer to are read (a string nobody refers to is never shown), in ranges
whose lengths are checked first (`MAX_ONE_STRING_BYTES` each, `MAX_STRING_BYTES` in all).
"""

import dataclasses
import json
import os
import struct
from typing import Callable, Optional

import h5py
import numpy as np

from ...errors import TraceError, one_line
from .. import codec, schema, values
from ..sources import LIB_SEP, parse_source, split_site

MAX_MANIFEST_BYTES = 16 << 20
MAX_HEAP_OBJECT_BYTES = 16 << 20   # one variable-length string (the manifest is the largest)
MAX_ONE_STRING_BYTES = 1 << 20     # one entry of the strings table (names, params: short)
MAX_STRINGS = 1 << 24              # entries of the strings table
MAX_ATTR_BYTES = 4096          # root attributes are short strings and numbers
MAX_STRING_BYTES = 256 << 20   # the strings table, all strings together
MAX_CHUNK_BYTES = 64 << 20     # one chunk of a table (the writer uses 1 MiB)
SLACK_BYTES = 1 << 20          # HDF5 overhead allowed when comparing sizes to the file's
MAX_DIMS = 64
MAX_STRING_LEN = 4096          # one string as the reports see it (longer ones are cut)
MAX_HEAP_BYTES = 256 << 20     # one global heap collection (HDF5 makes 4 KiB ones for short strings)
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"

# manifest sections the reports read, and the JSON types they must have
_MANIFEST_OBJECTS = ("os", "python", "cpu", "packages", "env", "threads", "recording", "script",
                     "end", "frameworks", "distributed")
_MANIFEST_STRINGS = ("tracediff_version", "created", "hostname")
_SECTION_STRINGS = {"script": ("path", "name", "sha256"), "end": ("status", "exception", "message",
                                                                   "traceback"),
                    "os": ("system", "release", "version", "platform"),
                    "cpu": ("machine", "processor", "model")}


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


def _vlen_spans(ds):
    """[(first element, byte offset, bytes)] of a variable-length dataset's storage."""
    if ds.chunks is None:
        off = ds.id.get_offset()
        return [] if off is None else [(0, off, ds.size * 16)]
    spans = []
    for i in range(ds.id.get_num_chunks()):
        info = ds.id.get_chunk_info(i)
        spans.append((info.chunk_offset[0], info.byte_offset, info.size))
    return spans


def _vlen_ids(fh, spans, file_size, lo, hi):
    """The raw (length, heap collection address, object index) of elements [lo, hi) of a
    variable-length string dataset, read from the file itself, not through HDF5
    (zeros where no storage is allocated: HDF5 reads those as empty strings)."""
    ids = np.zeros(max(0, hi - lo), _HEAP_ID)
    for start, off, size in spans:
        s_lo, s_hi = max(lo, start), min(hi, start + size // 16)
        if s_lo >= s_hi:
            continue  # outside the range (or past the last commit): not read, not checked
        if off is None or off < 0 or size < 0 or size % 16 or off + size > file_size:
            raise TraceError("a variable-length table lies outside the file")
        fh.seek(off + (s_lo - start) * 16)
        raw = fh.read((s_hi - s_lo) * 16)
        if len(raw) != (s_hi - s_lo) * 16:
            raise TraceError("a variable-length table lies outside the file")
        ids[s_lo - lo:s_hi - lo] = np.frombuffer(raw, dtype=_HEAP_ID)
    return ids


_HEAP_ID = np.dtype([("length", "<u4"), ("addr", "<u8"), ("index", "<u4")])


class _Heaps:
    """Checks the global heap objects a string dataset points to before HDF5 reads them.

    HDF5 trusts these structures: a zeroed or garbled heap collection was measured to
    make it loop forever. Each referenced collection must have the GCOL signature, a
    size inside the file, and a well-formed list of objects covering the referenced
    ones with at least the referenced length. Collections are parsed once."""

    def __init__(self, path, file_size):
        self.path, self.file_size, self.objects = path, file_size, {}

    def lengths(self, ds, lo, hi, spans=None):
        """Checked string lengths (bytes) of elements [lo, hi) of `ds`."""
        spans = _vlen_spans(ds) if spans is None else spans
        with open(self.path, "rb") as fh:
            ids = _vlen_ids(fh, spans, self.file_size, lo, hi)
            live = (ids["addr"] != 0) | (ids["length"] != 0)
            for addr in np.unique(ids["addr"][live]).tolist():
                if addr not in self.objects:
                    self.objects[addr] = _heap_collection(fh, addr, self.file_size)
        for length, addr, index in zip(ids["length"][live].tolist(), ids["addr"][live].tolist(),
                                       ids["index"][live].tolist()):
            size = self.objects[addr].get(index)
            if size is None or length > size:
                raise TraceError("a string refers to a missing or shorter heap object")
        return np.where(live, ids["length"], 0).astype(np.int64)


def _check_heap(ds, path, file_size, n=1):
    """Check the heap objects of the first `n` elements of a string dataset (see `_Heaps`);
    returns their lengths in bytes."""
    return _Heaps(path, file_size).lengths(ds, 0, n)


def _manifest_size(f, path, file_size):
    """Bytes of the manifest string, from its dataset's type or its heap reference (read
    from the file, not through HDF5), or None when it cannot be told that way."""
    link = f.get("manifest", getlink=True)
    if not isinstance(link, h5py.HardLink):
        return None
    ds = f["manifest"]
    if not isinstance(ds, h5py.Dataset) or ds.shape != ():
        return None
    info = h5py.check_string_dtype(ds.dtype)
    if info is None:
        return None
    if info.length is not None:
        return ds.dtype.itemsize
    with open(path, "rb") as fh:
        ids = _vlen_ids(fh, _vlen_spans(ds), file_size, 0, 1)
    return int(ids["length"][0])


def _scan_heaps(path, file_size, block=16 << 20):
    """Check every global heap collection in the file (HDF5 keeps variable-length
    strings, attributes included, in them) before HDF5 parses one: a collection with a
    damaged free-space record makes HDF5 loop forever. Streams the file once."""
    with open(path, "rb") as fh:
        pos, tail = 0, b""
        while pos < file_size:
            fh.seek(pos)
            data = tail + fh.read(block)
            base = pos - len(tail)
            i = data.find(b"GCOL\x01")
            while i >= 0:
                _heap_collection(fh, base + i, file_size)
                i = data.find(b"GCOL\x01", i + 1)
            pos += block
            tail = data[-4:]


_OBJ_HEADER = struct.Struct("<H6xQ")   # heap object: index, reference count, reserved, size


def _heap_collection(fh, addr, file_size, whole=1 << 20):
    """{object index: size} of the global heap collection at `addr`, checked. Only the
    16-byte object headers are read (the collection whole when it is small), so a large
    collection costs no memory; HDF5 numbers objects with 16 bits, so there are at most
    65535 of them."""
    if addr < 8 or addr + 16 > file_size:
        raise TraceError("a string heap lies outside the file (is it still being written?)")
    fh.seek(addr)
    head = fh.read(16)
    size = int.from_bytes(head[8:16], "little")
    if head[:4] != b"GCOL" or head[4] != 1 or not 32 <= size <= MAX_HEAP_BYTES or \
            addr + size > file_size:
        raise TraceError("a string heap is damaged")
    end = size - 16
    if end <= whole:
        data = fh.read(end)
        if len(data) != end:
            raise TraceError("a string heap lies outside the file (is it still being written?)")

        def header(p):
            return _OBJ_HEADER.unpack_from(data, p)
    else:
        def header(p):
            fh.seek(addr + 16 + p)
            h = fh.read(16)
            if len(h) != 16:
                raise TraceError("a string heap lies outside the file (is it still being "
                                 "written?)")
            return _OBJ_HEADER.unpack(h)
    objects, p = {}, 0
    while p + 16 <= end:
        index, osize = header(p)
        if index == 0:  # free space: exactly the rest of the collection (a wrong size
            if osize != end - p:  # makes HDF5 loop forever)
                raise TraceError("a string heap is damaged")
            break
        if index in objects or osize > end - p - 16:
            raise TraceError("a string heap is damaged")
        if osize > MAX_HEAP_OBJECT_BYTES:
            raise TraceError(f"the file holds a variable-length string of {osize:,} bytes, more "
                             f"than the {MAX_HEAP_OBJECT_BYTES >> 20} MiB any string of a trace "
                             f"may hold")
        objects[index] = osize
        p += 16 + ((osize + 7) & ~7)
    return objects


@dataclasses.dataclass(frozen=True)
class DeviceValue:
    """One device's copy of a recorded value (`Trace.device_values`): the device
    ("cpu:3"), the shard's index in the global value ("0:4,:"; "" = the whole value),
    its replica number, the hex digest of its exact bytes, and `value()` for its numbers
    (None when only the digest was stored)."""

    device: str
    shard: str
    replica: int
    digest: str
    _read: Optional[Callable] = dataclasses.field(default=None, repr=False, compare=False)

    def value(self) -> Optional[np.ndarray]:
        return self._read() if self._read is not None else None


class Trace:
    """A recorded run: manifest, event/value/input tables, and lazy access to values.

    Opening checks everything a report could trip over, so a damaged or hostile file
    fails here with one `TraceError` line: table sizes against the file's size, string
    references, value shapes, dtypes and byte ranges, the manifest's types. `complete`
    is False for a recording that did not finish (killed): its committed rows are read.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._f = _open(self.path)
        try:
            self._load()
        except TraceError as exc:
            self._f.close()
            msg = str(exc)
            raise TraceError(msg if msg.startswith(self.path) else f"{self.path}: {msg}") from None
        except Exception as exc:  # h5py / numpy on a damaged file: one line, never a traceback
            self._f.close()
            raise TraceError(f"{self.path}: damaged trace ({one_line(exc, 160, with_type=True)})") from None

    def _load(self):
        f = self._f
        self.file_size = os.path.getsize(self.path)
        try:  # before any heap is parsed or read: its size is in its reference
            msize = _manifest_size(f, self.path, self.file_size)
        except TraceError:
            raise
        except Exception:
            msize = None  # damaged: the full checks below say how
        if msize is not None and msize > MAX_MANIFEST_BYTES:
            raise TraceError(f"the manifest is {msize:,} bytes, more than the "
                             f"{MAX_MANIFEST_BYTES >> 20} MiB a manifest may hold")
        _scan_heaps(self.path, self.file_size)
        fmt = _attr(f, "format")
        if fmt != schema.FORMAT_NAME:
            raise TraceError(f"{self.path}: an HDF5 file, but not a tracediff trace")
        version = _int_attr(f, "schema_version", -1)
        if version > schema.SCHEMA_VERSION:
            raise TraceError(f"{self.path}: trace schema version {version} is newer than this "
                             f"tracediff reads ({schema.SCHEMA_VERSION}); upgrade tracediff")
        if version < 1:
            raise TraceError(f"{self.path}: invalid schema version {version}")
        self.schema_version = version
        complete = _attr(f, "complete", False)
        self.complete = complete is True or (isinstance(complete, int) and complete == 1)
        budget = self.file_size + SLACK_BYTES
        tables = {}
        for name, dt in schema.TABLES.items():
            if name in schema.OPTIONAL_TABLES and name not in f:
                tables[name] = np.zeros(0, dt)
                continue
            ds = _dataset(f, name)
            if ds.dtype != dt or ds.ndim != 1:
                raise TraceError(f"{self.path}: table {name!r} has an unexpected layout")
            n = max(0, min(_int_attr(f, f"committed_{name}", 0), ds.shape[0]))
            if n * dt.itemsize > budget:
                raise TraceError(f"{self.path}: table {name!r} claims {n} rows, more than the "
                                 f"file can hold")
            tables[name] = ds[:n] if n else np.zeros(0, dt)
            if len(tables[name]) != n:
                raise TraceError(f"{self.path}: table {name!r} is shorter than recorded")
        self.events, self.values, self.inputs = tables["events"], tables["values"], tables["inputs"]
        self.stats_rows = tables["stats"]  # statistics of values stored as stats + hash only
        self._stats_index = None
        self.source_rows = tables["sources"]  # recorded source lines (empty in older traces)
        self.device_rows = tables["devices"]  # the device of per-device events (empty: none)
        self.shard_rows = tables["shards"]    # per-device copies of global values (empty: none)
        self.placement_rows = tables["placements"]  # DTensor local shards (empty: none)
        self.optim_setting_rows = tables["optim_settings"]  # optimizer settings (empty: none)
        self.strings = self._load_strings(_dataset(f, "strings"), _int_attr(f, "committed_strings", 0))
        blob = _dataset(f, "blob", codec_ok=True)
        if blob.dtype != np.uint8 or blob.ndim != 1:
            raise TraceError(f"{self.path}: the value bytes have an unexpected layout")
        self.codec = codec.blob_codec(blob)
        self.chunks = None   # compressed: each chunk checked whole before its bytes are used
        if self.codec != "none":   # compressed: bounded by its checked chunks, not the file
            codec.need_plugin(self.path)
            n_chunks, packed = codec.check_blob_chunks(blob, self.path, self.file_size)
            budget = min(n_chunks * blob.chunks[0], codec.MAX_RATIO * packed)
            self.chunks = codec.ChunkCheck(blob, self.path)
        self.blob_size = max(0, min(_int_attr(f, "committed_blob", 0), blob.shape[0]))
        self._blob = blob   # kept: looking a dataset up by name costs more than a small read
        if self.blob_size > budget:
            more = f"{codec.MAX_RATIO}x its compressed chunks can hold" if self.chunks else \
                "the file holds"
            raise TraceError(f"{self.path}: the trace claims {self.blob_size} value bytes, more "
                             f"than {more}")
        self.manifest = self._load_manifest(_dataset(f, "manifest"))
        self.hash_name, self.hash_function = self._hash_function()
        dist = self.manifest.get("distributed") or {}
        self.rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
        ws = dist.get("world_size")
        self.world_size = ws if isinstance(ws, int) and not isinstance(ws, bool) else None
        self._check_tables()
        self._v_order = np.argsort(self.values["event"], kind="stable")
        self._v_sorted = self.values["event"][self._v_order]
        self._i_order = np.argsort(self.inputs["event"], kind="stable")
        self._i_sorted = self.inputs["event"][self._i_order]

    def _hash_function(self):
        """(name, function) of the hash the trace's values were recorded with (manifest
        recording.hash; older traces: xxh3_64). A compressed trace's bytes are checked
        with it (`check_digest`), so one naming a hash this reader does not know is
        refused; an uncompressed one opens (function None: its bytes are not rehashed)."""
        rec = self.manifest.get("recording")
        name = rec.get("hash", values.HASH_NAME) if isinstance(rec, dict) else values.HASH_NAME
        fn = values.DIGESTS.get(name) if isinstance(name, str) else None
        if fn is None and self.chunks is not None:
            raise TraceError(f"{self.path}: the values are hashed with {str(name)[:40]!r}, "
                             f"which this tracediff cannot check (it knows "
                             f"{', '.join(values.DIGESTS)})")
        return name if fn is not None else str(name)[:40], fn

    def _referenced_strings(self, n):
        """Sorted indices of the strings that the events, values and sources tables refer to."""
        cols = [self.events[c] for c in ("op", "params", "name_stack", "source", "node")] + \
            [self.values[c] for c in ("dtype", "storage", "shape", "name")] + \
            [self.source_rows[c] for c in ("source", "lines", "sha256")] + \
            [self.device_rows["device"]] + [self.shard_rows[c] for c in ("device", "index", "shape")] + \
            [self.placement_rows[c] for c in schema.PLACEMENT_STRINGS] + \
            [self.optim_setting_rows[c] for c in schema.OPTIM_SETTING_STRINGS]
        ref = np.unique(np.concatenate([np.asarray(c, np.int64) for c in cols])) if cols else \
            np.zeros(0, np.int64)
        return ref[(ref >= 0) & (ref < n)]

    def _load_strings(self, ds, committed):
        """The strings table as a list; entries no table refers to are "" (never read)."""
        info = h5py.check_string_dtype(ds.dtype)
        if ds.ndim != 1 or info is None:
            raise TraceError(f"{self.path}: the strings table has an unexpected layout")
        n = max(0, min(committed, ds.shape[0]))
        if n > MAX_STRINGS:
            raise TraceError(f"{self.path}: the strings table holds {n:,} strings, more than "
                             f"the {MAX_STRINGS:,} a trace may hold")
        # every stored string takes >= 16 bytes (variable length) or its fixed length
        if n * max(16, ds.dtype.itemsize) > self.file_size + SLACK_BYTES:
            raise TraceError(f"{self.path}: the strings table claims {n} strings, more than "
                             f"the file can hold")
        if info.length is not None and ds.dtype.itemsize > MAX_ONE_STRING_BYTES:
            raise TraceError(f"{self.path}: the strings table has {ds.dtype.itemsize:,}-byte "
                             f"strings, more than the {MAX_ONE_STRING_BYTES >> 20} MiB a string "
                             f"may hold")
        ref = self._referenced_strings(n)
        out = [""] * n
        heaps = _Heaps(self.path, self.file_size) if info.length is None else None
        spans = _vlen_spans(ds) if heaps is not None and len(ref) else None
        limit = min(MAX_STRING_BYTES, self.file_size + SLACK_BYTES)
        total, step = 0, 1 << 16
        for lo in range(0, n, step):  # in slices, only where a string is referred to
            a, b = np.searchsorted(ref, [lo, lo + step])
            if a == b:
                continue
            sel = ref[a:b]
            lo_, hi_ = int(sel[0]), int(sel[-1]) + 1
            if heaps is not None:   # lengths first: HDF5 reads every string of the range
                lengths = heaps.lengths(ds, lo_, hi_, spans)
                longest = int(lengths.max())
                if longest > MAX_ONE_STRING_BYTES:
                    raise TraceError(f"{self.path}: the strings table holds a string of "
                                     f"{longest:,} bytes, more than the "
                                     f"{MAX_ONE_STRING_BYTES >> 20} MiB a string may hold")
                if total + int(lengths.sum()) > limit:
                    raise TraceError(f"{self.path}: the strings table is implausibly large")
            chunk = ds[lo_:hi_]
            for i in sel.tolist():
                s = chunk[i - lo_]
                s = s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s)
                total += len(s)
                if len(s) > MAX_STRING_LEN:  # names, sources, params are short; a report
                    s = s[:MAX_STRING_LEN] + "…"  # must not spend minutes laying out one
                out[i] = s
            if total > limit:
                raise TraceError(f"{self.path}: the strings table is implausibly large")
        return out

    def _load_manifest(self, mds):
        if mds.shape != () or h5py.check_string_dtype(mds.dtype) is None:
            raise TraceError(f"{self.path}: manifest is not a JSON string")
        if h5py.check_string_dtype(mds.dtype).length is not None and \
                mds.dtype.itemsize > MAX_MANIFEST_BYTES:
            raise TraceError(f"{self.path}: manifest is implausibly large")
        if h5py.check_string_dtype(mds.dtype).length is None:
            size = int(_check_heap(mds, self.path, self.file_size)[0])
            if size > MAX_MANIFEST_BYTES:
                raise TraceError(f"{self.path}: the manifest is {size:,} bytes, more than the "
                                 f"{MAX_MANIFEST_BYTES >> 20} MiB a manifest may hold")
        text = mds[()]
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if not isinstance(text, str):
            raise TraceError(f"{self.path}: manifest is not a JSON string")
        if len(text) > MAX_MANIFEST_BYTES:
            raise TraceError(f"{self.path}: manifest is implausibly large")
        try:
            manifest = json.loads(text)
        except (ValueError, RecursionError):
            raise TraceError(f"{self.path}: manifest is not valid JSON") from None
        if not isinstance(manifest, dict):
            raise TraceError(f"{self.path}: manifest is not a JSON object")
        for key in _MANIFEST_OBJECTS:
            if manifest.get(key) is not None and not isinstance(manifest[key], dict):
                raise TraceError(f"{self.path}: manifest field {key!r} is not an object")
        for key in _MANIFEST_STRINGS:
            if manifest.get(key) is not None and not isinstance(manifest[key], str):
                raise TraceError(f"{self.path}: manifest field {key!r} is not a string")
        for section, keys in _SECTION_STRINGS.items():
            for key in keys:
                v = (manifest.get(section) or {}).get(key)
                if v is not None and not isinstance(v, str):
                    raise TraceError(f"{self.path}: manifest field {section}.{key} is not a string")
        for key, value in (manifest.get("frameworks") or {}).items():
            if key in ("jax", "torch") and value is not None and not isinstance(value, dict):
                raise TraceError(f"{self.path}: manifest field frameworks.{key} is not an object")
        code = (manifest.get("end") or {}).get("exit_code")
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            raise TraceError(f"{self.path}: manifest field end.exit_code is not an integer")
        return manifest

    def _check_tables(self):
        """Cross-checks of the tables (vectorised; milliseconds for millions of rows)."""
        n_ev, n_str = len(self.events), len(self.strings)
        bad = lambda what: TraceError(f"{self.path}: damaged trace ({what})")  # noqa: E731
        e = self.events
        for col in ("op", "params", "name_stack", "source", "node"):
            if len(e) and ((e[col] < -1) | (e[col] >= n_str)).any():
                raise bad(f"events.{col} refers to a string that does not exist")
        for col in ("call", "parent"):
            if len(e) and ((e[col] < -1) | (e[col] >= n_ev)).any():
                raise bad(f"events.{col} refers to an event that does not exist")
        # Value and input rows of events past the last commit (writer killed) are dropped.
        self.values = self.values[(self.values["event"] >= 0) & (self.values["event"] < n_ev)]
        self.inputs = self.inputs[(self.inputs["event"] >= 0) & (self.inputs["event"] < n_ev)]
        v = self.values
        for col in ("dtype", "storage", "shape", "name"):
            if len(v) and ((v[col] < -1) | (v[col] >= n_str)).any():
                raise bad(f"values.{col} refers to a string that does not exist")
        src = self.source_rows
        for col in ("source", "lines", "sha256"):
            if len(src) and ((src[col] < -1) | (src[col] >= n_str)).any():
                raise bad(f"sources.{col} refers to a string that does not exist")
        self.device_rows = self.device_rows[(self.device_rows["event"] >= 0) &
                                            (self.device_rows["event"] < n_ev)]
        if len(self.device_rows) and ((self.device_rows["device"] < -1) |
                                      (self.device_rows["device"] >= n_str)).any():
            raise bad("devices.device refers to a string that does not exist")
        self._check_shards(bad, n_ev, n_str)
        pl = self.placement_rows
        pl = self.placement_rows = pl[(pl["event"] >= 0) & (pl["event"] < n_ev)]
        for col in schema.PLACEMENT_STRINGS:
            if len(pl) and ((pl[col] < -1) | (pl[col] >= n_str)).any():
                raise bad(f"placements.{col} refers to a string that does not exist")
        os_ = self.optim_setting_rows
        os_ = self.optim_setting_rows = os_[(os_["event"] >= 0) & (os_["event"] < n_ev)]
        for col in schema.OPTIM_SETTING_STRINGS:
            if len(os_) and ((os_[col] < -1) | (os_[col] >= n_str)).any():
                raise bad(f"optim_settings.{col} refers to a string that does not exist")
        i = self.inputs
        if len(i) and ((i["producer"] < schema.PRODUCER_CONST) | (i["producer"] >= n_ev)).any():
            raise bad("inputs.producer refers to an event that does not exist")
        # Every shape must parse; every stored value must lie inside the committed bytes
        # and hold exactly shape x itemsize bytes of a dtype numpy knows.
        shapes = {}
        for idx in np.unique(v["shape"]).tolist() if len(v) else ():
            try:
                dims = values.parse_shape(self.string(idx), MAX_DIMS)
            except ValueError as exc:
                raise bad(f"value shape: {exc}") from None
            count = 1
            for d in dims:
                count *= d
            shapes[idx] = count
        stored = v[(v["offset"] >= 0) & ((v["flags"] & (schema.VFLAG_NOT_STORED |
                                                         schema.VFLAG_UNINIT)) == 0)]
        if not len(stored):
            return
        if ((stored["nbytes"] < 0) | (stored["offset"] > self.blob_size - stored["nbytes"])).any():
            raise bad("value bytes lie outside the stored data")
        itemsize = {}
        for idx in np.unique(stored["storage"]).tolist():
            name = self.string(idx)
            if name not in values._NATIVE:
                raise bad(f"unknown storage dtype {name[:40]!r}")
            itemsize[idx] = np.dtype(name).itemsize
        pairs = np.unique(np.stack([stored["shape"].astype(np.int64),
                                    stored["storage"].astype(np.int64),
                                    stored["nbytes"]], axis=1), axis=0)
        for shape_idx, storage_idx, nbytes in pairs.tolist():
            if shapes[shape_idx] * itemsize[storage_idx] != nbytes:
                raise bad("a value's size does not match its shape and dtype")

    def _check_shards(self, bad, n_ev, n_str):
        """Shard rows: of committed events, strings that exist, a replica number >= 0,
        own bytes inside the committed bytes (sizes against shapes are checked when read)."""
        sh = self.shard_rows
        sh = self.shard_rows = sh[(sh["event"] >= 0) & (sh["event"] < n_ev)]
        if not len(sh):
            return
        for col in ("device", "index", "shape"):
            if ((sh[col] < -1) | (sh[col] >= n_str)).any():
                raise bad(f"shards.{col} refers to a string that does not exist")
        if (sh["replica"] < 0).any() or (sh["role"] > schema.ROLE_IN).any():
            raise bad("shards: invalid replica or role")
        own = sh[sh["offset"] >= 0]
        if len(own) and ((own["nbytes"] < 0) | (own["offset"] > self.blob_size - own["nbytes"])).any():
            raise bad("shard bytes lie outside the stored data")
        # every index is well formed (bounded before it is parsed) and agrees with the
        # shard's own shape where it names both ends: a malformed index would otherwise
        # pair with nothing in the other trace and its difference go unseen
        pairs = np.unique(np.stack([sh["index"].astype(np.int64), sh["shape"].astype(np.int64)],
                                   axis=1), axis=0)
        for idx, shp in pairs.tolist():
            text = self.string(idx)
            try:
                parts = values.shard_index_parts(text, MAX_DIMS)
                dims = values.parse_shape(self.string(shp), MAX_DIMS) if parts else ()
            except ValueError as exc:
                raise bad(f"shards: {exc}") from None
            if len(parts) > len(dims) or any(
                    (lo or 0) > hi or (hi - (lo or 0)) != d
                    for (lo, hi), d in zip(parts, dims) if hi is not None):
                raise bad(f"shards: shard index {text[:40]!r} does not match the shard's "
                          f"shape {tuple(dims)}")
        self._check_shard_extents(bad, sh)

    def _check_shard_extents(self, bad, sh):
        """A shard's open index parts (`:`, `A:`) run to the end of the global value's
        dimension: the shard's own extent there must be what is left of it. An index
        rewritten to `:,:` on a smaller shard would otherwise read as the whole value and
        hide a difference (each device's copy compared as if it were the global one)."""
        v = self.values
        v = v[np.isin(v["event"], np.unique(sh["event"]))]
        keys = {(int(e), int(sl), int(r)): int(shp) for e, sl, r, shp in
                zip(v["event"].tolist(), v["slot"].tolist(), v["role"].tolist(),
                    v["shape"].tolist())}
        seen = set()
        for row in sh:
            g = keys.get((int(row["event"]), int(row["slot"]), int(row["role"])))
            trip = (int(row["index"]), int(row["shape"]), g)
            if g is None or trip in seen:
                continue
            seen.add(trip)
            try:
                parts = values.shard_index_parts(self.string(trip[0]), MAX_DIMS)
                dims = values.parse_shape(self.string(trip[1]), MAX_DIMS)
                full = values.parse_shape(self.string(g), MAX_DIMS)
            except ValueError as exc:
                raise bad(f"shards: {exc}") from None
            if parts and len(parts) == len(dims) == len(full) and any(
                    hi is None and d != f - (lo or 0)
                    for (lo, hi), d, f in zip(parts, dims, full)):
                raise bad(f"shards: shard index {self.string(trip[0])[:40]!r} does not match "
                          f"the shard's shape {tuple(dims)} in a value of shape {tuple(full)}")

    # -- per-device values --------------------------------------------------------------------
    def placement(self, event_index, slot=0, role=schema.ROLE_OUT):
        """Where value (event, slot, role) sits in its global tensor when it is one rank's
        local shard of a torch DTensor: {"placements", "mesh", "coord", "global_shape",
        "offset", "param"} (strings as recorded, untrusted; "param" None when the value
        is no parameter's), else None."""
        rows = self.placement_rows
        if not len(rows):
            return None
        hit = rows[(rows["event"] == int(event_index)) & (rows["slot"] == int(slot)) &
                   (rows["role"] == int(role))]
        if not len(hit):
            return None
        r = hit[0]
        out = {c: self.string(r[c]) if r[c] >= 0 else None for c in schema.PLACEMENT_STRINGS}
        return out

    def optim_settings(self, event_index):
        """The settings recorded for optimizer-step event `event_index` (the
        `optim_settings` table): [(group, key, value, text)], keys and texts as recorded
        (untrusted), value a float (NaN: no number); [] where none were recorded (an older
        trace, or a framework that exposes none)."""
        rows = self.optim_setting_rows
        if not len(rows):
            return []
        hit = rows[rows["event"] == int(event_index)]
        return [(int(r["group"]), self.string(r["key"]), float(r["value"]),
                 self.string(r["text"]) if r["text"] >= 0 else "") for r in hit]

    def has_devices(self) -> bool:
        """True when the trace records any per-device event or per-device value."""
        return bool(len(self.device_rows) or len(self.shard_rows))

    def event_device(self, eid) -> str:
        """The device event `eid` ran on ("cpu:3"), "" when it is not tied to one device."""
        idx = getattr(self, "_device_index", None)
        if idx is None:
            rows = self.device_rows
            order = np.argsort(rows["event"], kind="stable")
            idx = self._device_index = (rows["event"][order], rows["device"][order])
        i = int(np.searchsorted(idx[0], int(eid)))
        return self.string(idx[1][i]) if i < len(idx[0]) and idx[0][i] == int(eid) else ""

    def device_values(self, event_index, slot=0, role=schema.ROLE_OUT) -> list:
        """Per-device values of one value of an event (output `slot` 0 unless told), as
        [DeviceValue] in recorded order (by device, then replica):

        - a global value recorded per addressable shard or replica (a sharded or
          replicated jax.Array): one DeviceValue per shard, `shard` its index in the
          global value ("0:4,:"; "" = the whole value, a replica), `replica` its replica
          number (0 = the first copy of that index);
        - an event tied to one device (a `shard_map`/`pmap` body replayed per device):
          one DeviceValue with that device, shard "" and the event's own value;
        - otherwise [] (a value not tied to devices).

        `value()` returns the numbers (None when only the digest was stored); `digest` is
        the hex xxh3-64 of the exact bytes, so equal digests mean bitwise-equal copies."""
        eid, slot, role = int(event_index), int(slot), int(role)
        if not 0 <= eid < len(self.events):
            raise IndexError(f"event {eid} is not in {self.path}")
        rows = self.value_rows(eid)
        rows = rows[(rows["slot"] == slot) & (rows["role"] == role)]
        parent = rows[0] if len(rows) else None
        idx = getattr(self, "_shard_index", None)
        if idx is None:
            order = np.argsort(self.shard_rows["event"], kind="stable")
            idx = self._shard_index = (self.shard_rows["event"][order], order)
        lo, hi = np.searchsorted(idx[0], [eid, eid + 1])
        sh = self.shard_rows[idx[1][lo:hi]]
        sh = sh[(sh["slot"] == slot) & (sh["role"] == role)]
        out = []
        for r in sh:
            out.append(DeviceValue(device=self.string(r["device"]), shard=self.string(r["index"]),
                                   replica=int(r["replica"]), digest=f"{int(r['hash']):016x}",
                                   _read=lambda r=r, p=parent: self._read_shard(r, p)))
        if not out and parent is not None:
            dev = self.event_device(eid)
            if dev:
                h = int(parent["hash"])
                out.append(DeviceValue(device=dev, shard="", replica=0,
                                       digest=f"{h:016x}" if h else "",
                                       _read=lambda p=parent: self.read_value(p)))
        return out

    def _read_shard(self, r, parent):
        """The numbers of one shards row: its own bytes, or the global value's slice."""
        if parent is None:
            return None
        if r["offset"] >= 0:
            storage = self.string(parent["storage"])
            try:
                shape = values.parse_shape(self.string(r["shape"]), MAX_DIMS)
            except ValueError as exc:
                raise TraceError(f"{self.path}: damaged trace (shard shape: {exc})") from None
            itemsize = np.dtype(storage).itemsize if storage in values._NATIVE else 0
            count = 1
            for d in shape:
                count *= d
            off, n = int(r["offset"]), int(r["nbytes"])
            if itemsize == 0 or count * itemsize != n or off + n > self.blob_size:
                raise TraceError(f"{self.path}: shard size does not match its shape and dtype")
            raw = self.stored_bytes(off, n, r["hash"])
            return values.decode(raw, self.string(parent["dtype"]), storage, shape)
        if r["flags"] & schema.SHARD_SLICE:
            whole = self.read_value(parent)
            if whole is None:
                return None
            try:
                index = values.parse_shard_index(self.string(r["index"]), whole.shape)
            except ValueError as exc:
                raise TraceError(f"{self.path}: damaged trace ({exc})") from None
            return np.ascontiguousarray(whole[index])
        return None

    # -- strings and events -----------------------------------------------------------------
    @property
    def truncated(self):
        return not self.complete

    def string(self, idx):
        idx = int(idx)
        return self.strings[idx] if 0 <= idx < len(self.strings) else ""

    def __len__(self):
        return len(self.events)

    def event(self, eid):
        """One event as a plain dict with its strings resolved."""
        e = self.events[int(eid)]
        s = self.string
        user, lib = split_site(s(e["source"]))
        return {
            "index": int(eid),
            "framework": schema.FW_NAMES.get(int(e["framework"]), "?"),
            "kind": schema.KIND_NAMES.get(int(e["kind"]), "?"),
            "phase": schema.PHASE_NAMES.get(int(e["phase"]), "?"),
            "origin": schema.ORIGIN_NAMES.get(int(e["origin"]), "?"),
            "op": s(e["op"]), "params": s(e["params"]), "name_stack": s(e["name_stack"]),
            "source": user, "lib_source": lib, "node": s(e["node"]),
            "call": int(e["call"]), "parent": int(e["parent"]), "step": int(e["step"]),
            "iter": int(e["iter"]), "device": self.event_device(eid) if len(self.device_rows) else "",
        }

    def events_table(self):
        """The events as a dict of equal-length numpy columns, strings resolved, for
        `pandas.DataFrame(t.events_table())` (pandas is not needed otherwise).

        Columns: index, framework, kind, phase, origin, op, name_stack, source (the user's
        file:line), lib_source (the library's, "" when the op ran in the user's code), node,
        params (str, object arrays), call, parent, step, iter (int64; -1 = none),
        n_outputs (int64) and out_dtype / out_shape (str: first output value, "" if none),
        device (str: the one device of a per-device event, "" for none).
        """
        e = self.events
        strings = np.array(self.strings + [""], dtype=object)

        def resolve(col):
            idx = e[col].astype(np.int64)
            idx = np.where((idx >= 0) & (idx < len(self.strings)), idx, len(self.strings))
            return strings[idx]

        def names(col, table):
            lut = np.array([table.get(i, "?") for i in range(256)], dtype=object)
            return lut[e[col].astype(np.int64)]

        n = len(e)
        out_rows = self.values[self.values["role"] == schema.ROLE_OUT]
        n_out = np.bincount(out_rows["event"].astype(np.int64), minlength=n)[:n] \
            if len(out_rows) else np.zeros(n, np.int64)
        first = out_rows[out_rows["slot"] == 0]
        out_dtype = np.full(n, "", dtype=object)
        out_shape = np.full(n, "", dtype=object)
        if len(first):
            ev = first["event"].astype(np.int64)
            out_dtype[ev] = strings[np.where(first["dtype"] >= 0, first["dtype"], len(self.strings))]
            out_shape[ev] = strings[np.where(first["shape"] >= 0, first["shape"], len(self.strings))]
        return {
            "index": np.arange(n, dtype=np.int64),
            "framework": names("framework", schema.FW_NAMES),
            "kind": names("kind", schema.KIND_NAMES),
            "phase": names("phase", schema.PHASE_NAMES),
            "origin": names("origin", schema.ORIGIN_NAMES),
            "op": resolve("op"), "name_stack": resolve("name_stack"),
            **self._site_columns(resolve("source")), "node": resolve("node"), "params": resolve("params"),
            "call": e["call"].astype(np.int64), "parent": e["parent"].astype(np.int64),
            "step": e["step"].astype(np.int64), "iter": e["iter"].astype(np.int64),
            "n_outputs": n_out.astype(np.int64), "out_dtype": out_dtype, "out_shape": out_shape,
            "device": self._device_column(n, strings),
        }

    @staticmethod
    def _site_columns(col):
        """{"source": user sites, "lib_source": library sites} of a resolved events.source
        column ("LIB ← USER" split, trace/sources.py)."""
        user, lib = col.copy(), np.full(len(col), "", dtype=object)
        for text in set(col.tolist()):
            if isinstance(text, str) and LIB_SEP in text:
                k = col == text
                user[k], lib[k] = split_site(text)
        return {"source": user, "lib_source": lib}

    def _device_column(self, n, strings):
        col = np.full(n, "", dtype=object)
        d = self.device_rows
        if len(d):
            col[d["event"].astype(np.int64)[::-1]] = \
                strings[np.where(d["device"] >= 0, d["device"], len(self.strings))[::-1]]
        return col

    # -- recorded source lines ---------------------------------------------------------------
    MAX_SOURCE_LINES = 11   # lines returned per source (the recorder stores up to 5)
    MAX_SOURCE_LINE = 240   # characters per line (as the recorder cuts them)

    def source_lines(self, source):
        """The lines recorded around `source` ("file.py:LINE", an events.source string):
        {"file", "line", "first", "lines": [(number, text)], "sha256" (hex or None)}, or
        None when the trace holds none (older traces, files the recorder could not read).

        Bounded (at most MAX_SOURCE_LINES lines of MAX_SOURCE_LINE characters) but not
        sanitised: the text is the trace's, renderers escape it for their output."""

        parsed = parse_source(source)
        if parsed is None or not len(self.source_rows):
            return None
        # the string itself, and each "LIB ← USER" site whose user part it is
        ids = [i for i, s in enumerate(self.strings)
               if s == source or (LIB_SEP in s and split_site(s)[0] == source)]
        rows = self.source_rows[np.isin(self.source_rows["source"], ids)]  # no per-row loop
        if not len(rows) or rows[0]["lines"] < 0:   # the first row of a source wins
            return None
        row = rows[0]
        first = int(row["first"])
        if first < 1:
            return None
        text = self.string(row["lines"]).split("\n")[:self.MAX_SOURCE_LINES]
        lines = [(first + k, t if len(t) <= self.MAX_SOURCE_LINE else
                  t[:self.MAX_SOURCE_LINE - 1] + "…") for k, t in enumerate(text)]
        sha = self.string(row["sha256"]).lower() if row["sha256"] >= 0 else ""
        ok = len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)
        return {"file": parsed[0], "line": parsed[1], "first": first, "lines": lines,
                "sha256": sha if ok else None}

    def outputs(self, eid):
        """The output values of event `eid` as numpy arrays, by slot (None where a value
        was not stored, e.g. uninitialised memory)."""
        rows = self.value_rows(int(eid), schema.ROLE_OUT)
        rows = rows[np.argsort(rows["slot"], kind="stable")]
        return [self.read_value(r) for r in rows]

    def value_rows(self, eid, role=None):
        """Rows of the values table for event `eid` (outputs by slot unless role given)."""
        lo, hi = np.searchsorted(self._v_sorted, [eid, eid + 1])
        rows = self.values[self._v_order[lo:hi]]
        if role is not None:
            rows = rows[rows["role"] == role]
        return rows

    def input_rows(self, eid):
        lo, hi = np.searchsorted(self._i_sorted, [eid, eid + 1])
        rows = self.inputs[self._i_order[lo:hi]]
        return rows[np.argsort(rows["slot"], kind="stable")]

    # -- statistics (--level stats) ---------------------------------------------------------
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

    def value_meta(self, row):
        s = self.string
        return {"dtype": s(row["dtype"]), "shape": list(self._shape(row)),
                "name": s(row["name"]) if row["name"] >= 0 else None,
                "stored": bool(row["offset"] >= 0 and not row["flags"] & schema.VFLAG_NOT_STORED),
                "uninitialized": bool(row["flags"] & schema.VFLAG_UNINIT),
                "hash": f"{int(row['hash']):016x}", "nbytes": int(row["nbytes"])}

    def _shape(self, row):
        try:
            return values.parse_shape(self.string(row["shape"]), MAX_DIMS)
        except ValueError as exc:
            raise TraceError(f"{self.path}: damaged trace (value shape: {exc})") from None

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

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
