"""The optional codec of the value bytes (`record --codec zstd`) and the reader's checks of it.

Only the byte arena (`blob`) is ever compressed, with one filter: Zstandard through the
`hdf5plugin` wheel (HDF5 filter 32015, `pip install tracediff-ml[codec]`). Why this one
(docs/performance.md, "Issue 30"): on the JAX MLP's intermediates Zstd level 1 stores
91 % of the bytes, LZ4 99 %; byte shuffle cannot help a uint8 arena (HDF5 filters take
the element size from the dataset's type); and a Zstandard frame states its decompressed
size in a header short and simple enough to check before HDF5 decompresses anything.

A stranger's trace must not make the reader run a filter it did not choose, nor allocate
what a chunk claims: the reader accepts no filter anywhere but this one on `blob`, needs
`hdf5plugin` for it (a one-line TraceError otherwise, never HDF5's plugin search path),
and checks every stored chunk's frame header first (`check_blob_chunks`): the size the
filter allocates and decompresses into must be exactly the chunk's size.
"""

from ..errors import TraceError

CODECS = ("none", "zstd")
ZSTD_FILTER = 32015          # registered HDF5 filter id of Zstandard (hdf5plugin.ZSTD_ID)
ZSTD_LEVEL = 1               # fastest level: the recording is disk-bound, not size-bound
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
INSTALL_HINT = "pip install hdf5plugin (or tracediff-ml[codec])"


def blob_filter(codec):
    """h5py create_dataset keyword arguments of `codec` for the byte arena ({} for none);
    ValueError for an unknown codec or a missing hdf5plugin."""
    if codec in (None, "none"):
        return {}
    if codec != "zstd":
        raise ValueError(f"unknown codec {codec!r} (choose from {', '.join(CODECS)})")
    try:
        import hdf5plugin
    except ImportError:
        raise ValueError(f"--codec zstd needs the hdf5plugin package: {INSTALL_HINT}") from None
    return dict(hdf5plugin.Zstd(clevel=ZSTD_LEVEL))


def plugin_available():
    """Load hdf5plugin's filters into HDF5; False when the package is not installed."""
    import importlib

    try:
        importlib.import_module("hdf5plugin")   # importing registers its filters with HDF5
    except ImportError:
        return False
    return True


def blob_codec(ds):
    """"none" or "zstd": the codec of a blob dataset, refusing any other filter pipeline."""
    plist = ds.id.get_create_plist()
    n = plist.get_nfilters()
    if n == 0:
        return "none"
    if n == 1 and plist.get_filter(0)[0] == ZSTD_FILTER:
        return "zstd"
    raise TraceError(f"dataset {ds.name.lstrip('/')!r} uses filters, external or virtual storage")


def _frame_content_size(head):
    """Decompressed size a Zstandard frame header states (RFC 8878, 3.1.1), or None when
    `head` is not a frame header or does not state one."""
    if len(head) < 6 or head[:4] != _ZSTD_MAGIC:
        return None
    desc = head[4]
    fcs_flag, single, reserved, dict_flag = desc >> 6, (desc >> 5) & 1, (desc >> 3) & 1, desc & 3
    if reserved:
        return None
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0 or len(head) < pos + size:
        return None
    value = int.from_bytes(head[pos:pos + size], "little")
    return value + 256 if size == 2 else value


def check_blob_chunks(ds, path, file_size):
    """Before HDF5 decompresses a chunk of a compressed blob: every stored chunk must lie
    inside the file, and either be stored raw at exactly the chunk's size (HDF5 skipped
    the filter) or be a Zstandard frame stating exactly the chunk's size (what the filter
    allocates and decompresses into; it cannot write past it). Returns the number of
    stored chunks (the blob's bytes are bounded by that many chunks)."""
    chunk_bytes = int(ds.chunks[0]) * ds.dtype.itemsize
    spans = []
    try:
        if hasattr(ds.id, "chunk_iter"):
            ds.id.chunk_iter(lambda info: spans.append((info.filter_mask, info.byte_offset,
                                                        info.size)))
        else:
            for i in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(i)
                spans.append((info.filter_mask, info.byte_offset, info.size))
    except Exception as exc:
        raise TraceError(f"{path}: the compressed value bytes' chunk index is damaged "
                         f"({type(exc).__name__})") from None
    with open(path, "rb") as fh:
        for mask, offset, size in spans:
            if offset is None or offset < 0 or size <= 0 or offset + size > file_size:
                raise TraceError(f"{path}: a chunk of the value bytes lies outside the file")
            if mask & 1:
                if size != chunk_bytes:
                    raise TraceError(f"{path}: an uncompressed chunk of the value bytes has "
                                     f"{size} bytes, not {chunk_bytes}")
                continue
            fh.seek(offset)
            claimed = _frame_content_size(fh.read(min(size, 18)))
            if claimed != chunk_bytes:
                raise TraceError(f"{path}: a compressed chunk of the value bytes claims "
                                 f"{'no size' if claimed is None else f'{claimed} bytes'}, "
                                 f"not its {chunk_bytes} (damaged, or a decompression bomb)")
    return len(spans)


def need_plugin(path):
    """TraceError unless the Zstandard filter can be loaded from hdf5plugin."""
    if not plugin_available():
        raise TraceError(f"{path}: the value bytes are compressed with Zstandard "
                         f"(record --codec zstd); reading them needs {INSTALL_HINT}")
