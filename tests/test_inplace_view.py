"""An in-place write through a view (`w.view(-1).mul_(...)` in one run only) is named as the
op that changed the values, never the view it wrote through (issue 51, item 4)."""

import pytest

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


DTENSOR = """
import os, sys
import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
mesh = init_device_mesh("cpu", (1,))
w = torch.nn.Parameter(distribute_tensor(torch.randn(4, 8), mesh, [Shard(0)]))
opt = torch.optim.Adam([w], lr=1e-2)
x = torch.randn(3, 8)
for step in range(2):
    loss = (w.full_tensor() @ x.t()).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 0 and "--bad" in sys.argv:
        with torch.no_grad():
            w.to_local().mul_(1.001)   # the write through the local view
print(float(loss))
dist.destroy_process_group()
"""


@pytest.mark.deep   # CI's 'deep' stage: its own recordings
def test_a_dtensor_parameter_read_after_a_write_to_its_shard_reads_the_write(tmp_path):
    """`p.to_local().mul_` on a DTensor parameter: the ops that read the parameter next
    (Adam's `addcdiv_` on the DTensor and its local op) read what the write left, so no op after it is
    blamed for adding a difference of its own (before: its input was the value before
    the write, and explain's sources named `addcdiv_` "implementation on b")."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT, require_loopback, script_env

    require_loopback()
    script = tmp_path / "dtensor_mul.py"
    script.write_text(DTENSOR)
    traces = {}
    for i, name in enumerate(("a", "b")):
        traces[name] = tmp_path / f"{name}.h5"
        proc = subprocess.run(
            [sys.executable, "-m", "tracediff", "record", "-o", str(traces[name]), str(script),
             *(["--bad"] if name == "b" else [])], cwd=ROOT, text=True, capture_output=True,
            timeout=300, env=script_env({"PORT": str(31000 + 2 * (os.getpid() % 500) + i),
                                         "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}))
        assert proc.returncode == 0, proc.stderr[-3000:]
    with tracediff.load(traces["b"]) as t:
        ops = [t.event(i)["op"] for i in range(len(t))]
        line = next(n for n, text in enumerate(DTENSOR.splitlines(), 1) if "local view" in text)
        write = next(i for i in range(len(ops)) if ops[i] == "aten::mul_.Tensor" and
                     t.event(i)["source"].endswith(f"dtensor_mul.py:{line}"))
        after = [i for i in range(write, len(ops)) if ops[i] == "aten::addcdiv_"]
        assert after   # Adam's step 1 writes the parameter
        ins = t.inputs
        # the parameter is the first input of each (the DTensor op and its local op)
        read = [int(ins[ins["event"] == i][0]["producer"]) for i in after]
        assert read == [write] * len(after), [(i, ops[i]) for i in read]
    proc = run_cli("explain", traces["a"], traces["b"], "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["origin"]["write"] is True and doc["origin"]["b"]["op"] == "aten::mul_.Tensor"
    blamed = [op for src in doc["sources"]["sources"] for op, _ in src["ops"]]
    assert "aten::addcdiv_" not in blamed, doc["sources"]["sources"]
