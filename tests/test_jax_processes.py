"""JAX with several processes (`jax.distributed`, gloo CPU collectives): a `shard_map` +
`pmean` data-parallel step on two processes, recorded once clean and once with process 1
perturbing one element of its own batch rows (fixtures/jax_distributed_dp.py, both
processes started together on a localhost coordinator; tests/jax_processes.py).

Each process stores its own shards (the global batch is not addressable from one
process) and replays the `shard_map` body on its own device, its collectives gathering
the other process's inputs. `locate DIR DIR` must name process 1, step 0, its own shard
(the input rows it holds); process 0 inherits through the gradient's all-reduce.
`replicas` compares the replicated parameters across the processes. Truth: numpy on the
same data (tests/jax_processes.py). The field suite (tests/field/test_jax_distributed.py)
adds a run whose replicas split and runs the printed per-process commands."""

import numpy as np
import pytest

import tracediff
from tracediff.diff.compare import levels

from .helpers import run_cli
from .jax_processes import (BAD_PROCESS, bad_element, data, first_step_params, line_of,
                            record_runs)

CALL_LINE = line_of("w, l = step(w, x, y)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return record_runs(tmp_path_factory.mktemp("jaxdist"), ("clean", "bad"))


def _local_device(trace):
    (dev,) = trace.manifest["distributed"]["local_devices"]
    return dev


def test_locate_names_process_1_step_0_and_its_own_shard(runs):
    rr = tracediff.locate_ranks(runs["clean"], runs["bad"], workers=1, explain=False)
    assert rr.verdict == "diverged" and rr.first_rank == BAD_PROCESS
    f = rr.result.first_beyond_tolerance
    assert (f.a.op, f.a.step, f.a.source, f.a.rank) == ("input", 0, CALL_LINE, BAD_PROCESS)
    assert f.inputs_match is True    # nothing before it differs: it is where it started
    row, col, clean, perturbed = bad_element()
    # the one element that differs, from process 1's own rows (a float32 exactly)
    assert (f.metrics.worst_a, f.metrics.worst_b) == (clean, perturbed)
    assert f.metrics.mismatch_fraction == pytest.approx(1 / 16)   # 1 of its 4x4 elements
    with tracediff.load(runs["bad"] / "rank1.h5") as t:
        device = _local_device(t)
    (d,) = [d for d in f.devices if d.differs]
    assert (d.device, d.shard) == (device, "4:8,:")      # rows 4:8: process 1's shard
    assert "own shard" in f.device_note and device in f.device_note
    # process 0's rows are untouched (row >= 4): it received the difference through the
    # all-reduce of the gradient, in step 0
    assert 4 <= row < 8
    (s,) = rr.spread
    assert s.rank == 0 and s.step == 0 and s.via == "psum_invariant"
    shown = run_cli("locate", runs["clean"], runs["bad"], "--workers", "1", "--no-explain")
    assert shown.returncode == 1
    assert f"it started on rank {BAD_PROCESS}: input step 0  {CALL_LINE}" in shown.stdout
    assert "rank 0 on " in shown.stdout and "inherited it through psum_invariant" in shown.stdout


def test_each_process_stores_its_shards_and_replays_the_body_on_its_device(runs):
    x, y = data()
    for r in range(2):
        with tracediff.load(runs["clean"] / f"rank{r}.h5") as t:
            device = _local_device(t)
            inputs = [e for e in range(len(t.events)) if t.event(e)["op"] == "input"
                      and t.event(e)["source"] == CALL_LINE]
            shards = [dv for e in inputs for dv in t.device_values(e)]
            own = {dv.shard: dv.value() for dv in shards}
            # its own rows of x and y, bitwise, and nothing of the other process's
            assert np.array_equal(own["4:8,:" if r else "0:4,:"], x[4 * r:4 * r + 4])
            assert np.array_equal(own["4:8" if r else "0:4"], y[4 * r:4 * r + 4])
            assert {dv.device for dv in shards} == {device}
            body = [e for e in range(len(t.events)) if t.event_device(e)]
            assert {t.event_device(e) for e in body} == {device}
            ops = [t.event(e)["op"] for e in body]
            assert "psum_invariant" in ops and "dot_general" in ops
            # the body's new parameters of step 0, replayed on this process: numpy's
            first_call = min(e for e in range(len(t.events)) if t.event(e)["op"] == "jit:step")
            subs = [e for e in body if t.event(e)["op"] == "sub" and
                    t.event(e)["call"] == first_call]
            w1 = t.device_values(subs[-1])[0].value()
            np.testing.assert_allclose(w1, first_step_params(), rtol=2e-6, atol=1e-7)
            jax_m = t.manifest["frameworks"]["jax"]
            assert jax_m["replay_errors"] == []
            # the replayed call outputs are the compiled ones, up to the rounding of
            # op-by-op replay where XLA fuses the update (docs/multiprocess.md)
            assert jax_m["replay_vs_compiled"]["max_rel_difference"] < 1e-6


def test_replicas_compares_the_replicated_parameters_across_processes(runs):
    for run in ("clean", "bad"):
        r = tracediff.replicas(runs[run], workers=1)
        # pmean gives both processes the same parameters, perturbed or not
        assert r.verdict == "consistent" and r.ranks == [0, 1], r
        assert r.checked >= 10
        shown = run_cli("replicas", runs[run], "--workers", "1")
        assert shown.returncode == 0 and "CONSISTENT" in shown.stdout
    from tracediff.diff.distributed.replicas import jax_replicated_mask

    with tracediff.load(runs["bad"] / "rank0.h5") as t:
        mask = jax_replicated_mask(t)
        compared = {t.event(int(e))["op"] for e in np.flatnonzero(mask)}
    # the step's outputs (the parameters) and the all-reduced gradient are among them
    assert {"jit:step", "psum_invariant", "sub"} <= compared


def test_zoom_commands_start_every_process_with_its_id(runs):
    """A printed `record` command for one process alone blocks at initialize: the zoom
    recipe lists every process, each with JAX_PROCESS_ID and its own command line."""
    with tracediff.load(runs["clean"] / "rank1.h5") as ta, \
            tracediff.load(runs["bad"] / "rank1.h5") as tb:
        z = levels._recipe(ta, tb, {}, {}, 0, "step0", "zoom")
        argv1 = ta.manifest["script"]["argv"]
    assert z.a.trace.endswith("clean.step0/") and z.b.trace.endswith("bad.step0/")
    lines = [ln for ln in z.a.notes + [z.a.command] if not ln.startswith("#")]
    assert len(lines) == 2 and z.a.command.endswith("& wait")
    port = argv1[2]
    for k, ln in enumerate(lines):
        assert f"JAX_PROCESS_ID={k} " in ln and "JAX_NUM_PROCESSES=2 " in ln
        assert f" -o {z.a.trace} " in ln
        # process k's own command line: its process id, the run's coordinator port
        assert ln.rstrip(" &wait").endswith(f" {k} {port} clean"), ln
    assert lines[1].endswith(" ".join(argv1[1:]) + " & wait")
    assert z.then.split()[-2:] == [z.a.trace, z.b.trace]


def test_report_reproduces_the_run_with_every_process(runs, tmp_path):
    out = tmp_path / "r.md"
    done = run_cli("report", runs["clean"] / "rank1.h5", runs["bad"] / "rank1.h5", "-o", out)
    assert done.returncode in (0, 1), done.stderr
    lines = out.read_text().splitlines()
    for side, mode in (("a", "clean"), ("b", "bad")):
        mine = [ln for ln in lines if f" -o run_{side}/ " in ln]
        assert [ln.split()[:2] for ln in mine] == [
            ["JAX_NUM_PROCESSES=2", f"JAX_PROCESS_ID={k}"] for k in range(2)]
        for k, ln in enumerate(mine):   # its own process id, the run's coordinator port
            assert ln.split()[-4:] == [str(k), mine[0].split()[-3], mode, "&"], ln
        assert lines[lines.index(mine[-1]) + 1] == "wait"
    assert "tracediff locate run_a/ run_b/" in lines
