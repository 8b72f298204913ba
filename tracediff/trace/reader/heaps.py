"""HDF5's global heaps checked before HDF5 parses them: variable-length strings (the
manifest, the strings table) live in heap collections that HDF5 trusts, and a zeroed or
garbled one was measured to make it loop forever. The lengths and heap references of a
string dataset are read from the file itself and every collection they point to is
parsed here first, bounded (`MAX_HEAP_BYTES`, `MAX_HEAP_OBJECT_BYTES`).
"""

import struct

import h5py
import numpy as np

from ...errors import TraceError
from .limits import MAX_HEAP_BYTES, MAX_HEAP_OBJECT_BYTES


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
