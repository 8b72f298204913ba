"""What users rely on from locate and the trace format, each written after a one-line bug
that the rest of the suite let through (the architecture review's hand mutation pass).

One real pair of small stats-level recordings (fixtures/torch_tail_difference.py): a run,
and a run with `x ** p` given p = 1.000001 (x's first 16 values are 0, so the difference
starts past the first 64 bytes), other min/max/mean-preserving values (one more NaN, a
larger L2) and OMP_NUM_THREADS set.
"""

import json
import math
import shutil

import h5py
import ml_dtypes
import numpy as np
import pytest

import tracediff
from tracediff.diff.compare import values as compare
from tracediff.diff.compare import levels
from tracediff.diff.differ import BITWISE, Differ
from tracediff.errors import TraceError
from tracediff.trace import schema

from .conftest import MAX_DIM_INDICES
from .helpers import record_many, run_cli

SCRIPT = "torch_tail_difference.py"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("contracts")
    stats = ("--level", "stats")
    record_many({
        "a": (SCRIPT, d / "a.h5", (), None, stats),
        "b": (SCRIPT, d / "b.h5", (),
              {"FIXTURE_POWER": "1.000001", "FIXTURE_STATS": "b", "OMP_NUM_THREADS": "1"}, stats),
    })
    return d / "a.h5", d / "b.h5"


def _event_at(t, op_prefix, line):
    """Index of the one event whose op starts with `op_prefix` at SCRIPT:line."""
    found = [i for i in range(len(t)) if t.event(i)["op"].startswith(op_prefix)
             and t.event(i).get("source") == f"{SCRIPT}:{line}"]
    assert len(found) == 1, [(t.event(i)["op"], t.event(i).get("source")) for i in range(len(t))]
    return found[0]


def test_difference_past_the_first_bytes_is_found_where_it_starts(pair):
    r = tracediff.locate(str(pair[0]), str(pair[1]), explain=False)
    f = r.first_difference
    assert f is not None
    assert f.a["op"] == "aten::pow.Tensor_Scalar" and f.a["source"] == f"{SCRIPT}:19"
    assert f.inputs_match is True


def test_inherited_is_judged_on_every_input(pair):
    """`w * y`: input 0 (w) is equal, input 1 (y) differs, so the difference is inherited."""
    with tracediff.load(str(pair[0])) as ta, tracediff.load(str(pair[1])) as tb:
        d = Differ(ta, tb)
        ea = _event_at(ta, "aten::mul", 21)
        eb = dict(zip(*d.pairs()))[ea]
        assert d.compare_event(ea, eb)["bitwise_equal"] is False
        match, reason, bad = d.inputs_match(ea, eb, BITWISE)
        assert match is False, reason
        assert len(bad) == 1 and bad[0]["input"] == 1 and bad[0]["producer_op"] == "aten::pow.Tensor_Scalar"


def test_stats_level_decides_on_l2_and_nan_counts(pair):
    """min, max and mean agree; only the L2 norm (spread) or the NaN count (holes) differ:
    both are beyond tolerance, decided from the statistics alone."""
    with tracediff.load(str(pair[0])) as ta, tracediff.load(str(pair[1])) as tb:
        d = Differ(ta, tb)
        pairs = dict(zip(*d.pairs()))
        for line, why in ((26, "statistics differ by at least"), (29, "NaN/Inf counts differ")):
            ea = _event_at(ta, "aten::mul", line)
            res = d.compare_event(ea, pairs[ea])
            m = res["metrics"]
            assert m["compared_by"] == "stats" and m["decided"] is True, m
            assert res["within_tolerance"] is False and why in m["note"]
            sa, sb = m["stats_a"], m["stats_b"]
            assert (sa["min"], sa["max"]) == (sb["min"], sb["max"])


def test_stats_metrics_use_every_statistic():
    """The same decision on the statistics alone (numbers as the recorder stores them)."""
    base = {"min": 0.0, "max": 4.0, "mean": 2.0, "nan": 0, "inf": 0}
    m = levels.stats_metrics({**base, "l2": math.sqrt(24)}, {**base, "l2": math.sqrt(26)},
                             "float32", "float32", "4", "4", 1e-5, 1e-8)
    assert m["decided"] and m["max_abs"] > 0.09
    m = levels.stats_metrics({**base, "l2": 5.0}, {**base, "l2": 5.0, "inf": 1},
                             "float32", "float32", "4", "4", 1e-5, 1e-8)
    assert m["decided"] and m["max_abs"] == math.inf


def test_thread_variables_are_in_the_manifest_and_the_env_diff(pair):
    r = tracediff.locate(str(pair[0]), str(pair[1]), explain=False)
    keys = {e["key"]: e for e in r.env_diff}
    assert "env.OMP_NUM_THREADS" in keys
    assert keys["env.OMP_NUM_THREADS"]["b"] == "1"


def test_reader_refuses_a_newer_schema(pair, tmp_path):
    newer = tmp_path / "newer.h5"
    shutil.copyfile(pair[0], newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["schema_version"] = schema.SCHEMA_VERSION + 1
    with pytest.raises(TraceError, match="newer than this"):
        tracediff.load(str(newer))


def test_float8_ulp_distance_counts_the_sign():
    for dt in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        a = np.array([0.5, -1.0], dtype=dt)
        b = -a
        mag = a.view(np.uint8).astype(np.int64) & 0x7F
        for x, y in ((a, b), (b, a)):
            d = compare.ulp_distance(x.view(np.uint8), y.view(np.uint8), np.dtype(dt).name)
            # opposite signs: the distance passes through zero (twice the magnitude's rank)
            assert list(d) == list(2 * mag)


def test_worst_metric_ranks_nan_above_inf_above_numbers():
    ms = [{"max_abs": 3.0, "within_tolerance": False}, {"max_abs": "inf"},
          {"max_abs": "nan"}, {"max_abs": None}]
    assert math.isnan(float(compare.worst(ms)["max_abs"]))
    assert compare.worst(ms[:2] + ms[3:])["max_abs"] == "inf"
    assert compare.worst([ms[0], ms[3]])["max_abs"] == 3.0


def test_reproduced_here_is_judged_on_every_output(recorded):
    """aten::max.dim of b returns the right values and wrong indices (tests/perturb/
    max_dim_indices): the replay reproduces a's two outputs and only b's first, so it
    reproduces a, not b (judging output 0 alone would say both)."""
    a = recorded("torch_max_dim.py")
    b = recorded("torch_max_dim.py", env=MAX_DIM_INDICES)
    result = tracediff.to_json(tracediff.locate(str(a), str(b)))
    first = result["first_difference"]
    assert first["a"]["op"] == "aten::max.dim" and first["inputs_match"] is True
    # the values are equal, the indices (output 1) are not
    assert [v["a"]["slot"] for v in first["values"] if not v["metrics"]["bitwise_equal"]] == [1]
    assert result["explain"]["reproduced_here"] == "a"
    proc = run_cli("explain", a, b, "--json")
    replay = json.loads(proc.stdout)["replay"]
    assert replay["a"]["reproduced_here"] is True and replay["b"]["reproduced_here"] is False
