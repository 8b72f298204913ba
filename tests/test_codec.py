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

from .helpers import ROOT, locate_json

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
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
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
    os.chmod(bomb, 0o644)
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
    os.chmod(other, 0o644)
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
