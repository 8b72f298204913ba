"""Many ranks: a 3-rank gloo DDP run under torchrun, recorded once clean and once with a
fault on rank 2 (one gradient scaled by 1e-3 after the all-reduce, in step 0: the
script's own perturbation), compared rank by rank with `tracediff locate DIR DIR`; the
collectives recorded before and after; the per-rank output rule; Dask gives the same JSON.

The two recordings are made once per test session (`ddp_runs`, shared with
test_replicas.py) and made read-only.
"""

import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import tracediff
from tracediff.runner.output import output_path_for
from tracediff.trace import schema

from .helpers import (FIXTURES, ROOT, fixture_line, require_loopback, run_cli, script_env,
                      shared_folder)

SCRIPT = os.path.join(FIXTURES, "torch_ddp.py")
NPROC = 3   # a majority of two against the fault rank (tests/test_replicas.py)
FAULT_RANK, FAULT_STEP = 2, 0




FAULT_LINE = fixture_line("torch_ddp.py", "grad.mul_(grad_scale)")
BACKWARD_LINE = fixture_line("torch_ddp.py", "loss.backward()")

_RUNS = {}
_LOCK = threading.Lock()
# gloo on the loopback interface: found by the host name, it waits ~15 s per process here
GLOO_ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


COLLECTIVES = """
import os
import torch
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
x = torch.arange(4.0) + 1
dist.all_reduce(x, op=dist.ReduceOp.MAX)
dist.broadcast(x, src=0)
out = [torch.zeros(4)]
dist.all_gather(out, x * 2)
flat = torch.zeros(4)
dist.all_gather_into_tensor(flat, x * 3)
part = torch.zeros(4)
dist.reduce_scatter_tensor(part, x * 4)
dist.destroy_process_group()
"""


