"""Shared by the FSDP2 and DTensor field tests (issue #36): record a program of
tests/field/programs under torchrun (2 ranks, gloo), and the truth computed from what the
program printed, independently of tracediff.

Truth: each program prints, after every optimizer step, every parameter gathered in full
(`full_tensor()`). The first printed (step, parameter) whose values differ between the
clean and the faulty run, and the rows that differ, say which parameter departed, where
(the rows of one rank's `Shard(0)` chunk: the rank and the shard's offset), and after
which step (the fault runs after that step's `opt.step()`: the trace's step, optimizer
steps completed before the event, is that step + 1). The source line is the program's
line marked `# the fault`.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np

from tests.helpers import ROOT, require_loopback, run_cli, script_env

PROGRAMS = os.path.join(os.path.dirname(__file__), "programs")
WORLD = 2
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
_PARAM = re.compile(r"^step (\d+) param (\S+) \[([\d, ]*)\] (.*)$", re.M)


def torchrun(program, out, port, *args):
    """`torchrun -m tracediff record -o OUT/ PROGRAM ARGS` (OUT None: the plain program)."""
    rec = ["-m", "tracediff", "record", "-o", f"{out}{os.sep}"] if out is not None else []
    require_loopback()
    for attempt in range(3):
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
             "--master-addr", "127.0.0.1", "--master-port", str(port + 100 * attempt), *rec,
             os.path.join(PROGRAMS, program), *args],
            env=script_env(ENV), cwd=ROOT, capture_output=True, text=True, timeout=900)
        # torch 2.13's gloo at times aborts a rank as the process ends, also in the plain
        # program without tracediff ("terminate called without an active exception",
        # SIGABRT, seen once in five field runs): run it again, as a user would
        if proc.returncode == 0 or TEARDOWN_ABORT not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


TEARDOWN_ABORT = "terminate called without an active exception"


def record_runs(folder, program, port):
    """{"clean", "clean2", "bad"} recorded, plus the plain clean run's output."""
    out = {"dirs": {}, "stdout": {}, "stderr": {}}
    for i, (name, args) in enumerate((("clean", ()), ("bad", ("--bad",)), ("clean2", ()))):
        proc = torchrun(program, folder / name, port + i, *args)
        out["dirs"][name], out["stdout"][name] = folder / name, proc.stdout
        out["stderr"][name] = proc.stderr
    out["stdout"]["plain"] = torchrun(program, None, port + 3).stdout
    return out


def _params(stdout):
    """[(step, name, array)] in printed order."""
    return [(int(s), n, np.array([float(v) for v in vals.split()]).reshape(
        [int(d) for d in shape.split(",") if d.strip()]))
        for s, n, shape, vals in _PARAM.findall(stdout)]


def truth(runs, program, marker="# the fault"):
    """The fault as the printed numbers show it: parameter, rank, shard offset, step, line
    (the program's line marked `marker`)."""
    clean, bad = _params(runs["stdout"]["clean"]), _params(runs["stdout"]["bad"])
    assert [(s, n) for s, n, _ in clean] == [(s, n) for s, n, _ in bad] and clean
    step, name, a, b = next((s, n, x, y) for (s, n, x), (_, _, y) in zip(clean, bad)
                            if not np.array_equal(x, y))
    rows = np.flatnonzero((a != b).reshape(a.shape[0], -1).any(axis=1))
    chunk = -(-a.shape[0] // WORLD)          # torch.chunk's Shard(0) split
    rank = int(rows[0]) // chunk
    assert int(rows[-1]) // chunk == rank, "the difference spans two ranks' shards"
    with open(os.path.join(PROGRAMS, program)) as fh:
        line = next(i for i, text in enumerate(fh, 1) if marker in text)
    offset = ",".join([str(rank * chunk)] + ["0"] * (a.ndim - 1))
    return {"param": name, "rank": rank, "offset": offset, "step": step + 1,
            "global_shape": ",".join(map(str, a.shape)), "source": f"{program}:{line}"}


def losses(stdout):
    """(rank, step, loss) sorted: the ranks print in whatever order they get there, at
    times into one line of the shared output"""
    return sorted(re.findall(r"rank (\d+) step (\d+) loss ([-+0-9.e]+\d)", stdout))


def check_recorded_in_full(runs):
    """Every rank's trace: the run's numbers unchanged, nothing lost, DTensors recorded."""
    from tracediff.trace.reader import Trace

    assert losses(runs["stdout"]["clean"]) == losses(runs["stdout"]["plain"])
    assert _PARAM.findall(runs["stdout"]["clean"]) == _PARAM.findall(runs["stdout"]["plain"])
    assert "WARNING" not in runs["stderr"]["clean"] + runs["stderr"]["bad"]
    for name in ("clean", "bad"):
        for rank in range(WORLD):
            with Trace(runs["dirs"][name] / f"rank{rank}.h5") as t:
                fw = t.manifest["frameworks"]["torch"]
                assert "recording_error" not in fw, fw["recording_error"]
                assert fw["subclasses"]["unreadable_values"] == 0
                assert fw["subclasses"]["dtensor_values"] > 0 and len(t.placement_rows)
                assert fw["optimizer_steps"] == 2 and t.rank == rank


def check_located(runs, program, scheduler=None):
    """`locate clean/ bad/` names the truth's rank, parameter, shard, step and line, and
    the other rank inheriting through an all-gather."""
    want = truth(runs, program)
    extra = ("--scheduler", scheduler) if scheduler else ("--workers", "1")
    proc = run_cli("locate", runs["dirs"]["clean"], runs["dirs"]["bad"], "--json",
                   "--no-explain", *extra)
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    assert r["first_rank"] == want["rank"]
    first = next(s for s in r["ranks"] if s["rank"] == want["rank"])
    assert (first["param"], first["step"]) == (want["param"], want["step"]), first
    assert first["source"].endswith(want["source"]), first
    assert first["shard"].startswith(f"offset {want['offset']} of {want['global_shape']} "), first
    others = [s for s in r["spread"]]
    assert [s["rank"] for s in others] == [x for x in range(WORLD) if x != want["rank"]]
    for s in others:
        assert "all_gather" in (s["via"] or ""), s
    return r


def check_clean_runs_match(runs):
    proc = run_cli("locate", runs["dirs"]["clean"], runs["dirs"]["clean2"], "--json",
                   "--no-explain", "--workers", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    j = json.loads(proc.stdout)
    assert j["verdict"] == "match"
    for side in ("a", "b"):          # every rank's events paired and compared
        c = j["result"]["coverage"][side] if "result" in j else j["coverage"][side]
        assert c["paired"] == c["events"] > 0 and c["compared"] >= 0.9 * c["events"], c
