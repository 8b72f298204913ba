"""An in-place write through a view (`w.view(-1).mul_(...)` in one run only) is named as the
op that changed the values, never the view it wrote through (issue 51, item 4)."""

import tracediff
from tests.helpers import fixture_line, run_cli

SCRIPT = "torch_view_inplace.py"
INPLACE = {"TRACEDIFF_TEST_INPLACE": "1"}


def test_the_in_place_write_through_a_view_is_named_not_the_view(recorded):
    a, b = recorded(SCRIPT), recorded(SCRIPT, env=INPLACE)
    r = tracediff.locate(str(a), str(b))
    assert r.verdict == "diverged"
    st = r.structural
    assert st is not None and st.side == "b"
    assert st.event.op == "aten::mul_.Tensor"
    assert st.event.source.endswith(fixture_line(SCRIPT, "the write through a view"))
    assert st.event.step == 2   # after the second optimizer step
    fb = r.first_beyond_tolerance      # the transpose that reads the written weight
    assert fb.a.op == "aten::t" and f"aten::mul_.Tensor (b #{st.event.index})" in fb.note
    assert "is a view" in run_cli("locate", a, b, env={"NO_COLOR": "1"}).stdout
    proc = run_cli("explain", a, b)
    assert proc.returncode == 1
    assert "aten::mul_.Tensor" in proc.stdout


def test_explain_takes_per_rank_folders_and_names_the_rank(recorded, tmp_path):
    import json
    import shutil

    a, b = recorded(SCRIPT), recorded(SCRIPT, env=INPLACE)
    for side, src in (("run_a", a), ("run_b", b)):
        (tmp_path / side).mkdir()
        shutil.copy(src, tmp_path / side / "trace.h5")
    proc = run_cli("explain", tmp_path / "run_a", tmp_path / "run_b", env={"NO_COLOR": "1"})
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("rank 0: explaining its pair")
    assert "only in b: aten::mul_.Tensor" in proc.stdout
    doc = json.loads(run_cli("explain", tmp_path / "run_a", tmp_path / "run_b", "--json").stdout)
    assert doc["rank"] == 0 and doc["verdict"] == "diverged"
    bad = run_cli("explain", tmp_path / "run_a", tmp_path / "run_b", "--rank", "3")
    assert bad.returncode == 2 and "no rank 3" in bad.stderr and "Traceback" not in bad.stderr


def _is_view(op):
    """A reinterpretation by name, as a reader of the report sees it (not tracediff's list)."""
    base = op.split("::")[-1].split(".")[0]
    return base in ("t", "view", "transpose", "reshape", "_unsafe_view", "expand", "detach",
                    "alias", "permute", "slice", "select", "unsqueeze", "squeeze")


def test_explain_names_the_write_as_origin_and_amplifies_no_view(recorded):
    """The write only b executed is explain's origin, with no environment ("hardware") cause;
    no hop of the chain that is a view carries an amplification, none is the origin."""
    import json

    a, b = recorded(SCRIPT), recorded(SCRIPT, env=INPLACE)
    proc = run_cli("explain", a, b, env={"NO_COLOR": "1"})
    assert proc.returncode == 1, proc.stderr
    assert "origin: torch op aten::mul_.Tensor (only in b" in proc.stdout
    assert "hardware" not in proc.stdout
    assert "origin: torch op aten::t " not in proc.stdout
    doc = json.loads(run_cli("explain", a, b, "--json").stdout)
    o = doc["origin"]
    assert o["write"] is True and o["side"] == "b"
    assert o["b"]["op"] == "aten::mul_.Tensor"
    assert o["b"]["source"].endswith(fixture_line(SCRIPT, "the write through a view"))
    assert doc["environment"]["causes"] == []
    views = [h for h in doc["chain"] if _is_view(h["a"]["op"])]
    assert views                                  # aten::t reads the written weight
    for h in views:
        assert h["amplification"] is None and "origin" not in h["role"].split(","), h
    assert "amplified" not in doc["summary"] or not any(
        f"{h['a']['op']} (a #{h['a']['index']}) amplified" in doc["summary"] for h in views)


def test_a_view_is_never_the_origin(recorded):
    """A write no op records (through numpy): the values first differ at the view that reads
    them next (`aten::t`, its input bitwise equal). explain names no view as the origin and
    blames no hardware: the bytes were changed before the view."""
    import json

    a, b = recorded(SCRIPT), recorded(SCRIPT, env={"TRACEDIFF_TEST_NUMPY_WRITE": "1"})
    r = tracediff.locate(str(a), str(b))
    assert r.verdict == "diverged" and r.first_difference.a.op == "aten::t"   # the construction
    proc = run_cli("explain", a, b, env={"NO_COLOR": "1"})
    assert proc.returncode == 1, proc.stderr
    assert "origin:" not in proc.stdout and "hardware" not in proc.stdout
    assert "aten::t (a #" in proc.stdout and "a view that only reinterprets" in proc.stdout
    doc = json.loads(run_cli("explain", a, b, "--json").stdout)
    assert doc["verdict"] == "diverged" and doc["origin"] is None
