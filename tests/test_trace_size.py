"""Small scripts give small traces: a finished trace is rewritten without the unused tails
of its chunks (writer/closing.py `_compact`), and reads back exactly as the chunked file would."""

import os

import numpy as np
import pytest

import tracediff
from tracediff.trace import writer as W
from tracediff.trace.writer import settings


def _write(path, compact_below):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(settings, "COMPACT_BELOW", compact_below)
        w = W.TraceWriter(str(path), {"script": {"name": "size"}})
        rng = np.random.default_rng(1)
        for i in range(20):
            e = w.add_event(framework=2, kind=3, op=f"op{i % 3}", source=f"s.py:{i}",
                            parent=i - 1 if i else -1)
            w.add_value(e, 0, rng.standard_normal((3, i + 1)).astype(np.float32))
            if i:
                w.add_input(e, 0, e - 1)
        w.close()
    return w


def test_a_small_recording_is_small(recorded):
    path = recorded("torch_dot.py")
    assert os.path.getsize(path) <= 100_000, os.path.getsize(path)
    with tracediff.load(path) as t:
        assert t.complete and len(t) >= 5
        assert t.read_value(t.values[0]) is not None


def test_compacted_trace_reads_exactly_as_the_chunked_one(tmp_path):
    chunked = _write(tmp_path / "chunked.h5", compact_below=0)
    compact = _write(tmp_path / "compact.h5", compact_below=settings.COMPACT_BELOW)
    assert not chunked.compacted and compact.compacted
    assert os.path.getsize(tmp_path / "compact.h5") < os.path.getsize(tmp_path / "chunked.h5") / 10
    assert not list(tmp_path.glob("*.tmp*")), "the temporary file stayed behind"
    with tracediff.load(tmp_path / "chunked.h5") as a, tracediff.load(tmp_path / "compact.h5") as b:
        assert a.complete and b.complete and len(a) == len(b) == 20
        assert a.manifest == b.manifest
        for name in ("events", "values", "inputs", "stats_rows"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        for ra, rb in zip(a.values, b.values):
            assert np.array_equal(a.read_value(ra), b.read_value(rb))
        assert [a.string(i) for i in a.events["op"]] == [b.string(i) for i in b.events["op"]]
    result = tracediff.locate(tmp_path / "chunked.h5", tmp_path / "compact.h5")
    assert result.verdict == "match" and result.alignment["matched"] == 20
