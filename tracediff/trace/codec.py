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
filter allocates and decompresses into must be exactly the chunk's size, and the value
bytes claimed at most `MAX_RATIO` times the compressed bytes stored (a small file cannot
ask for gigabytes). hdf5plugin's filter does not check that a frame decompressed: a damaged
one reads as zeros. So a chunk is checked whole before its bytes are used (`ChunkCheck`:
one frame, no dictionary, blocks that fill the chunk and end where the chunk does), and the
reader compares each value's bytes with its recorded hash (`Trace`, `ValueReader`).
"""

from ..errors import TraceError

CODECS = ("none", "zstd")
ZSTD_FILTER = 32015          # registered HDF5 filter id of Zstandard (hdf5plugin.ZSTD_ID)
ZSTD_LEVEL = 1               # fastest level: the recording is disk-bound, not size-bound
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
INSTALL_HINT = "pip install hdf5plugin (or tracediff-ml[codec])"
# The most value bytes a compressed trace may claim per byte of its stored chunks. Level 1
# stores float values at ~91 % (docs/performance.md); only a trace of almost nothing but
# repeated bytes comes near 64:1 (docs/format.md), and reading never allocates more than
# 64x the file for one value.
MAX_RATIO = 64
_MAX_BLOCK = 128 << 10       # a block decompresses to at most 128 KiB (RFC 8878, 3.1.1.2.3)


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


def _frame_header(head):
    """(content size, header length, dictionary flag, checksum flag) of a Zstandard frame
    header (RFC 8878, 3.1.1), or None when `head` is not one or states no size."""
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
    return value + 256 if size == 2 else value, pos + size, dict_flag, (desc >> 2) & 1


def _frame_content_size(head):
    """Decompressed size a Zstandard frame header states, or None (see `_frame_header`)."""
    h = _frame_header(head)
    return None if h is None else h[0]


def frame_problem(data, chunk_bytes):
    """Why the stored chunk `data` cannot decompress to exactly `chunk_bytes` bytes (one
    line), or None: one frame stating that size, no dictionary, well-formed blocks that can
    fill it (raw and RLE blocks' sizes exact, compressed ones at most 128 KiB each) and end,
    with the checksum if flagged, exactly where the chunk does. Cut short, a second frame,
    a dictionary or a forged size are refused here; the values' hashes catch the rest."""
    h = _frame_header(bytes(data[:18]))
    if h is None:
        return "is not a Zstandard frame stating its size"
    size, pos, dict_flag, checksum = h
    if dict_flag:
        return "needs a dictionary"
    if size != chunk_bytes:
        return f"claims {size} bytes, not its {chunk_bytes}"
    exact = bound = 0
    while True:
        if pos + 3 > len(data):
            return "is cut short"
        b = int.from_bytes(data[pos:pos + 3], "little")
        last, kind, n = b & 1, (b >> 1) & 3, b >> 3
        pos += 3
        if kind == 3 or n > _MAX_BLOCK:
            return "has a damaged block"
        stored = (n, 1, n)[kind]
        if pos + stored > len(data):
            return "is cut short"
        pos += stored
        if kind == 2:
            bound += _MAX_BLOCK
        else:
            exact += n
        if last:
            break
    pos += 4 if checksum else 0
    if pos != len(data):
        return "is cut short" if pos > len(data) else "has bytes after its frame"
    if exact > chunk_bytes or exact + bound < chunk_bytes:
        return f"holds blocks that cannot make its {chunk_bytes} bytes"
    return None


def check_blob_chunks(ds, path, file_size):
    """Before HDF5 decompresses a chunk of a compressed blob: every stored chunk must lie
    inside the file, and either be stored raw at exactly the chunk's size (HDF5 skipped
    the filter) or be a Zstandard frame stating exactly the chunk's size (what the filter
    allocates and decompresses into; it cannot write past it). Returns the number of
    stored chunks and the bytes they occupy in the file (the blob's bytes are bounded by
    that many chunks, and by `MAX_RATIO` times those bytes)."""
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
            head = _frame_header(fh.read(min(size, 18)))
            claimed = None if head is None else head[0]
            if claimed != chunk_bytes:
                raise TraceError(f"{path}: a compressed chunk of the value bytes claims "
                                 f"{'no size' if claimed is None else f'{claimed} bytes'}, "
                                 f"not its {chunk_bytes} (damaged, or a decompression bomb)")
            if head[2]:
                raise TraceError(f"{path}: a compressed chunk of the value bytes needs a "
                                 f"dictionary (damaged)")
    return len(spans), sum(size for _, _, size in spans)


class ChunkCheck:
    """Each stored chunk of a compressed blob checked whole (`frame_problem`) the first time
    bytes inside it are used; a span that reaches an unstored chunk (HDF5 would read its
    fill value, zeros) is refused."""

    def __init__(self, ds, path):
        self.ds, self.path = ds, path
        self.chunk_bytes = int(ds.chunks[0])
        self.done = set()

    def span(self, off, n):
        """TraceError unless every chunk holding bytes [off, off+n) is stored and sound."""
        if n <= 0:
            return
        c = self.chunk_bytes
        for k in range(off // c, (off + n - 1) // c + 1):
            if k in self.done:
                continue
            try:
                mask, data = self.ds.id.read_direct_chunk((k * c,))
            except Exception:
                raise TraceError(f"{self.path}: value bytes at {k * c} lie in a chunk that was "
                                 f"never stored (damaged)") from None
            if mask & 1:
                why = None if len(data) == c else f"is stored raw with {len(data)} bytes"
            else:
                why = frame_problem(memoryview(data), c)
            if why:
                raise TraceError(f"{self.path}: the compressed chunk at byte {k * c} of the "
                                 f"value bytes {why} (damaged)")
            self.done.add(k)


def need_plugin(path):
    """TraceError unless the Zstandard filter can be loaded from hdf5plugin."""
    if not plugin_available():
        raise TraceError(f"{path}: the value bytes are compressed with Zstandard "
                         f"(record --codec zstd); reading them needs {INSTALL_HINT}")
