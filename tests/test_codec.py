"""`record --codec zstd`: the value bytes compressed through hdf5plugin's Zstandard filter.

A codec trace reads back bit for bit and locates as the plain one does; a reader without
hdf5plugin refuses it in one line (exit 2); a chunk whose frame claims another size (a
decompression bomb) is refused before HDF5 decompresses it; no other filter is accepted."""

import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import tracediff
from tracediff.errors import TraceError
from tracediff.trace import codec

from .helpers import locate_json, run_cli, script_env

pytest.importorskip("hdf5plugin")

MLP = ("flax_dense.py", "--mlp", "--jit")


@pytest.fixture(scope="module")
def pair(recorded):
    """(plain, zstd): the same run recorded without and with the codec."""
    return recorded(*MLP), recorded(*MLP, options=("--codec", "zstd"))


def test_codec_trace_reads_bit_exactly_and_locates_the_same(pair):
    plain, packed = pair
    with tracediff.load(plain) as a, tracediff.load(packed) as b:
        assert (a.codec, b.codec) == ("none", "zstd")
        assert b.manifest["recording"]["codec"] == "zstd"
        with h5py.File(packed, "r", locking=False) as f:
            assert f["blob"].id.get_create_plist().get_filter(0)[0] == codec.ZSTD_FILTER
        assert len(a.values) == len(b.values) and a.blob_size == b.blob_size > 0
        same = 0
        for ra, rb in zip(a.values, b.values):
            va, vb = a.read_value(ra), b.read_value(rb)
            assert (va is None) == (vb is None)
            if va is not None:
                assert va.dtype == vb.dtype and va.shape == vb.shape
                assert va.tobytes() == vb.tobytes()
                same += 1
        assert same > 10
    both = locate_json(plain, packed)
    assert both["verdict"] == "match"
    assert locate_json(packed, packed)["verdict"] == locate_json(plain, plain)["verdict"] == "match"


