"""Recording a script that does unfriendly things to its own process: forks (children
that run the parent's exit path), odd sys.exit arguments, closing every file descriptor
(os.closerange) and deleting or replacing the trace while it is being written.

Every case runs a real script under `tracediff record` in a subprocess and checks what a
user relies on: the script's own files and exit status are untouched, the trace that is
claimed as written opens and says how the run ended, and a trace that could not be kept
is reported as lost (exit status non-zero) instead of "trace written".
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from tracediff.cli import main as cli_main
from tracediff.trace.reader import Trace

from .helpers import run_cli

TIMEOUT = 300


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _plain(script, *args):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, str(script), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=script.parent)


def _record(script, out, *args, env=None):
    return run_cli("record", "-o", out, script, *args, cwd=script.parent, timeout=TIMEOUT,
                   env=env)


def _info(out):
    """`tracediff info --json` (in-process: the recording is what runs in a subprocess)."""
    res = CliRunner().invoke(cli_main, ["info", "--json", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _ops(out):
    with Trace(out) as t:
        return [t.string(int(x)) for x in t.events["op"]]


# -- forks -------------------------------------------------------------------------------------

# A fork Pool started before torch is imported: its worker imports torch itself (so a
# capture would be installed in the child) while the parent has already flushed values
# to the trace. Then a forked child runs ops and leaves with sys.exit, which runs the
# parent's exit path (runpy, the recorder's `finally`, atexit) in the child.
FORKS = """\
    import multiprocessing as mp
    import os
    import sys

    def work(i):
        import torch
        return float(torch.full((600, 600), 7.25).mul(i).sum())

    if __name__ == "__main__":
        with mp.get_context("fork").Pool(1) as pool:
            import torch
            torch.set_num_threads(1)   # OpenMP's thread pool does not survive a fork
            x = torch.ones(600, 600) * 2
            print("pool", pool.map(work, range(2)))
        pid = os.fork()
        if pid == 0:
            y = torch.full((600, 600), 7.25) + 1
            print("child", float(y[0, 0]), flush=True)
            sys.exit(5)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        print("parent", float((x - 1).sum()))
"""
FORKS_STDOUT = "pool [0.0, 2610000.0]\nchild 8.25\nchild exit 5\nparent 360000.0\n"
PARENT_OPS = ["aten::ones", "aten::mul.Tensor", "aten::sub.Tensor", "aten::sum",
              "aten::_local_scalar_dense"]


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("forks")
    script = _script(folder, "forks.py", FORKS)
    out = folder / "forks.h5"
    return out, _record(script, out)


def test_forked_child_that_exits_never_touches_the_parents_trace(forks):
    out, proc = forks
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == FORKS_STDOUT
    # one trace, claimed once (by the parent); no warning of a truncated or damaged
    # trace, no traceback from a worker terminated by the Pool (SIGTERM)
    assert proc.stderr.count("trace written") == 1, proc.stderr
    assert "warning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    info = _info(out)
    assert info["complete"] is True
    assert info["manifest"]["end"] == {"status": "completed", "exit_code": 0}
    # the parent's ops, before and after the fork; none of the child's (aten::add, full)
    assert _ops(out) == PARENT_OPS


def test_fork_pool_workers_never_write_into_the_trace(forks):
    out, proc = forks
    # the worker's and the child's values (7.25, 8.25, 14.5) are nowhere in the file
    data = out.read_bytes()
    for v in (7.25, 8.25, 14.5):
        assert np.full(256, v, np.float32).tobytes() not in data, v
    # and the parent's values, flushed before the worker ran, are intact
    with Trace(out) as t:
        assert [t.string(int(x)) for x in t.events["op"]] == PARENT_OPS
        (x,) = t.outputs(1)
        assert x.shape == (600, 600) and (x == 2).all()


# -- sys.exit ----------------------------------------------------------------------------------

EXITS = ["True", "'msg'", "None", "2**70", "3.5", "256"]


def test_sys_exit_status_is_what_python_would_exit_with(tmp_path):
    """The manifest's exit_code is the process exit status Python turns the argument into
    (an int), the recorder exits with it and prints what Python prints; the trace opens."""
    script = _script(tmp_path, "ex.py", """\
        import sys
        print("before")
        sys.exit(eval(sys.argv[1]))
    """)
    wrong = []
    for i, arg in enumerate(EXITS):
        plain = _plain(script, arg)
        out = tmp_path / f"ex{i}.h5"
        proc = _record(script, out, arg)
        info = CliRunner().invoke(cli_main, ["info", "--json", str(out)])
        end = json.loads(info.output)["manifest"]["end"] if info.exit_code == 0 else info.output
        script_stderr = [x for x in proc.stderr.splitlines() if not x.startswith("tracediff: ")]
        got = (proc.returncode, proc.stdout, script_stderr, end)
        want = (plain.returncode, plain.stdout, plain.stderr.splitlines(),
                {"status": "sys.exit", "exit_code": plain.returncode,
                 **({"message": plain.stderr.strip()} if plain.stderr else {})})
        if got != want or type(end["exit_code"]) is not int:
            wrong.append(f"sys.exit({arg}): got {got}, want {want}")
    assert not wrong, "\n".join(wrong)


CLOSE_STD = """\
    import os, sys
    import torch
    x = torch.ones(3) * 2
    os.close(0); os.close(1); os.close(2)
    if sys.argv[1:] == ["reuse"]:   # the numbers come back for the script's own files
        assert [os.open(f"own{i}.txt", os.O_WRONLY | os.O_CREAT) for i in range(3)] == [0, 1, 2]
    y = x + 1
    sys.exit(4)
