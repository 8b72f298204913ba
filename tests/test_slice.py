"""`tracediff slice`: a trace cut down to one event and its dataflow neighbours is small
and gives the same answer as the whole trace to locate, explain and repro."""

import os

import pytest

import tracediff
from tracediff.trace import schema

from .conftest import BROKEN_DOT
from .helpers import explain_json, locate_json, run_cli


def _slice(path, event, out, *extra):
    proc = run_cli("slice", path, "--around", event, "-o", out, *extra)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def dot_pair(recorded):
    return recorded("torch_dot.py"), recorded("torch_dot.py", env=BROKEN_DOT)


def test_slices_locate_and_explain_like_the_whole_traces(dot_pair, tmp_path):
    a, b = dot_pair
    whole = locate_json(a, b)
    first = whole["first_difference"]
    ia, ib = first["a"]["index"], first["b"]["index"]
    sa = _slice(a, ia, tmp_path / "a.small.h5")
    sb = _slice(b, ib, tmp_path / "b.small.h5")
    cut = locate_json(sa, sb)
    f = cut["first_difference"]
    for key in ("op", "source", "name_stack", "step", "phase"):
        assert f["a"][key] == first["a"][key], key
    assert f["inputs_match"] is True and cut["verdict"] == whole["verdict"] == "diverged"
    assert [v["metrics"] for v in f["values"]] == [v["metrics"] for v in first["values"]]
    assert cut["explain"]["reproduced_here"] == "a"
    an = explain_json(sa, sb)
    assert an["origin"]["a"]["op"] == "aten::dot" and an["replay"]["reproduces"] == "a"
    # the slice says what it is, and is an ordinary trace
    with tracediff.load(sa) as t:
        info = t.manifest["slice"]
        assert info["around"] == ia and info["of_events"] > info["events"] == len(t)
        assert t.event(info["around_new"])["op"] == "aten::dot"
        producers = {int(r["producer"]) for r in t.input_rows(info["around_new"])}
        assert producers and all(0 <= p < len(t) for p in producers)
        assert t.source_lines(first["a"]["source"]) is not None
    proc = run_cli("repro", sb, info["around_new"], "-o", tmp_path / "repro")
    assert proc.returncode == 0, proc.stderr
    assert "Slice" not in proc.stderr and (tmp_path / "repro" / "repro.py").exists()


def test_a_jax_slice_keeps_the_compiled_call_around_the_equation(jax_gru, tmp_path):
    (a, _), (b, _) = jax_gru["a"], jax_gru["tanh"]
    first = locate_json(a, b, "--rtol", "0", "--atol", "0")["first_difference"]
    ia, ib = first["a"]["index"], first["b"]["index"]
    sa = _slice(a, ia, tmp_path / "a.h5")
    sb = _slice(b, ib, tmp_path / "b.h5")
    assert os.path.getsize(sa) < os.path.getsize(a) / 5
    f = locate_json(sa, sb, "--rtol", "0", "--atol", "0")["first_difference"]
    assert (f["a"]["op"], f["a"]["source"], f["inputs_match"]) == \
        (first["a"]["op"], first["a"]["source"], True)
    assert f["call"] is not None and f["call"]["op"] == first["call"]["op"]
    with tracediff.load(sa) as t:
        e = t.events[t.manifest["slice"]["around_new"]]
        assert int(e["kind"]) == schema.KIND_EQN and 0 <= int(e["call"]) < len(t)


def test_hops_zero_keeps_the_event_and_leaves_its_inputs_unknown(dot_pair, tmp_path):
    a, _ = dot_pair
    with tracediff.load(a) as t:
        dot = next(i for i in range(len(t)) if t.event(i)["op"] == "aten::dot")
    out = _slice(a, dot, tmp_path / "zero.h5", "--hops", "0")
    with tracediff.load(out) as t:
        assert [t.event(i)["op"] for i in range(len(t))] == ["aten::dot"]
        assert {int(r["producer"]) for r in t.input_rows(0)} == {schema.PRODUCER_UNKNOWN}
        assert t.outputs(0)[0] is not None


def test_bad_slice_requests_are_one_line_exit_2(dot_pair, tmp_path):
    a, _ = dot_pair
    for args, message in (((a, "--around", "9999", "-o", tmp_path / "x.h5"), "no event 9999"),
                          ((a, "--around", "1", "-o", tmp_path / "no" / "x.h5"), "does not exist"),
                          ((a, "--around", "1", "-o", a), "exists"),
                          ((a, "--around", "1", "--hops", "-1", "-o", tmp_path / "y.h5"), "hops"),
                          ((tmp_path / "missing.h5", "--around", "1", "-o", tmp_path / "z.h5"),
                           "missing.h5")):
        proc = run_cli("slice", *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    out = _slice(a, 1, tmp_path / "again.h5")
    proc = run_cli("slice", a, "--around", "1", "-o", out)
    assert proc.returncode == 2 and "--force" in proc.stderr
    _slice(a, 2, out, "--force")
    with tracediff.load(out) as t:
        assert t.manifest["slice"]["around"] == 2


def test_a_huge_hops_ends_when_a_hop_adds_no_event(dot_pair, tmp_path):
    """`--hops 1000000000` on a 10-event trace ran a billion rounds (it did not stop when
    a hop added nothing); now it ends, with the slice of every hop that adds an event.
    In a process of its own under a generous timeout: the old code never ended."""
    import subprocess
    import sys

    from .helpers import script_env

    a, _ = dot_pair
    with tracediff.load(a) as t:
        dot = next(i for i in range(len(t)) if t.event(i)["op"] == "aten::dot")
        n = len(t)
    huge, enough = tmp_path / "huge.h5", tmp_path / "enough.h5"
    proc = subprocess.run([sys.executable, "-m", "tracediff", "slice", str(a), "--around",
                           str(dot), "--hops", "1000000000", "-o", str(huge)],
                          env=script_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _slice(a, dot, enough, "--hops", str(n))
    with tracediff.load(huge) as h, tracediff.load(enough) as e:
        assert h.manifest["slice"]["hops"] == 1000000000
        assert [h.event(i)["op"] for i in range(len(h))] == [e.event(i)["op"] for i in range(len(e))]
        assert 1 < len(h) <= n