def _torchrun(output, port, *args, nproc=NPROC):
    """`torchrun -m tracediff record -o OUTPUT torch_ddp.py ARGS`; OUTPUT is a folder
    (ending in a separator: rank{R}.h5 inside) or a file name (NAME.rank{R}.h5)."""
    require_loopback()
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
         "--master-addr", "127.0.0.1", "--master-port", str(port),
         "-m", "tracediff", "record", "-o", str(output), SCRIPT, *args],
        env=script_env(GLOO_ENV), cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def record_ddp_runs(folder):
    """{"clean": dir, "faulty": dir} of per-rank traces and "coll" (one process, every
    kind of collective), recorded once per test run (all at once; FOLDER is shared by the
    pytest-xdist workers, the first to ask records under a file lock) and made read-only."""
    from filelock import FileLock

    with _LOCK, FileLock(str(folder / "ddp.lock")):
        outs = {"clean": folder / "clean", "faulty": folder / "faulty", "coll": folder / "coll.h5"}
        if not _RUNS and (folder / "done").exists():   # another worker recorded them
            _RUNS.update(outs)
        if not _RUNS:
            base = 29000 + os.getpid() % 300 * 3
            procs = {"clean": _torchrun(f"{outs['clean']}{os.sep}", base),
                     "faulty": _torchrun(f"{outs['faulty']}{os.sep}", base + 1, "--fault-rank",
                                         str(FAULT_RANK), "--fault-step", str(FAULT_STEP))}
            # alongside: one process that initialises torch.distributed itself
            script = folder / "coll.py"
            script.write_text(COLLECTIVES)
            procs["coll"] = subprocess.Popen(
                [sys.executable, "-m", "tracediff", "record", "-o", str(outs["coll"]),
                 str(script)], env=script_env({"PORT": str(base + 2), **GLOO_ENV}), cwd=ROOT,
                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for key, proc in procs.items():
                out, err = proc.communicate(timeout=600)
                assert proc.returncode == 0, f"{key}: {err[-4000:]}"
            for d in (outs["clean"], outs["faulty"]):
                for f in os.listdir(d):
                    os.chmod(d / f, 0o444)
            (folder / "done").write_text("recorded")
            _RUNS.update(outs)
        return dict(_RUNS)


@pytest.fixture(scope="session")
def ddp_runs(tmp_path_factory):
    return record_ddp_runs(shared_folder(tmp_path_factory, "ddp"))


@pytest.fixture(scope="module")
def located(ddp_runs):
    """`locate clean/ faulty/ --json` (in this process, one rank after the other; the
    replay verdict is left out: it imports torch here, and test_locate.py covers it)."""
    proc = run_cli("locate", ddp_runs["clean"], ddp_runs["faulty"], "--json", "--workers", "1",
                   "--no-explain")
    assert proc.returncode == 1, proc.stderr
    return json.loads(proc.stdout)


def test_torchrun_writes_one_trace_per_rank_into_the_directory(ddp_runs):
    assert sorted(os.listdir(ddp_runs["clean"])) == [f"rank{r}.h5" for r in range(NPROC)]
    for r in range(NPROC):
        with tracediff.load(ddp_runs["clean"] / f"rank{r}.h5") as t:
            assert t.rank == r
            d = t.manifest["distributed"]
            assert (d["rank"], d["world_size"], d["local_rank"], d["backend"]) == \
                (r, NPROC, r, "gloo")
    info = run_cli("info", ddp_runs["clean"] / "rank1.h5", env={"COLUMNS": "200"})
    assert f"rank 1 of {NPROC} (local_rank 1, launcher torchrun, backend gloo)" in info.stdout


def test_output_rule_for_ranks(tmp_path):
    env = {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}
    assert output_path_for("run_a.h5", env) == "run_a.rank2.h5"
    assert output_path_for(f"{tmp_path}/run_a/", env) == f"{tmp_path}/run_a/rank2.h5"
    assert os.path.isdir(tmp_path / "run_a")
    assert output_path_for(str(tmp_path / "run_a"), {}) == str(tmp_path / "run_a" / "trace.h5")
    assert output_path_for("run_a.h5", {}) == "run_a.h5"


def test_allreduce_is_recorded_before_and_after_with_its_group(ddp_runs):
    """DDP's gradient all-reduce: each rank's bucket before (role-IN) and the reduced
    result after (output); the result is the sum of every rank's input."""
    inputs, outputs = [], []
    for r in range(NPROC):
        with tracediff.load(ddp_runs["clean"] / f"rank{r}.h5") as t:
            evs = [i for i in range(len(t)) if t.event(i)["op"] == "c10d::allreduce_"
                   and t.event(i)["phase"] == "backward"]
            assert len(evs) == 2   # one bucket per step
            e = t.event(evs[0])
            assert e["source"] == BACKWARD_LINE and e["step"] == 0
            assert f"group=0, ranks={list(range(NPROC))}, backend=gloo" in e["params"]
            assert "reduce_op=SUM" in e["params"]
            inputs.append(t.read_value(t.value_rows(evs[0], schema.ROLE_IN)[0]))
            outputs.append(t.read_value(t.value_rows(evs[0], schema.ROLE_OUT)[0]))
            assert t.manifest["frameworks"]["torch"]["collectives"]["ops"]["c10d::allreduce_"] == 3
    assert not np.array_equal(inputs[0], inputs[1])          # each rank its own gradient
    for out in outputs:
        assert np.array_equal(out, outputs[0])                # every rank the same result
        np.testing.assert_allclose(out, np.sum(inputs, axis=0), rtol=1e-6, atol=1e-7)
    assert not np.array_equal(inputs[0], outputs[0])


def test_locate_directories_names_the_rank_where_it_started(located):
    f = located["first_beyond_tolerance"]
    assert located["first_rank"] == FAULT_RANK
    assert (f["a"]["rank"], f["b"]["rank"]) == (FAULT_RANK, FAULT_RANK)
    assert f["a"]["op"] == "aten::mul_.Tensor"
    assert f["a"]["step"] == FAULT_STEP and f["a"]["source"] == FAULT_LINE
    assert f["inputs_match"] is True
    assert located["verdict"] == "diverged" and located["exit_code"] == 1
    assert [r["rank"] for r in located["ranks"]] == list(range(NPROC))


def test_locate_directories_says_how_it_spread(located):
    spread = {s["rank"]: s for s in located["spread"]}
    assert sorted(spread) == [r for r in range(NPROC) if r != FAULT_RANK]
    for s in spread.values():
        # the next step's gradient all-reduce carried rank 2's parameters' difference
        assert s["via"] == "c10d::allreduce_" and s["step"] == FAULT_STEP + 1
        assert s["source"] == BACKWARD_LINE
        assert "device" not in s   # torch on the CPU records no device (JAX traces do)
    ranks = {r["rank"]: r for r in located["ranks"]}
    assert ranks[0]["at_collective"] and ranks[0]["inputs_match"] is True
    assert not ranks[FAULT_RANK]["at_collective"]
    assert ranks[FAULT_RANK]["collective"] < ranks[0]["collective"]



ACTIVATION_LINE = fixture_line("torch_ddp.py", "h = h * (1 + 1e-3 if fault else 1.0)")


@pytest.fixture(scope="module")
def activation_fault(ddp_runs, tmp_path_factory):
    """The 3-rank run with rank 1's hidden activation scaled in step 0, before the
    gradient all-reduce (~15 s), against the clean run: `locate --json`."""
    out = tmp_path_factory.mktemp("activation")
    proc = _torchrun(f"{out}{os.sep}", 27000 + os.getpid() % 500, "--fault", "activation",
                     "--fault-rank", "1", "--fault-step", "0")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    proc = run_cli("locate", ddp_runs["clean"], out, "--json", "--workers", "1", "--no-explain")
    assert proc.returncode == 1, proc.stderr
    return json.loads(proc.stdout)


def test_at_one_collective_the_rank_that_differed_before_it_goes_first(activation_fault):
    """Rank 1 differs before step 0's gradient all-reduce; ranks 0 and 2 first differ at
    that all-reduce (their inputs still match): the same step and the same number of
    collectives before, and the divergence before the collective comes first, whatever
    the rank numbers (rank 0 was named by rank order)."""
    r = activation_fault
    ranks = {x["rank"]: x for x in r["ranks"]}
    assert ranks[1]["collective"] == ranks[0]["collective"] == ranks[2]["collective"]
    assert not ranks[1]["at_collective"] and ranks[0]["at_collective"] and ranks[2]["at_collective"]
    assert r["first_rank"] == 1
    f = r["first_beyond_tolerance"] or r["first_difference"]
    assert (f["a"]["rank"], f["a"]["step"], f["a"]["source"]) == (1, 0, ACTIVATION_LINE)
    spread = {s["rank"]: s for s in r["spread"]}
    assert sorted(spread) == [0, 2]
    assert all(s["via"] == "c10d::allreduce_" and s["step"] == 0 for s in spread.values())


def test_locate_directories_terminal_and_globs(ddp_runs):
    proc = run_cli("locate", f"{ddp_runs['clean']}/rank*.h5", f"{ddp_runs['faulty']}/rank*.h5",
                   "--workers", "1", "--no-explain", env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert f"it started on rank {FAULT_RANK}: aten::mul_.Tensor step {FAULT_STEP}" in out
    assert "rank 0 inherited it through c10d::allreduce_" in out
    assert f"step {FAULT_STEP} rank {FAULT_RANK}" in out   # the full report's event line


def test_same_runs_match(ddp_runs):
    proc = run_cli("locate", ddp_runs["clean"], ddp_runs["clean"], "--json", "--workers", "1",
                   "--no-explain")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "match" and report["first_rank"] is None
    assert all(r["verdict"] == "match" for r in report["ranks"])


def test_one_rank_compared_on_too_little_makes_the_run_inconclusive(ddp_runs, tmp_path):
    """Rank 1 of the golden keeps metadata only (no bytes, no hash: nothing of it can be
    compared); ranks 0 and 2 match. No rank differs, but the run is no MATCH."""
    import h5py

    golden = tmp_path / "golden"
    shutil.copytree(ddp_runs["clean"], golden)
    for f in os.listdir(golden):
        os.chmod(golden / f, 0o644)
    with h5py.File(golden / "rank1.h5", "r+") as f:
        v = f["values"][...]
        v["flags"] = (v["flags"] | schema.VFLAG_NOT_STORED) & ~np.uint8(schema.VFLAG_STATS)
        v["offset"] = -1
        f["values"][...] = v
    proc = run_cli("locate", golden, ddp_runs["clean"], "--json", "--workers", "1",
                   "--no-explain")
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "inconclusive"
    assert {r["rank"]: r["verdict"] for r in report["ranks"]} == \
        {0: "match", 1: "inconclusive", 2: "match"}


FUNCTIONAL = """
import os
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
x = torch.arange(4.0) + 1
y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
z = (y + 1).sum()
dist.all_reduce(x)
print(float(z))
dist.destroy_process_group()
"""


def test_a_functional_collective_is_counted_once_where_it_is_issued(tmp_path):
    """DTensor's exchanges are functional collectives: one op issues it (`all_reduce`),
    others only wrap or wait for its result (`_wrap_tensor_autograd`, `wait_tensor`).
    The collectives before an event count the issue once, beside the c10d ones."""
    from tracediff.diff.distributed.ranks import collectives_before

    require_loopback()
    script, out = tmp_path / "funcol.py", tmp_path / "funcol.h5"
    script.write_text(FUNCTIONAL)
    proc = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", str(out),
                           str(script)], cwd=ROOT, text=True, capture_output=True, timeout=300,
                          env=script_env({"PORT": str(30000 + os.getpid() % 1000), **GLOO_ENV}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with tracediff.load(out) as t:
        ops = [t.event(i)["op"] for i in range(len(t))]
        assert "_c10d_functional::all_reduce" in ops and "c10d::allreduce_" in ops
        issued = ops.index("_c10d_functional::all_reduce")
        summed = ops.index("aten::sum")
        last = len(ops) - 1
        assert [collectives_before(t, i) for i in (issued, summed, last)] == [0, 1, 2]


@pytest.mark.parametrize("case", ["empty", "ranks", "not_a_trace", "missing", "misnamed"])
def test_bad_rank_sets_are_one_line_errors(ddp_runs, tmp_path, case):
    other = tmp_path / "other"
    other.mkdir()
    if case == "ranks":      # the same run with rank 3 missing
        for r in range(NPROC - 1):
            shutil.copy(ddp_runs["clean"] / f"rank{r}.h5", other)
    elif case == "not_a_trace":
        for r in range(NPROC):
            shutil.copy(ddp_runs["clean"] / f"rank{r}.h5", other)
        (other / "notes.h5").write_text("not a trace")
    elif case == "missing":
        other = tmp_path / "nowhere"
    elif case == "misnamed":   # rank 0 and rank 1 swapped by their file names
        for r in range(NPROC):
            shutil.copyfile(ddp_runs["clean"] / f"rank{r}.h5", other / f"rank{(1 - r) if r < 2 else r}.h5")
    proc = run_cli("locate", ddp_runs["clean"], other, "--workers", "1")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    expected = {"empty": "no traces (*.h5)", "ranks": "different ranks: ",
                "not_a_trace": "notes.h5", "missing": "no such directory",
                "misnamed": "named as rank 0, but its manifest says rank 1"}[case]
    assert expected in lines[0]


def test_dask_cluster_and_process_pool_give_the_same_json(ddp_runs):
    """The per-rank work on a Dask LocalCluster (in this process), on a local process
    pool and in this process: one result."""
    distributed = pytest.importorskip("distributed")
    a, b = ddp_runs["clean"], ddp_runs["faulty"]
    local = run_cli("locate", a, b, "--json", "--no-explain", "--workers", "1")
    pooled = run_cli("locate", a, b, "--json", "--no-explain", "--workers", "2")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        on_dask = run_cli("locate", a, b, "--json", "--no-explain", "--scheduler",
                          cluster.scheduler_address)
        replicas_dask = run_cli("replicas", b, "--json", "--scheduler", cluster.scheduler_address)
    replicas_local = run_cli("replicas", b, "--json", "--workers", "1")
    assert local.returncode == pooled.returncode == on_dask.returncode == 1, on_dask.stderr
    assert json.loads(on_dask.stdout) == json.loads(local.stdout) == json.loads(pooled.stdout)
    assert json.loads(replicas_dask.stdout) == json.loads(replicas_local.stdout)
    assert json.loads(replicas_dask.stdout)["first"]["rank"] == FAULT_RANK



def test_every_collective_kind_is_recorded_with_inputs_outputs_and_group(ddp_runs):
    """One process that initialises torch.distributed itself (no launcher): each c10d op
    with its inputs, its outputs after the Work, its group; the manifest's
    `distributed` section comes from the default group."""
    out = ddp_runs["coll"]
    with tracediff.load(out) as t:
        assert t.manifest["distributed"] == {"rank": 0, "world_size": 1, "local_rank": None,
                                             "launcher": "torch.distributed",
                                             "backend": "gloo"}
        evs = {t.event(i)["op"]: i for i in range(len(t)) if t.event(i)["op"].startswith("c10d::")}
        assert set(evs) >= {"c10d::allreduce_", "c10d::broadcast_", "c10d::allgather_",
                            "c10d::_allgather_base_", "c10d::_reduce_scatter_base_"}
        for op, i in evs.items():
            assert "group=0, ranks=[0], backend=gloo" in t.event(i)["params"], op
            assert len(t.value_rows(i, schema.ROLE_IN)) >= 1, op
            assert len(t.value_rows(i, schema.ROLE_OUT)) >= 1, op
        assert "reduce_op=MAX" in t.event(evs["c10d::allreduce_"])["params"]
        gathered = t.read_value(t.value_rows(evs["c10d::allgather_"], schema.ROLE_OUT)[0])
        np.testing.assert_array_equal(gathered, (np.arange(4.0) + 1) * 2)
        scattered = t.value_rows(evs["c10d::_reduce_scatter_base_"], schema.ROLE_OUT)
        np.testing.assert_array_equal(t.read_value(scattered[0]), (np.arange(4.0) + 1) * 4)


def test_reports_show_the_rank(ddp_runs, tmp_path):
    """Markdown and HTML name the rank of the compared traces (one rank's pair), and
    their commands reproduce the torchrun job."""
    a, b = ddp_runs["clean"] / f"rank{FAULT_RANK}.h5", ddp_runs["faulty"] / f"rank{FAULT_RANK}.h5"
    for ext in ("md", "html"):
        out = tmp_path / f"report.{ext}"
        proc = run_cli("report", a, b, "-o", out)
        assert proc.returncode == 0 and "verdict: diverged" in proc.stderr, proc.stderr
        text = out.read_text()
        assert (f"| rank | {FAULT_RANK} |" if ext == "md"
                else f"<tr><td>rank</td><td>{FAULT_RANK}</td></tr>") in text
    # the reproduce block records every rank under torchrun and compares the folders
    assert (f"python -m torch.distributed.run --nproc-per-node {NPROC} -m tracediff record "
            f"-o run_b/ torch_ddp.py --fault-rank {FAULT_RANK}") in text
    assert "tracediff locate run_a/ run_b/" in text


def test_a_scheduler_that_accepts_and_never_answers_is_given_up_on(monkeypatch):
    """A server on 127.0.0.1 that accepts the connection and stays silent: Dask's own
    timeout covers the TCP connect only, so the client waited as long as the server kept
    the socket open. Connecting (the handshake included) is bounded by pool.CONNECT_S
    (2 s here); the server lets go after 120 s, so the unfixed code ends too."""
    import socket
    import threading

    require_loopback()   # the silent server listens on 127.0.0.1
    pytest.importorskip("distributed")
    from tracediff.diff.distributed import pool
    from tracediff.errors import TraceError

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(1.0)
    held, stop = [], threading.Event()

    def accept():
        for _ in range(120):          # bounded: at most 120 one-second waits
            if stop.is_set():
                break
            try:
                held.append(server.accept()[0])
            except socket.timeout:
                pass
        for c in held:
            c.close()
        server.close()

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setattr(pool, "CONNECT_S", 2.0, raising=False)
    try:
        with pytest.raises(TraceError) as err:
            pool.run(pool.default_workers, [(1,), (2,)], scheduler=address)
    finally:
        stop.set()
        th.join(5)
    assert str(err.value) == f"cannot reach the Dask scheduler {address}: no answer within 2 s"
    assert held   # it did accept: the connection was made and then nothing came
