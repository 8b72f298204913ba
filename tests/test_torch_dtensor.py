"""DTensor capture on one rank, in the default suite (issue 53): FSDP2 shards recorded as
the rank's local shard plus a `placements` row (capture/torch/subclass.py), without
torchrun. fixtures/torch_dtensor_one_rank.py runs gloo with world size 1 through a file
store (no TCP port), a 1-device mesh, `fully_shard` on a small MLP, two Adam steps and an
explicit functional all-gather (a result pending until its `wait_tensor`).

Truth: what the fixture prints after each step, independently of tracediff: every
parameter's qualified name, global shape, the shard's offset and its local values, and
the all-gathered values' sum. The field suite covers 2 ranks under torchrun
(tests/field/test_sharded_torch.py)."""

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.fsdp")
if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("torch built without gloo: no process group on the CPU", allow_module_level=True)

from tests.helpers import run_cli  # noqa: E402
from tracediff.trace import schema  # noqa: E402
from tracediff.trace.reader import Trace  # noqa: E402

# CI's 'deep' stage (pytest -m deep): several recordings, each against its truth
pytestmark = pytest.mark.deep

SCRIPT = "torch_dtensor_one_rank.py"
_PARAM = re.compile(r"^step (\d+) param (\S+) shape ([\d,]+) offset ([\d,]+) values (.*)$", re.M)
_GATHERED = re.compile(r"^step (\d+) gathered (\S+)$", re.M)


@pytest.fixture(scope="module")
def runs(recorded):
    """Two recordings of the fixture ({"a", "b"}: path) and its plain output."""
    paths = recorded.many({"a": (SCRIPT, (), None), "b": (SCRIPT, (), None, (), "again")})
    return paths, recorded.proc(paths["a"]), recorded.plain(SCRIPT)


@pytest.fixture(scope="module")
def trace(runs):
    with Trace(runs[0]["a"]) as t:
        yield t


def _truth(stdout):
    """{(step, name): (global shape, offset, values)} as the fixture printed them."""
    out = {}
    for step, name, shape, offset, vals in _PARAM.findall(stdout):
        dims = tuple(int(d) for d in shape.split(","))
        out[int(step), name] = (shape, offset, np.array(vals.split(), np.float32).reshape(dims))
    assert out, stdout[-2000:]
    return out


def _snapshots(t):
    """The optimizer-step snapshot events, in order (one per step)."""
    return [i for i in range(len(t)) if int(t.events[i]["kind"]) == schema.KIND_OPTIM]


def _named(t, eid):
    """{value name: values row} of an event."""
    return {t.string(r["name"]): r for r in t.value_rows(eid) if r["name"] >= 0}


def _events(t, op):
    return [i for i in range(len(t)) if t.string(t.events[i]["op"]) == op]


def test_recorded_in_full_and_the_run_unchanged(runs, trace):
    _, proc, plain = runs
    assert proc.stdout == plain.stdout
    assert "WARNING" not in proc.stderr, proc.stderr
    fw = trace.manifest["frameworks"]["torch"]
    assert "recording_error" not in fw, fw["recording_error"]
    assert fw["subclasses"]["unreadable_values"] == 0
    assert fw["subclasses"]["dtensor_values"] > 0 and fw["optimizer_steps"] == 2


def test_each_shard_is_stored_as_its_bytes(runs, trace):
    """The snapshot's parameters are the local shards' bytes, equal to what the rank held."""
    truth = _truth(runs[2].stdout)
    snaps = _snapshots(trace)
    assert len(snaps) == 2
    for step, eid in enumerate(snaps):
        named = _named(trace, eid)
        for (s, name), (_, _, want) in truth.items():
            if s != step:
                continue
            row = named[f"params/{name}"]
            assert not row["flags"] & (schema.VFLAG_NOT_STORED | schema.VFLAG_UNINIT), name
            got = trace.read_value(row)
            assert got is not None and got.dtype == np.float32, name
            np.testing.assert_array_equal(got, want, err_msg=f"step {step} {name}")
    # every value placed by a placements row is a local shard whose bytes are stored
    placed = trace.placement_rows
    assert len(placed) > 0
    for p in placed:
        rows = trace.value_rows(int(p["event"]), role=int(p["role"]))
        row = rows[rows["slot"] == p["slot"]][0]
        assert trace.read_value(row) is not None, trace.event(int(p["event"]))["op"]


def test_placements_give_global_shape_and_offset(runs, trace):
    """Each parameter's placements row: Shard(0) on the 1-device mesh at coordinate 0, its
    global shape and the shard's offset as the program computed them, each in its field."""
    truth = _truth(runs[2].stdout)
    for step, eid in enumerate(_snapshots(trace)):
        named = _named(trace, eid)
        for (s, name), (shape, offset, _) in truth.items():
            if s != step:
                continue
            pl = trace.placement(eid, int(named[f"params/{name}"]["slot"]))
            assert pl is not None, name
            assert (pl["placements"], pl["mesh"], pl["coord"]) == ("S(0)", "1", "0"), pl
            assert pl["global_shape"] == shape, (name, pl)
            assert pl["offset"] == offset, (name, pl)


def test_snapshot_placements_name_the_parameter(runs, trace):
    """A snapshot's parameter, gradient and optimizer state rows name the parameter they
    belong to (a locate report says which parameter's shard departed)."""
    names = {name for _, name in _truth(runs[2].stdout)}
    assert names == {"0.weight", "0.bias", "2.weight", "2.bias"}
    for eid in _snapshots(trace):
        seen = set()
        for value_name, row in _named(trace, eid).items():
            kind, _, rest = value_name.partition("/")
            pl = trace.placement(eid, int(row["slot"]))
            if pl is None:
                continue
            if kind in ("params", "grads"):
                assert pl["param"] == rest, (value_name, pl)
            else:       # state/NAME/exp_avg
                assert kind == "state" and pl["param"] is not None, (value_name, pl)
                assert pl["param"].split("/")[0] == rest.split("/")[0], (value_name, pl)
            seen.add(pl["param"].split("/")[0])
        assert seen == names


def test_pending_collective_results_are_uninitialised(runs, trace):
    """The functional all-gather's result before `wait_tensor` (the op's output and the
    `AsyncCollectiveTensor` that wraps it) is flagged uninitialised, its bytes never
    stored or compared; the value computed from it after the wait is stored as printed."""
    gathers = _events(trace, "_c10d_functional::all_gather_into_tensor")
    wraps = _events(trace, "_c10d_functional::_wrap_tensor_autograd")
    assert len(gathers) == len(wraps) == 2
    for eid in gathers + wraps:
        (row,) = trace.value_rows(eid)
        assert row["flags"] & schema.VFLAG_UNINIT, trace.event(eid)["op"]
        assert trace.read_value(row) is None
    sums = dict(_GATHERED.findall(runs[2].stdout))
    for step, wrap in enumerate(wraps):
        (user,) = [i for i in range(wrap + 1, len(trace))
                   if any(int(r["producer"]) == wrap for r in trace.input_rows(i))]
        assert trace.string(trace.events[user]["op"]) == "aten::sum"
        (row,) = trace.value_rows(user)
        assert trace.read_value(row) == np.float32(sums[str(step)])


def test_two_recordings_match(runs):
    paths = runs[0]
    proc = run_cli("locate", paths["a"], paths["b"], "--json", "--no-explain")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    j = json.loads(proc.stdout)
    assert j["verdict"] == "match"
    for side in ("a", "b"):
        c = j["coverage"][side]
        assert c["paired"] == c["events"] > 0 and c["compared"] >= 0.8 * c["events"], c