"""


@pytest.mark.parametrize("reuse", [False, True])
def test_a_script_that_closes_its_standard_descriptors_keeps_its_status(tmp_path, reuse):
    """Before: exit 1 (tracediff's closing line failed on the closed stderr), and with the
    numbers reused that line went into the script's own file."""
    script = _script(tmp_path, "closer.py", CLOSE_STD)
    args = ("reuse",) if reuse else ()
    assert _plain(script, *args).returncode == 4
    out = tmp_path / "closer.h5"
    proc = _record(script, out, *args)
    assert proc.returncode == 4, proc.stderr
    assert _info(out)["manifest"]["end"] == {"status": "sys.exit", "exit_code": 4}
    assert _ops(out) == ["aten::ones", "aten::mul.Tensor", "aten::add.Tensor"]
    if reuse:
        for i in range(3):
            assert (tmp_path / f"own{i}.txt").read_bytes() == b""


def test_sys_exit_true_in_a_recorded_block_leaves_a_readable_trace(tmp_path):
    """tracediff.record(): the exit code of a sys.exit inside the block is an int too."""
    import tracediff

    out = tmp_path / "block.h5"
    with pytest.raises(SystemExit):
        with tracediff.record(out, frameworks=("jax",)):
            sys.exit(True)
    with Trace(out) as t:
        assert t.complete and t.manifest["end"] == {"status": "sys.exit", "exit_code": 1}
        assert type(t.manifest["end"]["exit_code"]) is int


# -- os.closerange -----------------------------------------------------------------------------

CLOSERANGE = """\
    import os
    import sys

    import torch

    x = torch.ones(600, 600) * 2
    os.closerange(3, 4096)            # also closes the trace's file descriptor
    with open("out.txt", "w+") as f:  # and gets its number back (read-write, as HDF5 needs)
        f.write("line 1\\n")
        f.flush()
        y = torch.ones(800, 800) * 3  # recorded (and flushed) while out.txt is open
        f.write(f"line 2 {float(y.sum())}\\n")
    print(float((x + 1).sum()))
"""


def test_closerange_never_writes_into_the_scripts_files_and_keeps_the_trace(tmp_path):
    script = _script(tmp_path, "closer.py", CLOSERANGE)
    out = tmp_path / "closer.h5"
    proc = _record(script, out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "1080000.0\n"
    assert (tmp_path / "out.txt").read_bytes() == b"line 1\nline 2 1920000.0\n"
    assert "the script closed the trace's file descriptor" in proc.stderr
    assert "trace written" in proc.stderr
    info = _info(out)
    assert info["complete"] is True
    assert info["manifest"]["end"] == {"status": "completed", "exit_code": 0}
    assert info["manifest"]["recording"]["reopened"] >= 1
    ops = _ops(out)
    assert ops.count("aten::ones") == 2 and ops[-2:] == ["aten::sum", "aten::_local_scalar_dense"]
    with Trace(out) as t:   # the values after closerange are there and right
        (y,) = t.outputs(ops.index("aten::mul.Tensor", 2))
        assert y.shape == (800, 800) and float(y.sum()) == 1920000.0


CLOSE_ALL_THEN_EXIT = """\
    import os

    import torch

    x = torch.ones(4) * 2
    print("before", flush=True)
    os.closerange(0, 65536)           # stdin, stdout, stderr and the trace's descriptors
    os._exit(4)
"""


def test_os_exit_after_closing_every_descriptor_keeps_its_status(tmp_path):
    """Issue 53, finding 10: a script that closes every descriptor, then `os._exit(4)`,
    ends with 4 recorded as plain. Before: tracediff's `os._exit` closed the trace, then
    printed "trace written" to the closed stderr; the print raised, the handler's own
    error message raised again, and the script died of that exception (exit 1) before
    the real `os._exit` ran."""
    script = _script(tmp_path, "close_all.py", CLOSE_ALL_THEN_EXIT)
    plain = _plain(script)
    assert plain.returncode == 4 and plain.stdout == "before\n"
    out = tmp_path / "close_all.h5"
    proc = _record(script, out)
    assert (proc.returncode, proc.stdout) == (plain.returncode, plain.stdout), proc.stderr
    info = _info(out)
    assert info["complete"] is True
    assert info["manifest"]["end"] == {"status": "os._exit", "exit_code": 4}
    assert "aten::mul.Tensor" in _ops(out)


ENDS_UNFLUSHED = """\
    import os, sys

    print("buffered", end="")         # a pipe: block-buffered, in the process only
    print("partial", end="", file=sys.stderr)
    if sys.argv[1] == "os._exit":
        os._exit(4)
    os.execv(sys.executable, [sys.executable, "-c", "print('exec ran')"])
"""


@pytest.mark.parametrize("how", ["os._exit", "exec"])
def test_os_exit_and_exec_leave_the_scripts_buffered_output_unwritten(tmp_path, how):
    """`os._exit` and `os.exec*` end the process without flushing sys.stdout and
    sys.stderr: what they held is never written. Before, tracediff flushed them when it
    closed the trace first, so the recorded run printed what the plain run does not."""
    script = _script(tmp_path, "unflushed.py", ENDS_UNFLUSHED)
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)
    env.pop("XLA_FLAGS", None)
    plain = subprocess.run([sys.executable, str(script), how], env=env, capture_output=True,
                           text=True, timeout=TIMEOUT, cwd=script.parent)
    assert (plain.returncode, plain.stdout, plain.stderr) == \
        ((4, "", "") if how == "os._exit" else (0, "exec ran\n", ""))
    out = tmp_path / "unflushed.h5"
    proc = _record(script, out, how, env={"PYTHONUNBUFFERED": ""})
    script_stderr = [x for x in proc.stderr.splitlines() if not x.startswith("tracediff: ")]
    assert (proc.returncode, proc.stdout, script_stderr) == (plain.returncode, plain.stdout, [])
    assert _info(out)["manifest"]["end"]["status"] == how


def test_an_fsync_whose_duplicate_the_script_closed_is_no_write_error(tmp_path):
    """The flush's fsync runs in a thread on a duplicate of the trace's descriptor, and
    `os.closerange(3, 4096)` closes that one too. Before: the thread's EBADF was taken for
    a write error and the trace was cut after 0 events (CI, once in ~20 runs of the test
    above). Here the race is laid out step by step: the duplicate closed, then closed and
    its number reused for the script's own file."""
    from tracediff.trace.writer import TraceFile
    from tracediff.trace.writer.fsync import _Fsync

    trace = TraceFile(tmp_path / "trace.bin")
    trace.write(b"x" * 4096)
    sync = _Fsync(trace)
    sync.wait()                                 # the ordinary case: synced in the thread
    assert not sync.again

    dup = os.dup(trace.fd)
    os.close(dup)                               # the script's closerange
    sync._run(dup)
    sync.wait()                                 # no error: the trace is synced again
    assert sync.again

    sync.again = False
    dup = os.dup(trace.fd)
    os.close(dup)
    own = os.open(tmp_path / "own.txt", os.O_WRONLY | os.O_CREAT)
    assert own == dup                           # the script's file got the number
    sync._run(dup)
    sync.wait()
    assert sync.again
    os.write(own, b"still open\n")             # the script's descriptor was not closed
    os.close(own)
    assert (tmp_path / "own.txt").read_bytes() == b"still open\n"
    trace.close()


def test_closerange_then_replaced_trace_is_reported_lost(tmp_path):
    """The descriptor is gone and the path now holds the script's own file: nothing can
    be kept. The script's files stay as it wrote them; tracediff says so and exits 2."""
    script = _script(tmp_path, "replacer.py", """\
        import logging
        import os
        import sys

        os.closerange(3, 4096)
        # the log gets the trace's old descriptor number and stays open to the end
        logging.basicConfig(filename="log.txt", filemode="w", format="%(message)s")
        logging.warning("started")
        os.remove(sys.argv[1])
        with open(sys.argv[1], "w") as f:
            f.write("the script's own file\\n")
        logging.warning("done")
        print("done")
    """)
    out = tmp_path / "replaced.h5"
    proc = _record(script, out, out)
    assert proc.stdout == "done\n"
    assert (tmp_path / "log.txt").read_bytes() == b"started\ndone\n"
    assert out.read_text() == "the script's own file\n"
    assert proc.returncode == 2
    assert "trace written" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tracediff: error: recording lost: the script closed the trace's "
                           "file descriptor"), proc.stderr
    assert "exited with status 0" in last


# -- the trace deleted while it is written -----------------------------------------------------

def test_trace_deleted_during_recording_is_reported_not_written(tmp_path):
    script = _script(tmp_path, "deleter.py", """\
        import os
        import sys

        os.remove(sys.argv[1])
        print("deleted")
        sys.exit(3)
    """)
    out = tmp_path / "deleted.h5"
    proc = _record(script, out, out)
    assert proc.stdout == "deleted\n"
    assert not out.exists()
    assert proc.returncode == 2
    assert "trace written" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (f"tracediff: error: recording lost: {out} was deleted during recording "
                    f"(the script exited with status 3)"), proc.stderr
