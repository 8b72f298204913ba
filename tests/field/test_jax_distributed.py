"""JAX with several processes, the whole workflow (~30 s per process here): two-process
`jax.distributed` runs (gloo, localhost coordinator, fixtures/jax_distributed_dp.py)
recorded clean, with process 1 perturbing one element of its own rows (`bad`), with the
parameters' copy on process 1 departing after the pmean (`split`), and clean/bad again
at `--level stats`. Truth: numpy on the same data (tests/jax_processes.py).

- `locate DIR DIR` names process 1, step 0, its own shard; process 0 inherits through
  the all-reduce;
- `replicas` compares the replicated parameters across processes: consistent for clean
  and bad (pmean), process 1 named where its copy departs (split);
- at `--level stats` the first beyond-tolerance value is process 1's local gradient (its
  first body equation that reads the perturbed rows), and the zoom-in commands it prints
  start both processes with their ids: run as printed, they record both processes and
  the printed `locate` names process 1's input."""

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tracediff

from ..helpers import ROOT, run_cli, script_env
from ..jax_processes import (BAD_PROCESS, TIMEOUT, bad_element, data, free_port, line_of,
                             record_runs)

CALL_LINE = line_of("w, l = step(w, x, y)")
LOSS_LINE = line_of("return jnp.mean((x @ w - y) ** 2)")   # x @ w, whose transpose it is
STATS = ("--level", "stats")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return record_runs(tmp_path_factory.mktemp("jaxdist"), ("clean", "bad", "split"),
                       {"clean_stats": ("clean", STATS), "bad_stats": ("bad", STATS)})


def test_locate_names_process_1_its_own_shard_in_step_0(runs):
    rr = tracediff.locate_ranks(runs["clean"], runs["bad"], workers=1, explain=False)
    f = rr.result.first_beyond_tolerance
    assert rr.first_rank == BAD_PROCESS and (f.a.op, f.a.step, f.a.source) == ("input", 0, CALL_LINE)
    _, _, clean, perturbed = bad_element()
    assert (f.metrics.worst_a, f.metrics.worst_b) == (clean, perturbed)
    assert [d.shard for d in f.devices if d.differs] == ["4:8,:"]
    assert [(s.rank, s.via) for s in rr.spread] == [(0, "psum_invariant")]


def test_replicas_compares_the_parameters_and_names_the_process_that_departs(runs):
    for run in ("clean", "bad"):
        r = tracediff.replicas(runs[run], workers=1)
        assert r.verdict == "consistent" and r.checked >= 10, r
    # truth: process 1's copy of w is process 0's + 1e-3 (the script's indicator)
    copies = []
    for rank in (0, 1):
        with tracediff.load(runs["split"] / f"rank{rank}.h5") as t:
            call = min(e for e in range(len(t.events)) if t.event(e)["op"] == "jit:step")
            copies.append(t.outputs(call)[0])
    np.testing.assert_allclose(copies[1] - copies[0], 1e-3, rtol=1e-3)
    r = tracediff.replicas(runs["split"], workers=1)
    assert r.verdict == "diverged" and r.departed == [1]
    assert (r.first.rank, r.first.op, r.first.step, r.first.source) == (1, "jit:step", 0, CALL_LINE)
    shown = run_cli("replicas", runs["split"], "--workers", "1")
    assert shown.returncode == 1 and "replicas part on rank 1 at jit:step" in shown.stdout


def test_stats_level_names_process_1s_local_gradient_and_its_printed_commands_run(runs):
    rr = tracediff.locate_ranks(runs["clean_stats"], runs["bad_stats"], workers=1,
                                explain=False)
    assert rr.first_rank == BAD_PROCESS
    fd, ft = rr.result.first_difference, rr.result.first_beyond_tolerance
    assert (fd.a.op, fd.a.step) == ("input", 0)           # its own rows: digests differ
    with tracediff.load(runs["bad_stats"] / "rank1.h5") as t:
        (device,) = t.manifest["distributed"]["local_devices"]
    # the first body equation that reads the perturbed rows: the local gradient
    # X_1^T ct (ct = 2/4 (X_1 w0 - Y_1), w0 = 0), on process 1's device; numpy: it differs
    x, y = data()
    row, col, _, value = bad_element()
    xb = x.copy()
    xb[row, col] = value
    ct = 0.5 * (0 - y[4:])
    assert not np.array_equal(x[4:].T @ ct, xb[4:].T @ ct)
    assert (ft.a.op, ft.a.step, ft.a.device, ft.a.source) == ("dot_general", 0, device, LOSS_LINE)
    shown = run_cli("locate", runs["clean_stats"], runs["bad_stats"], "--workers", "1",
                    "--no-explain")
    lines = shown.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if "zoom in on step 0" in ln)
    recipe = [ln.strip() for ln in lines[start + 1:]]
    record = [ln for ln in recipe if "tracediff record" in ln]
    assert len(record) == 4 and sum("JAX_PROCESS_ID=1 " in ln for ln in record) == 2
    then = next(ln for ln in recipe if ln.startswith("tracediff locate"))
    # run as printed (every process of a run started together), bounded; the script's
    # coordinator port is its own argument, which the recorded run has given back: on a
    # busy machine another test may hold it now, so each run gets a free one
    script = "\n".join(ln for ln in recipe[:recipe.index(then)])
    ports = set(re.findall(r"jax_distributed_dp\.py \d (\d+) ", script))
    assert len(ports) == 2, script
    for port in ports:
        script = script.replace(f" {port} ", f" {free_port()} ")
    done = subprocess.run(["bash", "-c", script], env=script_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=2 * TIMEOUT)
    a, b = then.split()[-2:]
    for d in (a, b):   # `wait` returns 0 whatever its jobs did: what they wrote says
        assert {p.name for p in Path(d).glob("rank*.h5")} == {"rank0.h5", "rank1.h5"}, \
            done.stderr[-3000:]
    rr = tracediff.locate_ranks(a, b, workers=1, explain=False)
    f = rr.result.first_beyond_tolerance
    assert rr.first_rank == BAD_PROCESS and (f.a.op, f.a.step) == ("input", 0)
