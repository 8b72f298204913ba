"""Two-process `jax.distributed` runs of fixtures/jax_distributed_dp.py under `tracediff
record` (localhost coordinator on a free port, gloo CPU collectives, both processes
started together, bounded timeouts), and the numpy truth of the case, computed without
tracediff or JAX. Used by tests/test_jax_processes.py (main suite) and
tests/field/test_jax_distributed.py."""

import os
import socket
import subprocess
import sys

import numpy as np

from .helpers import FIXTURES, ROOT, fixture_line, require_loopback, script_env

SCRIPT = os.path.join(FIXTURES, "jax_distributed_dp.py")
NPROC = 2
TIMEOUT = 300   # seconds a run may take (about 30 s per process here, mostly imports)
BAD_PROCESS, BAD_ROW, BAD_COL = 1, 2, 1   # the element process 1 perturbs in its own rows


def line_of(text):
    """`jax_distributed_dp.py:N`, the fixture's line holding `text`."""
    return fixture_line("jax_distributed_dp.py", text)


def free_port():
    require_loopback()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(out_dir, mode, options=()):
    """Both processes of one run, started together: `JAX_PROCESS_ID=i JAX_NUM_PROCESSES=2
    tracediff record OPTIONS -o OUT_DIR/ jax_distributed_dp.py i PORT MODE`."""
    port = str(free_port())
    return [subprocess.Popen(
        [sys.executable, "-m", "tracediff", "record", *options, "-o", f"{out_dir}{os.sep}",
         SCRIPT,
         str(i), port, mode],
        env=script_env({"JAX_PROCESS_ID": str(i), "JAX_NUM_PROCESSES": str(NPROC),
                        "OMP_NUM_THREADS": "1"}),
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(NPROC)]


def record_runs(folder, modes, options=None):
    """{name: folder/name} of per-process traces (rank0.h5, rank1.h5), the runs of all
    `modes` started at once (`options`: {name: (mode, record options)} for more); a
    process that has not finished in TIMEOUT seconds is killed (with every other) and the
    test fails with what they printed."""
    runs = {m: (m, ()) for m in modes}
    runs.update(options or {})
    procs = {name: start(folder / name, m, opts) for name, (m, opts) in runs.items()}
    failed = []
    for m, ps in procs.items():
        for i, p in enumerate(ps):
            try:
                out, err = p.communicate(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                for q in (q for qs in procs.values() for q in qs):
                    q.kill()
                out, err = p.communicate()
                failed.append(f"{m} process {i}: timed out after {TIMEOUT} s: {err[-2000:]}")
                continue
            if p.returncode != 0:
                failed.append(f"{m} process {i}: exit {p.returncode}: {err[-3000:]}")
    assert not failed, "\n".join(failed)
    return {name: folder / name for name in runs}


def data():
    """The global batch (X, Y) the script builds, from the same seed."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal((8, 4)).astype(np.float32),
            rng.standard_normal((8,)).astype(np.float32))


def bad_element():
    """(global row, column, clean value, perturbed value) of the one element that differs:
    row BAD_ROW of process 1's four rows, so in its own shard (rows 4:8)."""
    x, _ = data()
    row = BAD_PROCESS * 4 + BAD_ROW
    local = x[BAD_PROCESS * 4:(BAD_PROCESS + 1) * 4].copy()
    local[BAD_ROW, BAD_COL] += 1e-3
    return row, BAD_COL, float(x[row, BAD_COL]), float(local[BAD_ROW, BAD_COL])


def first_step_params(perturbed=False):
    """w after step 0 in float64: w0 = 0, so the mean-squared-error gradient of process
    p's rows is (2/4) X_p^T (0 - Y_p). Inside a `shard_map` with check_vma, JAX's
    autodiff already sums the gradient of a replicated parameter over the axis (the
    transpose of its implicit pvary), so the user's pmean averages two equal sums: the
    step uses the sum of the two processes' gradients; w1 = -0.1 (g_0 + g_1)."""
    x, y = data()
    x = x.astype(np.float64)
    if perturbed:
        row, col, _, value = bad_element()
        x[row, col] = value
    grads = [0.5 * x[p * 4:(p + 1) * 4].T @ (-y[p * 4:(p + 1) * 4].astype(np.float64))
             for p in range(NPROC)]
    return -0.1 * (grads[0] + grads[1])
