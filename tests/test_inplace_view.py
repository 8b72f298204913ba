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