def test_codec_trace_without_hdf5plugin_is_refused_in_one_line(pair):
    """hdf5plugin blocked from importing in a fresh interpreter: `info` exits 2 with one line."""
    blocked = ("import sys; sys.modules['hdf5plugin'] = None; "
               "from tracediff.cli import main; sys.argv = ['tracediff', 'info', sys.argv[1]]; main()")
    proc = subprocess.run([sys.executable, "-c", blocked, str(pair[1])], capture_output=True,
                          text=True, env=script_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "hdf5plugin" in lines[0] and "Traceback" not in proc.stderr


def _first_chunk(path):
    with h5py.File(path, "r") as f:
        ds = f["blob"]
        info = ds.id.get_chunk_info(0)
        return info.byte_offset, int(ds.chunks[0])


def test_a_chunk_that_claims_another_size_is_refused(pair, tmp_path):
    """A decompression bomb: the frame header says more than the chunk holds."""
    bomb = tmp_path / "bomb.h5"
    shutil.copyfile(pair[1], bomb)
    offset, chunk = _first_chunk(bomb)
    with open(bomb, "r+b") as fh:
        fh.seek(offset)
        head = bytearray(fh.read(18))
        desc = head[4]
        fcs_flag, single, dict_flag = desc >> 6, (desc >> 5) & 1, desc & 3
        pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
        size = (1 if single else 0, 2, 4, 8)[fcs_flag]
        assert size and codec._frame_content_size(bytes(head)) == chunk
        head[pos:pos + size] = b"\xff" * size    # the largest size the field can state
        assert codec._frame_content_size(bytes(head)) > chunk
        fh.seek(offset)
        fh.write(head)
    with pytest.raises(TraceError, match="decompression bomb"):
        tracediff.load(bomb)


def test_no_other_filter_is_accepted_on_the_value_bytes(pair, tmp_path):
    import hdf5plugin

    other = tmp_path / "blosc2.h5"
    shutil.copyfile(pair[1], other)
    with h5py.File(other, "r+") as f:
        data = f["blob"][()]
        del f["blob"]
        f.create_dataset("blob", data=data, maxshape=(None,), chunks=(1 << 20,),
                         **hdf5plugin.Blosc2(cname="lz4"))
    with pytest.raises(TraceError, match="uses filters"):
        tracediff.load(other)


def test_frame_header_sizes():
    """The four ways a Zstandard frame header states its content size (RFC 8878)."""
    magic = b"\x28\xb5\x2f\xfd"
    assert codec._frame_content_size(magic + bytes([0x20, 200])) == 200          # 1 byte
    assert codec._frame_content_size(magic + bytes([0x60]) + (4).to_bytes(2, "little")) == 260
    assert codec._frame_content_size(magic + bytes([0xA0]) + (1 << 20).to_bytes(4, "little")) \
        == 1 << 20
    assert codec._frame_content_size(magic + bytes([0xE0]) + (1 << 40).to_bytes(8, "little")) \
        == 1 << 40
    assert codec._frame_content_size(magic + bytes([0x00, 0x50])) is None        # no size stated
    assert codec._frame_content_size(b"\x00" * 18) is None
    assert np.isscalar(codec.ZSTD_LEVEL)


# -- hostile compressed traces (issue 38): built from the real recording with h5py ----------

def _copy(src, dst):
    shutil.copyfile(src, dst)
    return dst


def _zstd_frame(f, data):
    """The Zstandard frame hdf5plugin's filter writes for `data` (one chunk of a scratch
    dataset in `f`, deleted again)."""
    import hdf5plugin

    f.create_dataset("scratch", data=data, chunks=(len(data),), **hdf5plugin.Zstd(clevel=1))
    _, frame = f["scratch"].id.read_direct_chunk((0,))
    del f["scratch"]
    return bytearray(frame)


def _claim_huge(src, dst, total):
    """`src` with chunks of zeros appended (a ~20-byte frame each) up to `total` more value
    bytes, and its first stored float32 value re-pointed at them as one [total/4] array:
    a valid-looking trace whose one value is `total` bytes. Returns that value's event."""
    _copy(src, dst)
    with h5py.File(dst, "r+") as f:
        ds = f["blob"]
        c, n0 = int(ds.chunks[0]), int(f.attrs["committed_blob"])
        frame = bytes(_zstd_frame(f, np.zeros(c, np.uint8)))
        first = -(-n0 // c)
        n = first + -(-total // c)
        ds.resize((n * c,))
        for k in range(first, n):
            ds.id.write_direct_chunk((k * c,), frame)
        f.attrs["committed_blob"] = n * c
        k = int(f.attrs["committed_strings"])
        f["strings"].resize((k + 1,))
        f["strings"][k] = str(total // 4)
        f.attrs["committed_strings"] = k + 1
        v, strings = f["values"][:int(f.attrs["committed_values"])], f["strings"][:]
        i = next(i for i, r in enumerate(v) if r["offset"] >= 0 and strings[r["storage"]] == b"float32")
        v[i]["offset"], v[i]["nbytes"], v[i]["shape"] = first * c, total // 4 * 4, k
        f["values"][:len(v)] = v
        return int(v[i]["event"])


def _one_line_error(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_a_small_file_claiming_a_huge_value_is_refused_in_one_line(pair, tmp_path):
    """64 MiB of zeros in ~20-byte frames: a 0.2 MB file whose one value is 64 MiB (before:
    `show` read it, 0.4 GB resident, and printed zeros beside the real value's hash)."""
    huge = tmp_path / "huge.h5"
    ev = _claim_huge(pair[1], huge, 64 << 20)
    assert os.path.getsize(huge) < (64 << 20) // codec.MAX_RATIO
    with pytest.raises(TraceError, match="64x its compressed chunks"):
        tracediff.load(huge)
    _one_line_error(run_cli("show", huge, ev), "compressed chunks can hold")
    _one_line_error(run_cli("locate", pair[1], huge), "compressed chunks can hold")
    _one_line_error(run_cli("report", pair[1], huge, "-o", tmp_path / "r.md"),
                    "compressed chunks can hold")


def _damage(src, dst, how):
    """`src` with its first compressed chunk damaged `how`."""
    _copy(src, dst)
    with h5py.File(dst, "r+") as f:
        c = int(f["blob"].chunks[0])
        _, data = f["blob"].id.read_direct_chunk((0,))
        data = bytearray(data)
        desc = data[4]
        single = (desc >> 5) & 1
        at = 5 + (0 if single else 1)             # where a dictionary id would start
        width = (1 if single else 0, 2, 4, 8)[desc >> 6]
        if how == "cut":                          # only the frame header is left
            data = data[:at + width]
        elif how == "dictionary":                 # the dictionary flag, with a 1-byte id
            data = data[:4] + bytes([desc | 1]) + data[5:at] + b"\x07" + data[at:]
        elif how == "second frame":
            data = data + data
        elif how == "forged size":                # the frame of half the bytes, claiming all
            data = _zstd_frame(f, f["blob"][:c // 2])
            d = data[4]
            pos, w = 5 + (0 if (d >> 5) & 1 else 1), (1 if (d >> 5) & 1 else 0, 2, 4, 8)[d >> 6]
            data[pos:pos + w] = (c - 256 if w == 2 else c).to_bytes(w, "little")
        f["blob"].id.write_direct_chunk((0,), bytes(data))


@pytest.mark.parametrize("how", ["cut", "dictionary", "second frame", "forged size"])
def test_a_damaged_chunk_never_reads_as_values(pair, tmp_path, how):
    """Before: `show` printed zeros (or stale memory) beside the real value's hash, exit 0,
    and locate compared them."""
    bad = tmp_path / "bad.h5"
    _damage(pair[1], bad, how)
    with tracediff.load(pair[1]) as t:   # the last value of the first chunk (the forged
        c = t._blob.chunks[0]              # frame decompresses its first half right)
        stored = t.values[(t.values["offset"] >= 0) & (t.values["offset"] + t.values["nbytes"] <= c)]
        ev = int(stored["event"][np.argmax(stored["offset"])])
    show, loc = run_cli("show", bad, ev), run_cli("locate", pair[1], bad, "--no-explain")
    if how == "forged size":
        # the frame claims the chunk's size but holds half of it: what the filter leaves in
        # the rest is whatever its buffer held, in each process its own (locate, which
        # read the sound trace's chunk first, may find those very bytes there). A value is
        # used only where it hashes to the recorded one (then it is the value's bytes,
        # 2^-64): never zeros shown as data. Before: locate was held to show's outcome.
        if show.returncode != 2:
            assert show.stdout.replace(str(bad), "T") == run_cli(
                "show", pair[1], ev).stdout.replace(str(pair[1]), "T"), show.stdout[-2000:]
        else:
            _one_line_error(show, "damaged")
        if loc.returncode != 2:
            assert loc.stdout.startswith("MATCH"), loc.stdout[-2000:]
        else:
            _one_line_error(loc, "damaged")
        return
    _one_line_error(show, "damaged")
    _one_line_error(loc, "damaged")


def test_chunk_checks(pair):
    """Each damage is named by the whole-chunk check; the sound chunk passes."""
    with h5py.File(pair[1], "r") as f:
        c = int(f["blob"].chunks[0])
        _, data = f["blob"].id.read_direct_chunk((0,))
    assert codec.frame_problem(data, c) is None
    assert codec.frame_problem(data[:-1], c) == "is cut short"
    assert codec.frame_problem(data + data, c) == "has bytes after its frame"
    assert codec.frame_problem(data, c + 1) == f"claims {c} bytes, not its {c + 1}"


def test_a_frame_of_raw_blocks_too_short_for_its_chunk_is_refused(pair, tmp_path):
    """Incompressible bytes are stored as raw blocks, whose sizes are exact: half a chunk
    of them under a header claiming the whole chunk cannot fill it (the filter would leave
    the rest as whatever its buffer held); the check says so before any byte is read."""
    with h5py.File(pair[1], "r") as f:
        c = int(f["blob"].chunks[0])
    with h5py.File(tmp_path / "scratch.h5", "w") as f:
        half = np.random.default_rng(0).integers(0, 256, c // 2, dtype=np.uint8)
        frame = _zstd_frame(f, half)
        whole = _zstd_frame(f, np.concatenate([half, half[::-1]]))
    d = frame[4]
    pos, w = 5 + (0 if (d >> 5) & 1 else 1), (1 if (d >> 5) & 1 else 0, 2, 4, 8)[d >> 6]
    assert codec.frame_problem(frame, c // 2) is None and codec.frame_problem(whole, c) is None
    frame[pos:pos + w] = (c - 256 if w == 2 else c).to_bytes(w, "little")
    assert codec.frame_problem(frame, c) == f"holds blocks that cannot make its {c} bytes"


@pytest.fixture(scope="module")
def words_pair(recorded):
    """(plain, zstd) of one run, both hashed with words64 (`record --hash words64`)."""
    return (recorded(*MLP, options=("--hash", "words64")),
            recorded(*MLP, options=("--codec", "zstd", "--hash", "words64")))


def test_a_compressed_words64_trace_reads_and_locates(words_pair, tmp_path):
    """The reader checks a compressed trace's bytes with the trace's own hash function: a
    valid `--codec zstd --hash words64` trace is never "a damaged chunk" to show, locate,
    report or slice."""
    plain, packed = words_pair
    with tracediff.load(packed) as t:
        assert t.manifest["recording"]["hash"] == "words64" and t.codec == "zstd"
        stored = [r for r in t.values if t.read_value(r) is not None]
        assert len(stored) > 10
    assert locate_json(plain, packed)["verdict"] == "match"
    for args in (("show", packed, "3"), ("report", plain, packed, "-o", tmp_path / "r.md"),
                 ("slice", packed, "--around", "3", "-o", tmp_path / "s.h5")):
        proc = run_cli(*args)
        assert proc.returncode in (0, 1), (args, proc.stderr)
        assert "damaged" not in proc.stdout + proc.stderr


def test_a_compressed_trace_naming_an_unknown_hash_is_refused_in_one_line(words_pair,
                                                                           tmp_path):
    """Bytes whose hash function is unknown cannot be checked: refused, never read."""
    import json

    bad = tmp_path / "unknown_hash.h5"
    shutil.copyfile(words_pair[1], bad)   # not its mode: shared recordings are read-only
    with h5py.File(bad, "r+") as f:
        manifest = json.loads(f["manifest"][()])
        manifest["recording"]["hash"] = "md5"
        del f["manifest"]
        f["manifest"] = json.dumps(manifest)
    proc = run_cli("show", bad, "3")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "md5" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
