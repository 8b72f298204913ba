"""The writer's durability promise checked at every instant of a real recording.

docs/format.md ("Durability"): a writer may die at any instant, so the file on disk must
be consistent after every single write: the committed counts never cover rows or bytes
that are not written yet, and the data of a commit is fsynced before the counts that make
a reader trust it. The SIGKILL tests (test_reliability) sample random instants; this one
takes the file as it is on disk after each of the writer's writes (a spy on the writer's
one write function that calls through) and opens every one of those states."""

import os
import time

import h5py
import numpy as np
import pytest

import tracediff
from tracediff.errors import TraceError
from tracediff.trace import schema, writer as W
from tracediff.trace.writer import settings, trace_file

from .helpers import check_values

EVENTS = 30
FSYNC_SECONDS = 0.05   # how long each fsync takes here (a slow disk)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """Record EVENTS events flushing every 8 rows, keeping the file's bytes after each
    write; returns the log of ("write", committed events of that state, or None while the
    file does not open yet) and ("fsync", None) in the order they happened. An fsync is
    logged when it returns (the data is on disk only then), and takes a while, as a disk
    does: the pipelined fsync runs in a thread, and a commit that did not wait for it
    would be logged before it."""
    folder = tmp_path_factory.mktemp("durability")
    states, log = [], []
    pwrite, fsync = trace_file._pwrite, os.fsync

    def spy_write(fd, view, offset):
        n = pwrite(fd, view, offset)
        states.append(os.pread(fd, os.fstat(fd).st_size, 0))
        log.append(("write", len(states) - 1))
        return n

    def spy_fsync(fd):
        out = fsync(fd)
        time.sleep(FSYNC_SECONDS)
        log.append(("fsync", None))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(settings, "FLUSH_ROWS", 8)
        mp.setattr(settings, "FSYNC", True)
        mp.setattr(trace_file, "_pwrite", spy_write)
        mp.setattr(os, "fsync", spy_fsync)
        w = W.TraceWriter(str(folder / "t.h5"), {"script": {"name": "durability"}})
        rng = np.random.default_rng(0)
        for i in range(EVENTS):
            e = w.add_event(framework=2, kind=3, op=f"op{i % 5}", source=f"s.py:{i}",
                            parent=i - 1 if i else -1)
            w.add_value(e, 0, rng.standard_normal(50).astype(np.float32))
            if i:
                w.add_input(e, 0, e - 1)
        w.close()
    assert w.flushes >= 4, "the writer no longer flushes every FLUSH_ROWS rows"
    out = []
    for kind, k in log:
        if kind == "write":
            path = folder / "state.h5"
            path.write_bytes(states[k])
            out.append(("write", _committed(path)))
        else:
            out.append((kind, None))
    return out


def _committed(path):
    """The committed event count of the file at PATH, or None when it does not open yet."""
    _counts_within_data(path)
    try:
        with tracediff.load(path) as t:
            assert (t.events["parent"][1:] == np.arange(len(t) - 1)).all()  # no hole, no repeat
            # every committed value matches its hash; the value of the event that
            # triggered a flush may come in the next commit
            assert check_values(t) >= len(t) - 1
            return len(t)
    except TraceError:
        return None


def _counts_within_data(path):
    """The writer never claims more than is on disk: each committed count is within what
    its dataset holds (the reader clamps to it, so this is read raw, with h5py)."""
    try:
        f = h5py.File(path, "r", locking=False)
    except OSError:
        return
    with f:
        for name in list(schema.TABLES) + ["blob", "strings"]:
            if f"committed_{name}" in f.attrs and name in f:
                assert int(f.attrs[f"committed_{name}"]) <= f[name].shape[0], \
                    f"committed_{name} = {int(f.attrs[f'committed_{name}'])} but {name} " \
                    f"holds {f[name].shape[0]}: counts committed before their data"


def test_every_instant_of_a_recording_is_a_readable_trace(recording):
    seen = [n for kind, n in recording if kind == "write"]
    opened = [n for n in seen if n is not None]
    # once the file is set up every state opens, and the commits only grow
    assert None not in seen[seen.index(opened[0]):], seen
    assert opened == sorted(opened) and opened[-1] == EVENTS
    assert len(set(opened)) >= 4, "too few distinct commits to say anything"


def test_data_is_fsynced_before_the_counts_that_commit_it(recording):
    synced, committed = False, 0
    for kind, n in recording:
        if kind == "fsync":
            synced = True
        elif n is not None and n > committed:
            assert synced, f"the count {n} was committed before its data was fsynced"
            committed, synced = n, False
    assert committed == EVENTS
