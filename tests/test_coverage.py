"""Coverage (diff/coverage.py): every result says what it compared, and a MATCH on too
little evidence is INCONCLUSIVE (exit code 3), never a pass.

Real recordings throughout: two runs of one script (everything paired and compared), a
port whose modules the user's map keeps from pairing while its query and key really are
swapped (the truth: `--swap-qk`), a golden whose values were all recorded as metadata only,
a recording killed before its first commit, a script that stops torch capture by removing
its dispatch mode, and the Flax init / RNG units a port does not count.
"""

import json
import shutil
import subprocess
import sys

import h5py
import pytest

import tracediff
from tracediff.diff import coverage as _coverage
from tracediff.trace import schema

from .helpers import locate_json, metadata_only_copy, record, script_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _cli(*args, cwd=None):
    env = script_env()
    return subprocess.run([sys.executable, "-m", "tracediff", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def mlp_runs(recorded):
    return recorded("torch_mlp.py"), recorded("torch_mlp.py", tag="again")


def test_two_runs_of_one_script_match_with_everything_compared(mlp_runs):
    r = tracediff.locate(*mlp_runs)
    assert r.verdict == "match" and r.exit_code == 0
    c = r.coverage
    assert c.sufficient and not c.reasons and not c.unpaired
    for s in (c.a, c.b):
        assert s.counted == "events" and s.framework == "torch"
        assert s.events > 100 and s.paired == s.events and s.compared == s.events
        assert set(s.by_phase) == {"forward", "backward", "optimizer"}
        assert all(p["compared"] == p["events"] > 0 for p in s.by_phase.values())
        assert s.values_with_data == s.values and s.bytes > 0 and not s.capture
    j = tracediff.to_json(r)["coverage"]
    assert j["sufficient"] is True and j["a"]["compared"] == c.a.compared and j["bar"] == 0.8


def test_a_golden_of_metadata_only_values_is_inconclusive(mlp_runs, tmp_path):
    """Every value of the golden marked metadata only (no bytes, no hash), as a recorder
    that could not read them leaves them: nothing can be compared, so no MATCH."""
    golden = metadata_only_copy(mlp_runs[0], tmp_path / "golden.h5")
    r = tracediff.locate(str(golden), mlp_runs[1])
    assert r.verdict == "inconclusive" and r.exit_code == 3
    assert r.coverage.a.compared == 0 and r.coverage.a.paired == r.coverage.a.events
    assert any("nothing was compared" in x for x in r.coverage.reasons)
    assert "--level" in r.coverage.next_step
    cli = _cli("locate", str(golden), mlp_runs[1], "--no-explain")
    assert cli.returncode == 3, cli.stderr
    assert cli.stdout.startswith("INCONCLUSIVE") and "nothing was compared" in cli.stdout


def test_a_value_marked_uninitialised_is_no_evidence_even_with_a_hash_flag(mlp_runs, tmp_path):
    """A golden whose rows say uninitialised memory (`torch.empty`) and also carry the hash
    flag (a damaged or hostile trace: the recorder never writes both): an uninitialised
    value is never compared, so it is no evidence and the answer is no MATCH."""
    golden = tmp_path / "golden.h5"
    shutil.copyfile(mlp_runs[0], golden)
    with h5py.File(golden, "r+") as f:
        v = f["values"][...]
        v["flags"] = v["flags"] | schema.VFLAG_UNINIT | schema.VFLAG_STATS
        v["offset"] = -1
        f["values"][...] = v
    r = tracediff.locate(str(golden), mlp_runs[1], explain=False)
    assert r.verdict == "inconclusive" and r.exit_code == 3
    assert r.coverage.b.paired > 0 and r.coverage.b.compared == 0
    assert any("nothing was compared" in x for x in r.coverage.reasons)


def test_a_recording_killed_before_its_first_commit_is_never_a_match(mlp_runs, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text("import os, signal\nimport torch\n"
                      "x = torch.ones(3) * 2\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    out = tmp_path / "killed.h5"
    rec = _cli("record", "-o", str(out), str(script))
    assert rec.returncode != 0 and out.exists()
    for pair in ((str(out), mlp_runs[0]), (mlp_runs[0], str(out))):
        cli = _cli("locate", *pair, "--no-explain", "--json")
        assert cli.returncode in (1, 2, 3), cli.stdout + cli.stderr   # never 0: MATCH
        if cli.returncode == 3:
            j = json.loads(cli.stdout)
            assert j["verdict"] == "inconclusive"
            assert any("did not finish" in x for x in j["coverage"]["reasons"])


@pytest.fixture(scope="module")
def swapped(recorded):
    return recorded("port_transformer.py", "--swap-qk")


def test_a_port_the_map_keeps_from_pairing_is_inconclusive_where_it_was_match(swapped):
    """The truth: query and key are swapped (--swap-qk), the port diverges. A map that
    sends every module to one that does not exist leaves nothing paired: the old answer
    was MATCH; the honest one is INCONCLUSIVE, naming the unpaired regions."""
    assert tracediff.locate(swapped, explain=False).verdict == "diverged"   # the premise
    r = tracediff.locate(swapped, map_file='{"*": "nowhere"}', explain=False)
    assert r.verdict == "inconclusive" and r.exit_code == 3
    c = r.coverage
    assert c.a.counted == "computing units" and c.a.framework == "jax" and c.b.framework == "torch"
    assert c.b.paired < 0.8 * c.b.events
    assert c.unpaired and c.unpaired[0].length > 1 and c.unpaired[0].op
    assert "--map" in c.next_step
    cli = _cli("locate", swapped, "--map", '{"*": "nowhere"}', "--no-explain")
    assert cli.returncode == 3 and "INCONCLUSIVE" in cli.stdout and "unpaired:" in cli.stdout


def test_a_correct_port_counts_only_what_both_sides_compute(recorded):
    """Flax's RNG, initialisers and `init` forward are not the torch side's work: they are
    counted apart (setup); every unit of the model's forward, backward and optimizer is
    paired or inside a paired module (a LayerNorm's reductions)."""
    r = tracediff.locate(recorded("port_mlp_adam.py"), explain=False)
    assert r.verdict == "match"
    a, b = r.coverage.a, r.coverage.b
    assert a.setup > 0 and b.setup == 0
    assert a.paired == a.events and b.paired == b.events
    assert set(a.by_phase) == {"forward", "backward", "optimizer"}
    assert a.by_phase["optimizer"]["compared"] == b.by_phase["optimizer"]["compared"] == 2


def test_a_script_that_removes_the_dispatch_mode_is_never_a_match(tmp_path):
    """Later ops go unrecorded once the script pops torch's dispatch mode: the trace says
    capture stopped, and two such runs are INCONCLUSIVE, not a MATCH on two events."""
    script = tmp_path / "popmode.py"
    script.write_text("import torch\n"
                      "from torch.utils._python_dispatch import _pop_mode, "
                      "_get_current_dispatch_mode_stack\n"
                      "x = torch.ones(3) * 2\n"
                      "if _get_current_dispatch_mode_stack():\n"
                      "    _pop_mode()\n"
                      "print(float((x + 1).sum()))\n")
    traces = [str(tmp_path / f"{n}.h5") for n in "ab"]
    for t in traces:
        rec = _cli("record", "-o", t, str(script))
        assert rec.returncode == 0 and "9.0" in rec.stdout, rec.stderr
    r = tracediff.locate(*traces, explain=False)
    assert r.verdict == "inconclusive" and r.exit_code == 3
    assert any("removed tracediff's dispatch mode" in x for x in r.coverage.a.capture)


def test_the_bar_reads_each_side(tmp_path):
    """assess(): a side below the bar in pairs, or with values on too few, or a capture
    problem, each alone makes the coverage insufficient."""
    from tracediff.diff.result import CoverageSide

    full = dict(events=100, paired=100, compared=100)
    ok = _coverage.assess(CoverageSide("a", "a.h5", **full), CoverageSide("b", "b.h5", **full), [])
    assert ok.sufficient
    low = _coverage.assess(CoverageSide("a", "a.h5", **full),
                           CoverageSide("b", "b.h5", events=100, paired=79, compared=79), [])
    assert not low.sufficient and "79 of 100" in low.reasons[0]
    unval = _coverage.assess(CoverageSide("a", "a.h5", **full),
                             CoverageSide("b", "b.h5", events=100, paired=100, compared=50), [])
    assert not unval.sufficient and "compared" in unval.reasons[0]
    stop = _coverage.assess(CoverageSide("a", "a.h5", capture=["a.h5: torch capture stopped"],
                                         **full), CoverageSide("b", "b.h5", **full), [])
    assert not stop.sufficient and stop.reasons == ["a.h5: torch capture stopped"]


def test_compared_is_a_share_of_the_counted_events_not_of_the_paired_ones():
    """85 of 100 paired (above the bar) but only 75 of 100 compared: 75 of the 85 paired
    would pass the bar, 75 of the events counted does not."""
    from tracediff.diff.result import CoverageSide

    full = dict(events=100, paired=100, compared=100)
    r = _coverage.assess(CoverageSide("a", "a.h5", **full),
                         CoverageSide("b", "b.h5", events=100, paired=85, compared=75), [])
    assert not r.sufficient and r.reasons == [
        "side b: only 75 of 100 events compared (the others hold no bytes or hash on one side)"]


def test_an_op_only_one_run_has_is_unpaired_on_that_side_only(recorded):
    """b runs one multiply a does not (fixtures/torch_inserted_op.py --insert; the same
    recordings as test_reports.py): each side reads its partners through its own map
    (a2b for a, b2a for b), so a is fully compared and b has exactly one unpaired event."""
    runs = recorded.many({"a": ("torch_inserted_op.py", ()),
                          "b": ("torch_inserted_op.py", ("--insert",))})
    r = tracediff.locate(runs["a"], runs["b"], explain=False)
    a, b = r.coverage.a, r.coverage.b
    assert a.paired == a.compared == a.events > 0
    assert b.events == a.events + 1 and b.paired == b.compared == a.events
    assert [(u.side, u.length, u.op) for u in r.coverage.unpaired] == [("b", 1, "aten::mul.Tensor")]


INSERTED_RUN = """import sys
import torch
torch.manual_seed(0)
x = torch.randn(8)
if "--insert" in sys.argv:
    x = x * 1.000001   # inserted 1
    x = x + 0.5        # inserted 2
    x = x * 0.999999   # inserted 3
print(torch.sign(x).sum().item())
"""


def test_an_unpaired_region_starts_at_its_first_event(tmp_path):
    """b runs three ops a does not, one after another: one unpaired region of b, which
    starts where b's extra work starts (the event a user opens first) and holds all three.
    The truth from b's event table: the events recorded at the inserted lines."""
    script = tmp_path / "inserted.py"
    script.write_text(INSERTED_RUN)
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    record(str(script), a)
    record(str(script), b, "--insert")
    inserted = [f"inserted.py:{n}" for n in (6, 7, 8)]
    with tracediff.load(str(b)) as t:
        mine = [i for i in range(len(t)) if t.event(i)["source"] in inserted]
    assert len(mine) == 3 and mine == list(range(mine[0], mine[0] + 3)), mine   # the premise
    regions = locate_json(a, b, "--no-explain")["coverage"]["unpaired"]
    assert [(u["side"], u["start"], u["length"]) for u in regions] == [("b", mine[0], 3)], regions
    assert regions[0]["op"] == "aten::mul.Tensor" and regions[0]["source"] == inserted[0], regions


@pytest.fixture(scope="module")
def rng_train(recorded):
    """fixtures/torch_rng_train.py plainly and with aten::dot broken (its logged metric
    differs, its parameters do not): (plain, broken)."""
    from .conftest import BROKEN_DOT

    runs = recorded.many({"plain": ("torch_rng_train.py", (), None),
                          "broken": ("torch_rng_train.py", (), BROKEN_DOT)})
    return runs["plain"], runs["broken"]


def test_a_map_that_pairs_nothing_never_makes_a_training_loop_match(rng_train):
    """The truth: the broken run's metric differs (plain locate: DIVERGED). A map that
    sends every module nowhere pairs no computing unit; the units computing from the
    weights and data both runs drew from their RNG are still both runs' work (counted, not
    "RNG, initialisers, optimizer internals"), so the optimizer snapshots alone (equal:
    the metric is off the gradient path) never make a MATCH. The old answer: MATCH, exit 0,
    2 of 2 'computing units' compared, 42 units not counted."""
    assert tracediff.locate(*rng_train, explain=False).verdict == "diverged"   # the premise
    r = tracediff.locate(*rng_train, map_file='{"*": "x"}', explain=False)
    assert r.verdict == "inconclusive" and r.exit_code == 3
    for s in (r.coverage.a, r.coverage.b):
        work = s.by_phase["forward"]["events"] + s.by_phase["backward"]["events"]
        assert work > 2 * s.setup and s.by_phase["forward"]["compared"] == 0
        assert s.paired < 0.8 * s.events
    cli = _cli("locate", *rng_train, "--map", '{"*": "x"}', "--no-explain")
    assert cli.returncode == 3 and cli.stdout.startswith("INCONCLUSIVE"), cli.stdout


def test_optimizer_snapshots_alone_are_no_match():
    """assess(): a side whose only compared entries are its optimizer snapshots, while it
    ran computing units, is below the bar whatever its share: the snapshots say where the
    training ended, not what computed it."""
    from tracediff.diff.result import CoverageSide

    snaps = dict(events=2, paired=2, compared=2, setup=40,
                 by_phase={"optimizer": {"events": 2, "paired": 2, "compared": 2}})
    r = _coverage.assess(CoverageSide("a", "a.h5", **snaps), CoverageSide("b", "b.h5", **snaps), [])
    assert not r.sufficient
    assert [x for x in r.reasons if "only the 2 optimizer snapshots" in x] == [
        "side a: no computing unit was compared, only the 2 optimizer snapshots",
        "side b: no computing unit was compared, only the 2 optimizer snapshots"]


def test_every_event_with_an_output_is_counted_from_the_first(tmp_path):
    """The events counted are exactly those the trace holds an initialised output for,
    read here with h5py: event 0 (the script's first op, `torch.ones`) included."""
    script = tmp_path / "three.py"
    script.write_text("import torch\nx = torch.ones(3)\ny = x * 2\nprint(float(y.sum()))\n")
    traces = [str(tmp_path / f"{n}.h5") for n in "ab"]
    for t in traces:
        rec = _cli("record", "-o", t, str(script))
        assert rec.returncode == 0 and "6.0" in rec.stdout, rec.stderr
    with h5py.File(traces[0], "r") as f:
        v = f["values"][...]
    out = v[(v["role"] == schema.ROLE_OUT) & ((v["flags"] & schema.VFLAG_UNINIT) == 0)]
    expected = set(out["event"].tolist())
    assert 0 in expected
    r = tracediff.locate(*traces, explain=False)
    assert r.verdict == "match"
    for s in (r.coverage.a, r.coverage.b):
        assert s.events == s.paired == s.compared == len(expected) >= 3
        assert s.values == len(out)


def test_the_reason_names_each_side_below_the_bar():
    """Both sides below the bar: the reason gives each side's own share, a's and b's."""
    from tracediff.diff.result import CoverageSide

    r = _coverage.assess(CoverageSide("a", "a.h5", framework="jax", counted="computing units",
                                      events=37, paired=25, compared=25),
                         CoverageSide("b", "b.h5", framework="torch", counted="computing units",
                                      events=36, paired=2, compared=2), [], cross=True)
    assert r.reasons == [
        "side a (jax): only 25 of 37 computing units paired (68%; the bar is 80%)",
        "side b (torch): only 2 of 36 computing units paired (6%; the bar is 80%)"]
