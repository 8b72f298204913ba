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
