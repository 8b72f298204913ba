"""The trace writer's value bytes: values copied as they come and buffers held without a
copy (`TraceWriter.keep_joined`: a device's joined values, maybe still on their way to the
host) land in the blob in their order, byte for byte, whatever chunk boundaries they
straddle, with or without a codec; a held buffer still to be read is read when its flush
writes it, not before."""

import os
import threading
import time

import h5py
import numpy as np
import pytest

from tracediff.trace import codec as codecs, writer as W
from tracediff.trace.writer import settings, trace_file


class _Later:
    """A buffer read when the writer asks (as a device copy is): counts the reads."""

    def __init__(self, data):
        self.data, self.nbytes, self.reads = data, data.nbytes, 0

    def __call__(self):
        self.reads += 1
        return self.data


@pytest.mark.parametrize("codec", [c for c in codecs.CODECS
                                   if c == "none" or codecs.plugin_available()])
def test_copied_and_held_bytes_land_in_order_across_chunks(tmp_path, codec, monkeypatch):
    monkeypatch.setattr(settings, "FIRST_FLUSH_BYTES", 64 << 20)   # one flush, at the end
    rng = np.random.default_rng(0)
    chunk = settings.CHUNK_BYTES
    # sizes around the chunk boundaries: inside one chunk, exactly one, straddling two,
    # several whole chunks, and small values between them
    sizes = [10, chunk - 10, 3, 2 * chunk + 5, 7, chunk, 1, 3 * chunk - 1, 100, chunk // 2]
    w = W.TraceWriter(str(tmp_path / "t.h5"), {}, codec=codec)
    e = w.add_event(framework=2, kind=3, op="op", source="s.py:1")
    expected, offsets, later = [], [], []
    for i, n in enumerate(sizes):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        if i % 3 == 0:            # copied, as a host value is
            w.add_value(e, i, data)
            offsets.append(None)
        elif i % 3 == 1:          # held as it is
            offsets.append(w.keep_joined(data))
        else:                     # held, read at the flush
            later.append(_Later(data))
            offsets.append(w.keep_joined(later[-1]))
        expected.append(data.tobytes())
    assert all(x.reads == 0 for x in later)   # nothing read while rows were written
    w.flush()
    assert all(x.reads == 1 for x in later)
    w.close()
    with h5py.File(tmp_path / "t.h5", "r") as f:
        blob = f["blob"][:int(f.attrs["committed_blob"])].tobytes()
        rows = f["values"][:]
    assert blob == b"".join(expected)
    starts = np.cumsum([0] + [len(b) for b in expected])[:-1]
    held = [(at, int(s)) for at, s in zip(offsets, starts) if at is not None]
    assert all(at == s for at, s in held)
    assert [int(r["offset"]) for r in rows] == [int(s) for s, at in zip(starts, offsets)
                                                if at is None]


def test_a_held_buffer_that_changed_size_stops_the_recording_cleanly(tmp_path):
    """A held buffer read back another size than it claimed never writes a wrong blob:
    the flush fails, the recording stops with the reason, and the last commit stays."""
    w = W.TraceWriter(str(tmp_path / "t.h5"), {})
    e = w.add_event(framework=2, kind=3, op="op", source="s.py:1")
    w.add_value(e, 0, np.arange(4, dtype=np.float32))
    w.flush()
    wrong = _Later(np.zeros(8, np.uint8))
    wrong.nbytes = 16
    w.keep_joined(wrong)
    w.flush()
    assert w.error and "changed size" in w.error


def test_a_held_buffer_is_read_only_once_the_bytes_before_it_are_written(tmp_path, monkeypatch):
    """A device's copy of a flush's last values goes on while the bytes before them are
    written: each held buffer is read when the writing reaches it. Before: every held
    buffer was read (each waiting for its copy) before the flush wrote its first byte."""
    monkeypatch.setattr(settings, "FIRST_FLUSH_BYTES", 64 << 20)   # one flush, at the end
    log = []
    pwrite = trace_file._pwrite

    def spy(fd, view, offset):
        log.append(("write", len(view)))
        return pwrite(fd, view, offset)

    class _Logged(_Later):
        def __call__(self):
            log.append(("read", self.name))
            return super().__call__()

    monkeypatch.setattr(trace_file, "_pwrite", spy)
    size = 3 * settings.CHUNK_BYTES
    rng = np.random.default_rng(1)
    w = W.TraceWriter(str(tmp_path / "t.h5"), {})
    e = w.add_event(framework=2, kind=3, op="op", source="s.py:1")
    w.add_value(e, 0, rng.integers(0, 256, size, dtype=np.uint8))
    for name in "ab":
        held = _Logged(rng.integers(0, 256, size, dtype=np.uint8))
        held.name = name
        w.keep_joined(held)
    log.clear()
    w.flush()
    w.close()
    written = {}
    total = 0
    for kind, what in log:
        if kind == "write":
            total += what
        else:
            written[what] = total
    # all but the chunk a buffer shares with the bytes before it is on its way to disk
    assert written["a"] >= size - settings.CHUNK_BYTES, written
    assert written["b"] >= 2 * size - settings.CHUNK_BYTES, written


def test_chunks_written_behind_land_byte_for_byte_while_the_program_writes_on(tmp_path,
                                                                              monkeypatch):
    """A pipelined flush leaves its whole chunks to the thread that fsyncs it (write-behind,
    `TraceFile.behind`) and returns; the program copies its next values meanwhile. Here
    that thread is slow (each write waits 20 ms), so the values copied during it would
    overwrite chunks not yet written if they went into the same buffer. Every byte lands,
    in order, and the whole chunks were written by that thread, not the program's, at most
    `WRITEBACK_BYTES` a call, the disk started on each as it was written."""
    monkeypatch.setattr(settings, "WRITE_BEHIND", True)
    monkeypatch.setattr(settings, "FLUSH_BYTES", 4 << 20)
    monkeypatch.setattr(settings, "WRITEBACK_BYTES", 2 * settings.CHUNK_BYTES)
    monkeypatch.setattr(settings, "EARLY_WRITEBACK", True)
    writers, written, started = [], [], []
    pwritev = trace_file._pwritev

    def slow(fd, views, offset):
        writers.append(threading.current_thread() is threading.main_thread())
        time.sleep(0.02)
        n = pwritev(fd, views, offset)
        written.append((offset, n))
        return n

    advise = getattr(os, "posix_fadvise", None)

    def seen(fd, offset, length, how):
        if threading.current_thread() is not threading.main_thread() and length:
            started.append((offset, length))
        return advise(fd, offset, length, how)

    monkeypatch.setattr(trace_file, "_pwritev", slow)
    if advise is not None:   # Linux; elsewhere the disk starts at the fsync
        monkeypatch.setattr(os, "posix_fadvise", seen)
    rng = np.random.default_rng(2)
    w = W.TraceWriter(str(tmp_path / "t.h5"), {})
    e = w.add_event(framework=2, kind=3, op="op", source="s.py:1")
    expected = []
    for i in range(40):
        n = int(rng.integers(1, 3 * settings.CHUNK_BYTES // 2))
        data = rng.integers(0, 256, n, dtype=np.uint8)
        if i % 4 == 3:
            w.keep_joined(data)          # held as it is
        else:
            w.add_value(e, i, data)      # copied into the writer's buffer
        expected.append(data.tobytes())
    w.close()
    assert writers and not any(writers), writers
    assert w.flushes >= 5
    with h5py.File(tmp_path / "t.h5", "r") as f:
        blob = f["blob"][:int(f.attrs["committed_blob"])].tobytes()
    assert blob == b"".join(expected)
    assert max(n for _, n in written) == 2 * settings.CHUNK_BYTES, written   # adjacent: one call
    assert started == (written if advise is not None else [])


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise (not Linux)")
def test_the_disk_starts_on_whole_chunks_as_the_program_writes_them(tmp_path, monkeypatch):
    """Written in the program's thread, each whole chunk is handed to the disk as it is
    written (`EARLY_WRITEBACK`), not left to the fsync at the end of the flush: the
    chunks' ranges are the ones started."""
    monkeypatch.setattr(settings, "WRITE_BEHIND", False)
    monkeypatch.setattr(settings, "EARLY_WRITEBACK", True)
    advise, started = os.posix_fadvise, []

    def seen(fd, offset, length, how):
        if length:
            started.append((offset, length))
        return advise(fd, offset, length, how)

    monkeypatch.setattr(os, "posix_fadvise", seen)
    w = W.TraceWriter(str(tmp_path / "t.h5"), {})
    w.keep_joined(np.random.default_rng(3).integers(0, 256, 5 * settings.CHUNK_BYTES,
                                                    dtype=np.uint8))
    w.close()
    whole = [s for s in started if s[1] == settings.CHUNK_BYTES]
    assert len(whole) >= 4, started
    assert len({at for at, _ in whole}) == len(whole)


@pytest.mark.parametrize("how", ["close", "closerange", "dup2"])
def test_closing_the_traces_descriptor_waits_for_the_chunks_written_behind(tmp_path, monkeypatch,
                                                                           how):
    """With write-behind, the script's `os.close`, `os.closerange` or `os.dup2` of the trace's
    descriptor number comes while the fsync thread is writing a chunk (checked as the
    trace's, not yet written). It waits for that write: the chunk lands in the trace, not in
    a file of the script's that got the number (dup2), and is no write error (close: EBADF);
    the trace is reopened by path and every byte is there."""
    monkeypatch.setattr(settings, "WRITE_BEHIND", True)
    monkeypatch.setattr(settings, "FLUSH_BYTES", 4 << 20)
    in_write, pwritev = threading.Event(), trace_file._pwritev

    def slow(fd, views, offset):    # the thread, past its check, in the middle of a write
        if threading.current_thread() is not threading.main_thread() and not in_write.is_set():
            in_write.set()
            time.sleep(0.3)
        return pwritev(fd, views, offset)

    monkeypatch.setattr(trace_file, "_pwritev", slow)
    own = tmp_path / "own.txt"
    rng = np.random.default_rng(5)
    w = W.TraceWriter(str(tmp_path / "t.h5"), {})
    e = w.add_event(framework=2, kind=3, op="op", source="s.py:1")
    expected, closed = [], False
    for i in range(24):
        data = rng.integers(0, 256, int(rng.integers(1, 2 * settings.CHUNK_BYTES)), dtype=np.uint8)
        w.add_value(e, i, data)
        expected.append(data.tobytes())
        if not closed and in_write.wait(0.05 if i < 23 else 0):
            closed = True
            fd = w._file.fd
            if how == "dup2":
                mine = os.open(own, os.O_RDWR | os.O_CREAT)
                os.dup2(mine, fd)
                os.close(mine)
            elif how == "close":
                os.close(fd)
            else:
                os.closerange(fd, fd + 1)
    w.close()
    assert closed, "no chunk was written behind"
    assert w.error is None and w.reopened == 1, (w.error, w.reopened)
    with h5py.File(tmp_path / "t.h5", "r") as f:
        blob = f["blob"][:int(f.attrs["committed_blob"])].tobytes()
    assert blob == b"".join(expected)
    if how == "dup2":
        assert own.read_bytes() == b""
        os.close(fd)
