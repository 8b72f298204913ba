"""Reliability: signals, SIGKILL at random points, bad input to every command, full disk,
recording never perturbs the script, rank detection and threads (torchrun runs are in
test_ranks.py and test_replicas.py).

Crash tests for an exception and sys.exit(n) are in test_jax_capture.py; the forked
DataLoader test is in test_torch_capture.py.
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

import tracediff
from tracediff.cli import main as cli_main
from tracediff.errors import TraceError
from tracediff.runner.output import distributed_rank, output_path_for

from .helpers import (FIXTURES, ROOT, check_values as _check_values, record, run_cli, run_plain,
                      script_env as _env)

KILL_SEED = int(os.environ.get("TRACEDIFF_KILL_SEED", "6"))


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


# -- signals ---------------------------------------------------------------------------------

LOOPING = """
    import sys, time, torch
    x = torch.ones(8)
    for i in range(3):
        x = torch.sin(x) * 1.5
    print("ready", flush=True)
    while True:
        x = torch.cos(x)
        time.sleep(0.01)
"""


@pytest.mark.parametrize("sig, code, status", [(signal.SIGINT, 130, "interrupted (SIGINT)"),
                                               (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_signal_leaves_a_complete_trace_and_dies_by_that_signal(tmp_path, sig, code, status):
    """The plain script dies by the signal (Python re-raises an uncaught Ctrl-C's SIGINT
    once finalized; SIGTERM's default action kills): so does `record`, once the trace is
    written, so a parent sees -SIG (a shell 128+SIG), as it would without tracediff."""
    script = _script(tmp_path, "loop.py", LOOPING)
    out = tmp_path / "sig.h5"
    # A suite started as a background job (`cmd &` in a script) ignores SIGINT, and a child
    # inherits an ignored signal: give this process a handler while starting the child, so
    # the child gets the default (and Python's KeyboardInterrupt) whatever ran the suite.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tracediff", "record", "-o", str(out),
                                 str(script)], env=_env(), cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, old)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -sig, stderr
    assert "trace written" in stderr
    assert "Traceback" not in stderr
    with tracediff.load(out) as t:
        assert t.complete and len(t) > 10
        end = t.manifest["end"]
        assert end["status"] == status and end["exit_code"] == code
        assert "loop.py" in end["traceback"]  # where the script was when the signal came
        _check_values(t)


BLOCKED_IN_C = """
    import ctypes, os, sys, torch
    x = torch.ones(8)
    for i in range(3):
        x = torch.sin(x) * 1.5
    if sys.argv[2:] == ["closerange"]:
        os.closerange(3, 65536)     # every descriptor but the standard ones: tracediff's too
    print("ready", flush=True)
    # a C call that waits without returning to Python when a signal comes (system()
    # retries its waitpid on EINTR), as a jax.distributed wait for a missing peer does
    ctypes.CDLL(None).system(sys.argv[1].encode())
    print("returned", flush=True)
"""


def _alive(marker):
    return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0


@pytest.mark.parametrize("closes", [False, True], ids=["", "after-closerange"])
@pytest.mark.parametrize("recorded", [False, True], ids=["plain", "recorded"])
def test_sigterm_while_blocked_in_a_c_call_ends_the_run_as_the_plain_one(tmp_path, recorded,
                                                                         closes):
    """The plain script dies at once by SIGTERM's default action; recorded, Python's handler
    ran only when the blocking call returned (a jax.distributed wait: five minutes past a
    `timeout`). Now the trace is closed from tracediff's watch thread within its grace
    period and the process dies by SIGTERM, as the plain one does, while the C call's
    child still runs; its end says why. Also after the script closed every descriptor
    (`os.closerange(3, 65536)` closed the watch's socket: SIGTERM waited for the call),
    and the torch capture is not reported stopped (the watch thread looked for the
    dispatch mode on its own thread's mode stack)."""
    script = _script(tmp_path, "blocked.py", BLOCKED_IN_C)
    out = tmp_path / "blocked.h5"
    marker = f"sleep 59.{os.getpid()}{int(recorded)}{int(closes)}"   # to find it by after
    child = f"exec {marker} >/dev/null 2>&1"   # no shell left holding the pipes read
    args = [child, "closerange"] if closes else [child]
    cmd = ([sys.executable, "-m", "tracediff", "record", "-o", str(out), str(script), *args]
           if recorded else [sys.executable, str(script), *args])
    proc = subprocess.Popen(cmd, env=_env(), cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
        blocked_still = _alive(marker)    # the run ended while the C call still waited
    finally:
        subprocess.run(["pkill", "-f", marker], check=False)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGTERM, stderr
    assert "returned" not in stdout
    assert blocked_still, "SIGTERM took effect only once the C call returned"
    if recorded:
        assert "Traceback" not in stderr and "trace written" in stderr, stderr
        assert "STOPPED" not in stderr, stderr
        with tracediff.load(out) as t:
            assert t.complete and len(t) > 3
            end = t.manifest["end"]
            assert (end["status"], end["exit_code"]) == ("terminated (SIGTERM)", 143)
            assert "blocked" in end["message"]
            assert "recording_error" not in t.manifest["frameworks"]["torch"]


def test_sigterm_the_main_thread_takes_within_the_grace_keeps_where_the_script_was(tmp_path):
    """A C call that returns soon after SIGTERM (here system() of a short sleep) gives the
    main thread the signal within the watch thread's grace: Python's handler closes the
    trace, which keeps the script's traceback (where it was), not the watch's "blocked"
    end; the run dies by SIGTERM and prints nothing more, as the plain one."""
    script = _script(tmp_path, "blocked.py", BLOCKED_IN_C)
    out = tmp_path / "soon.h5"
    got = {}
    for how, cmd in [("plain", [sys.executable, str(script), "sleep 0.3"]),
                     ("recorded", [sys.executable, "-m", "tracediff", "record", "-o", str(out),
                                   str(script), "sleep 0.3"])]:
        got[how] = _signalled_at_ready(cmd, signal.SIGTERM)
    assert got["recorded"][:2] == got["plain"][:2] == (-signal.SIGTERM, ""), got
    with tracediff.load(out) as t:
        end = t.manifest["end"]
        assert t.complete and (end["status"], end["exit_code"]) == ("terminated (SIGTERM)", 143)
        assert "blocked.py" in end["traceback"] and "message" not in end, end


IN_AN_OP = """
    import atexit, os, signal, sys, torch
    atexit.register(lambda: print("atexit ran", flush=True))

    @torch.library.custom_op("attack::term", mutates_args=())
    def term(x: torch.Tensor) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGTERM)   # taken while tracediff records this op
        return x.clone()

    x = torch.ones(8)
    for _ in range(3):
        x = torch.sin(x) * 1.5
    print("buffered", end="")               # a pipe: block-buffered, in the process only
    try:
        try:
            y = term(x) + 1
            print("went on", flush=True)
        except:
            print("except ran", flush=True)
            raise
    finally:
        print("finally ran", flush=True)
"""


def test_sigterm_taken_inside_the_recorder_ends_the_run_where_the_plain_one_ends(tmp_path):
    """SIGTERM taken while tracediff records an op (here sent by the op's own Python
    kernel) waits for tracediff's frames to return, then ends the process there: no
    `except`, `finally` or atexit handler of the script, its buffered output unwritten,
    death by SIGTERM, as the plain run. Before, tracediff's handler raised into the
    script, which ran its `except` and `finally` blocks and flushed its output."""
    script = _script(tmp_path, "in_op.py", IN_AN_OP)
    out = tmp_path / "in_op.h5"
    env = _env()
    env.pop("PYTHONUNBUFFERED", None)
    got = {}
    for how, cmd in [("plain", [sys.executable, str(script)]),
                     ("recorded", [sys.executable, "-m", "tracediff", "record", "-o", str(out),
                                   str(script)])]:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        lines = [x for x in proc.stderr.splitlines() if not x.startswith("tracediff: ")]
        got[how] = (proc.returncode, proc.stdout, lines)
    assert got["recorded"] == got["plain"] == (-signal.SIGTERM, "", []), got
    with tracediff.load(out) as t:
        end = t.manifest["end"]
        assert t.complete and (end["status"], end["exit_code"]) == ("terminated (SIGTERM)", 143)
        assert "term(x)" in end["traceback"], end
        assert [t.event(i)["op"] for i in range(len(t))][-2:] == ["aten::mul.Tensor",
                                                                 "attack::term"]
        assert "recording_error" not in t.manifest["frameworks"]["torch"]
        _check_values(t)


IN_A_REPLAYED_CALL = """
    import os, signal
    import jax, jax.numpy as jnp
    import numpy as np

    def host(y):            # a host callback of the program's: called inside the jit call
        os.kill(os.getpid(), signal.SIGTERM)
        return np.asarray(y) * 2

    @jax.jit
    def step(x):
        y = jnp.sin(x)
        z = jax.pure_callback(host, jax.ShapeDtypeStruct(y.shape, y.dtype), y)
        return jnp.cos(z) + 1

    x = step(jnp.arange(4.0))
    print("went on", float(x.sum()), flush=True)
"""


def test_sigterm_taken_inside_a_replayed_call_ends_once_the_call_is_recorded(tmp_path):
    """SIGTERM taken in a host callback that tracediff's replay of a jit call runs (nested
    inside several of tracediff's frames and JAX's between them) ends the run once the
    outermost of tracediff's frames has returned: the call and every equation of it are in
    the trace, the rest of the script never runs, death by SIGTERM as the plain run.
    Ending below the innermost of tracediff's frames closed the trace half-way through
    the replay: the call and its last equations were missing."""
    script = _script(tmp_path, "callback.py", IN_A_REPLAYED_CALL)
    out = tmp_path / "callback.h5"
    got = {}
    for how, cmd in [("plain", [sys.executable, str(script)]),
                     ("recorded", [sys.executable, "-m", "tracediff", "record", "-o", str(out),
                                   str(script)])]:
        proc = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        got[how] = (proc.returncode, proc.stdout)
    assert got["recorded"] == got["plain"] == (-signal.SIGTERM, ""), got
    with tracediff.load(out) as t:
        end = t.manifest["end"]
        assert t.complete and (end["status"], end["exit_code"]) == ("terminated (SIGTERM)", 143)
        assert "step(jnp.arange(4.0))" in end["traceback"], end
        ops = [t.event(i)["op"] for i in range(len(t))]
        assert "jit:step" in ops, ops
        assert ops[ops.index("jit:step"):][-3:] == ["pure_callback", "cos", "add"], ops
        _check_values(t)


def _signalled_at_ready(cmd, sig, cwd=ROOT):
    """Run CMD until it prints "ready", send it SIG: (exit status, the rest of its stdout,
    stderr). The same instant of the script for the plain run and the recorded one."""
    proc = subprocess.Popen(cmd, env=_env(), cwd=cwd, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, stdout, stderr


PREEMPTED = """
    import signal, sys, time, torch

    checkpoint, slow, how = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    stop = False

    def flag(signum, frame):        # the SLURM / Kubernetes preemption idiom
        global stop
        stop = True

    def leave(signum, frame):
        sys.exit(0)

    signal.signal(signal.SIGTERM, flag if how == "flag" else leave)
    x = torch.ones(8)
    for _ in range(5):
        x = torch.sin(x) * 1.5
    try:
        print("ready", flush=True)
        while not stop:
            y = torch.cos(x)
            time.sleep(0.01)
    finally:
        time.sleep(slow)            # a slow save: longer than tracediff's grace
        with open(checkpoint, "w") as f:
            f.write(f"step 5 {float(x.sum()):.6f}\\n")
        print("saved", flush=True)
"""


@pytest.mark.deep   # CI's 'deep' stage: its own recordings
@pytest.mark.parametrize("how, status", [("flag", "completed"), ("systemexit", "sys.exit")])
def test_a_scripts_own_sigterm_handler_ends_the_run_as_the_plain_one(tmp_path, how, status):
    """Checkpoint on preemption: the script's handler sets a flag (or raises SystemExit)
    and the script saves a checkpoint, slower than the watch thread's grace, then exits 0.
    Before: the watch thread waited for tracediff's own handler, which the script had
    replaced, and killed the recorded run by SIGTERM after 2 s: no checkpoint. Now
    tracediff stands aside: same exit status, output and checkpoint as the plain run, and
    the trace, closed as the script ends, says the script's handler took SIGTERM."""
    from tracediff.term_watch import GRACE

    script = _script(tmp_path, "preempted.py", PREEMPTED)
    out = tmp_path / "preempted.h5"
    got = {}
    for run in ("plain", "recorded"):
        ckpt = tmp_path / f"{run}.ckpt"
        cmd = [str(script), str(ckpt), str(GRACE + 1), how]
        cmd = ([sys.executable, "-m", "tracediff", "record", "-o", str(out), *cmd]
               if run == "recorded" else [sys.executable, *cmd])
        code, stdout, stderr = _signalled_at_ready(cmd, signal.SIGTERM)
        got[run] = (code, stdout, ckpt.read_text() if ckpt.exists() else None)
    assert got["recorded"] == got["plain"], (got, stderr)
    assert got["plain"][0] == 0 and got["plain"][2] is not None
    assert "trace written" in stderr and "blocked" not in stderr, stderr
    with tracediff.load(out) as t:
        assert t.complete and len(t) >= 11
        end = t.manifest["end"]
        assert (end["status"], end["exit_code"]) == (status, 0), end
        assert end["signals_handled_by_script"] == ["SIGTERM"], end
        assert "recording_error" not in t.manifest["frameworks"]["torch"]
    info = CliRunner().invoke(cli_main, ["info", str(out)])
    assert info.exit_code == 0 and f"ended: {status} (exit 0" in info.output, info.output
    assert "SIGTERM" in info.output, info.output
    show = CliRunner().invoke(cli_main, ["show", str(out), "0"])
    assert show.exit_code == 0 and "aten::ones" in show.output, show.output


WAKEUP_SCRIPT = """
    import os, signal, socket, sys
    signal.signal(signal.SIGUSR1, lambda *a: None)
    os.kill(os.getpid(), signal.SIGUSR1)       # the caller's wakeup fd, if any, hears it
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    previous = signal.set_wakeup_fd(w.fileno())
    print("previous:", "none" if previous == -1 else "the caller's")
    os.kill(os.getpid(), signal.SIGUSR1)
    print("the script's fd got:", list(r.recv(64)))
    if sys.argv[1:] == ["put back"]:
        print("put back:", signal.set_wakeup_fd(previous) == w.fileno())
    else:                                      # left set: still set when the run is over
        sys.script_wakeup = (r, w)
"""

WAKEUP_CALLER = """
    import os, runpy, signal, socket, sys
    from tracediff.runner.script import record_script
    script, out, how, caller = sys.argv[1:]
    if caller == "caller":
        r, w = socket.socketpair()
        r.setblocking(False)
        w.setblocking(False)
        signal.signal(signal.SIGUSR1, lambda *a: None)
        signal.set_wakeup_fd(w.fileno())
    sys.argv = [script, *(["put back"] if caller == "caller" else [])]
    if how == "recorded":
        record_script(script, sys.argv[1:], out)
    else:
        runpy.run_path(script, run_name="__main__")
    now = signal.set_wakeup_fd(-1)
    if caller == "caller":
        print("the caller's fd kept:", now == w.fileno(), "got:", list(r.recv(64)))
    else:
        print("the script's fd kept:", now == sys.script_wakeup[1].fileno())
"""


@pytest.mark.parametrize("caller", ["caller", "no caller"])
def test_a_wakeup_fd_set_before_or_by_the_script_stays_theirs(tmp_path, caller):
    """`signal.set_wakeup_fd` is the program's: one its caller set before the recording is
    kept (its signals reach it, and it is set when the recording ends); one the script
    sets is the one it hears on and is still set after the script, as when the same code
    runs without tracediff (runpy, the truth here)."""
    script = _script(tmp_path, "wakeup.py", WAKEUP_SCRIPT)
    caller_py = _script(tmp_path, "caller.py", WAKEUP_CALLER)
    got = {}
    for how in ("plain", "recorded"):
        proc = subprocess.run([sys.executable, str(caller_py), str(script),
                               str(tmp_path / "w.h5"), how, caller], env=_env(), cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        got[how] = (proc.returncode, proc.stdout)
    assert got["recorded"] == got["plain"], got
    assert got["plain"][0] == 0 and "True" in got["plain"][1], got


def test_a_script_setting_its_own_wakeup_fd_sees_what_it_would_see_without_tracediff(tmp_path):
    """Recorded, `signal.set_wakeup_fd` answered the number of tracediff's socket where the
    plain script gets -1 (none); setting that -1 back gives the wakeup to tracediff again."""
    script = _script(tmp_path, "wakeup.py", WAKEUP_SCRIPT)
    plain = subprocess.run([sys.executable, str(script), "put back"], env=_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    proc = run_cli("record", "-o", tmp_path / "w.h5", script, "put back")
    assert (proc.returncode, proc.stdout) == (plain.returncode, plain.stdout), proc.stderr
    assert plain.stdout.splitlines() == ["previous: none", "the script's fd got: [10]",
                                         "put back: True"]


LOST_CTRL_C = """
    import weakref
    import torch

    class Obj:
        pass

    def callback(_):  # what a SIGINT landing in a weakref callback (h5py frees objects
        raise KeyboardInterrupt  # during a flush) does: Python prints it and drops it

    obj = Obj()
    ref = weakref.ref(obj, callback)
    del obj
    x = torch.ones(3)
    for _ in range(3):
        x = torch.cos(x)
    print("finished")
"""


def test_ctrl_c_lost_in_a_weakref_callback_still_stops_the_script(tmp_path):
    """A swallowed KeyboardInterrupt is raised again at the next recorded op (before this,
    a Ctrl-C that hit a flush could be dropped and the script ran on: a hang in CI)."""
    script = _script(tmp_path, "lost.py", LOST_CTRL_C)
    out = tmp_path / "lost.h5"
    proc = run_cli("record", "-o", out, script)
    assert proc.returncode == -signal.SIGINT, proc.stderr   # dies by it, as Python does
    assert "finished" not in proc.stdout and "Exception ignored" not in proc.stderr
    with tracediff.load(out) as t:
        assert t.complete and t.manifest["end"]["status"] == "interrupted (SIGINT)"
        assert "lost.py" in t.manifest["end"]["traceback"]


ENDS_ABRUPTLY = """
    import os, sys, torch
    x = torch.ones(3)
    for _ in range(50):
        x = torch.sin(x)
    print("before", flush=True)
    if sys.argv[1] == "os._exit":
        os._exit(7)
    os.execv(sys.executable, [sys.executable, "-c", "print('exec ran'); raise SystemExit(5)"])
"""


@pytest.mark.parametrize("how, code, stdout", [("os._exit", 7, "before\n"),
                                               ("exec", 5, "before\nexec ran\n")])
def test_os_exit_and_exec_close_the_trace_first(tmp_path, how, code, stdout):
    """os._exit and os.exec* end the process without unwinding: the trace is closed first,
    with every op recorded before them (it kept only the last flush: 1 of 51 events), and
    the exit status is the plain run's (os._exit's code; the exec'd program's)."""
    script = _script(tmp_path, "abrupt.py", ENDS_ABRUPTLY)
    out = tmp_path / "abrupt.h5"
    proc = run_cli("record", "-o", out, script, how)
    assert (proc.returncode, proc.stdout) == (code, stdout), proc.stderr
    with tracediff.load(out) as t:
        assert t.complete and t.manifest["end"]["status"] == how
        ops = [t.event(i)["op"] for i in range(len(t))]
        assert ops == ["aten::ones"] + ["aten::sin"] * 50
        _check_values(t)


# -- SIGKILL at random points ----------------------------------------------------------------

STRESS = """
    import sys, time
    import numpy as np
    from tracediff.trace import writer as W
    from tracediff.trace.writer import settings
    settings.FLUSH_ROWS = 40       # flush all the time, so kills land inside flushes too
    w = W.TraceWriter(sys.argv[1], {"script": {"name": "stress"}})
    rng = np.random.default_rng(0)
    print("started", flush=True)
    i = 0
    while True:
        e = w.add_event(framework=2, kind=3, op=f"op{i % 37}", source=f"s.py:{i}",
                        parent=i - 1 if i else -1)
        w.add_value(e, 0, rng.standard_normal(int(rng.integers(1, 500))).astype(np.float32))
        if i:
            w.add_input(e, 0, e - 1)
        i += 1
"""


def test_sigkill_at_random_points_leaves_a_readable_truncated_trace(tmp_path):
    """A writer flushing every 40 rows is killed at seeded random instants (most land
    inside a flush); every file opens, says it is truncated, and every committed value
    matches its hash."""
    script = _script(tmp_path, "stress.py", STRESS)
    rng = random.Random(KILL_SEED)
    events = []
    for k in range(10):
        out = tmp_path / f"k{k}.h5"
        proc = subprocess.Popen([sys.executable, str(script), str(out)], env=_env(), cwd=ROOT,
                                text=True, stdout=subprocess.PIPE)
        assert proc.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.0, 0.8))
        proc.kill()
        proc.wait()
        with tracediff.load(out) as t:
            assert not t.complete
            assert "end" not in t.manifest
            ev = t.events
            assert (ev["parent"][1:] == np.arange(len(ev) - 1)).all()  # no hole, no repeat
            assert _check_values(t) >= len(t) - 1 - 40  # values of the last batch may be missing
            events.append(len(t))
    assert sum(1 for n in events if n > 0) >= 8, events
    proc = run_cli("info", tmp_path / "k9.h5")
    assert proc.returncode == 0 and "TRUNCATED" in proc.stdout
    proc = run_cli("locate", tmp_path / "k8.h5", tmp_path / "k9.h5")
    # truncated traces are never a MATCH: diverged, or inconclusive (coverage: the
    # recordings did not finish)
    assert proc.returncode in (1, 3) and "truncated" in proc.stderr
    assert proc.returncode == 1 or "did not finish" in proc.stdout


def test_sigkill_of_a_real_recording(tmp_path):
    """`tracediff record` of a torch training killed with SIGKILL mid-run."""
    out = tmp_path / "mlp.h5"
    proc = subprocess.Popen([sys.executable, "-m", "tracediff", "record", "-o", str(out),
                             os.path.join(FIXTURES, "torch_mlp.py"), "--steps", "100000"],
                            env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(240):  # up to 2 minutes, until a flush past the first events is on disk
        time.sleep(0.5)
        try:
            with h5py.File(out, "r", locking=False) as f:
                if f.attrs.get("committed_events", 0) > 100:  # a flush after the first
                    break
        except (OSError, KeyError):
            pass
    time.sleep(random.Random(KILL_SEED).uniform(0.0, 2.0))
    proc.kill()
    proc.wait()
    with tracediff.load(out) as t:
        assert not t.complete and len(t) > 100
        assert _check_values(t) > 100


# -- bad input ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good(recorded):
    """Two small real traces of different scripts."""
    r = recorded.many({"dot": ("torch_dot.py", (), None),
                       "mlp": ("torch_mlp.py", FIXTURE_RUNS["torch"][1], None)})
    return r["dot"], r["mlp"]


def _bad_files(folder, good_path):
    folder.mkdir(exist_ok=True)
    files = {"missing": folder / "missing.h5", "directory": folder}
    files["text"] = folder / "text.h5"
    files["text"].write_text("hello, not HDF5\n")
    files["empty"] = folder / "empty.h5"
    files["empty"].write_bytes(b"")
    data = good_path.read_bytes()
    files["truncated"] = folder / "truncated.h5"
    files["truncated"].write_bytes(data[:len(data) // 3])
    files["header_only"] = folder / "header.h5"
    files["header_only"].write_bytes(data[:512])
    files["not_a_trace"] = folder / "other.h5"
    with h5py.File(files["not_a_trace"], "w") as f:
        f["x"] = np.arange(3)
    files["newer_schema"] = folder / "newer.h5"
    files["newer_schema"].write_bytes(data)
    with h5py.File(files["newer_schema"], "r+") as f:
        f.attrs["schema_version"] = 99
    return files


COMMANDS = {
    "info": lambda bad, good: ["info", bad],
    "info --json": lambda bad, good: ["info", "--json", bad],
    "show": lambda bad, good: ["show", bad, "0"],
    "locate a": lambda bad, good: ["locate", bad, good],
    "locate b": lambda bad, good: ["locate", good, bad],
    "report": lambda bad, good: ["report", good, bad, "-o", "-"],
}


def test_bad_input_to_every_command_is_one_line_and_exit_2(good, tmp_path):
    files = _bad_files(tmp_path / "bad", good[0])
    runner = CliRunner()
    failures = []
    for kind, path in files.items():
        for name, args in COMMANDS.items():
            res = runner.invoke(cli_main, [str(a) for a in args(path, good[0])])
            err = res.stderr.strip()
            if kind == "directory" and not name.startswith(("locate", "info")):
                # click refuses it before tracediff runs: a usage error (locate and info
                # take a directory as a run's per-rank traces: they read it, and say why not)
                ok = res.exit_code == 2 and "is a directory" in err and "Traceback" not in err
            else:
                ok = res.exit_code == 2 and len(err.splitlines()) == 1 and \
                    "Traceback" not in err and err.startswith("tracediff: error:")
            if not ok:
                failures.append(f"{name} on {kind}: exit {res.exit_code}, stderr {err[:300]!r}, "
                                f"exception {res.exception!r}")
    assert not failures, "\n".join(failures)
    # the messages say what is wrong
    msg = {k: runner.invoke(cli_main, ["info", str(p)]).stderr for k, p in files.items()}
    assert "no such" in msg["missing"]
    # a folder is one run's per-rank traces: the first file in it that is no trace is named
    assert "empty.h5: empty file, not a trace" in msg["directory"]
    assert "not an HDF5 file" in msg["text"] and "empty" in msg["empty"]
    assert "truncated or corrupt" in msg["truncated"] and "not a tracediff trace" in msg["not_a_trace"]
    assert "upgrade tracediff" in msg["newer_schema"]


def test_check_with_a_bad_golden_is_one_line_and_exit_2(good, tmp_path):
    files = _bad_files(tmp_path / "bad", good[0])
    proc = run_cli("check", files["text"], os.path.join(FIXTURES, "torch_dot.py"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("tracediff: error:")


def test_traces_of_different_scripts_warn_and_still_compare(good):
    res = CliRunner().invoke(cli_main, ["locate", str(good[0]), str(good[1])])
    assert res.exit_code in (0, 1)
    assert "different scripts" in res.stderr and "comparing anyway" in res.stderr


def test_api_raises_trace_error_only(good, tmp_path):
    files = _bad_files(tmp_path / "bad", good[0])
    for kind, path in files.items():
        with pytest.raises(TraceError):
            tracediff.load(path)
        with pytest.raises(TraceError):
            tracediff.locate(good[0], path)


MARKER_SCRIPT = """
    import pathlib, sys
    pathlib.Path(sys.argv[1]).write_text("ran")
"""


@pytest.mark.parametrize("output, env, message", [
    ("/proc/tracediff-test.h5", None, "not writable"),
    ("{tmp}/t.h5", {"TRACEDIFF_MIN_FREE_MB": "1e12"}, "MiB free"),
    ("{tmp}/t.h5", {"TRACEDIFF_MIN_FREE_MB": "lots"},
     "TRACEDIFF_MIN_FREE_MB must be a number of MiB, not 'lots'"),
])
def test_unwritable_output_is_refused_before_the_script_runs(tmp_path, output, env, message):
    script = _script(tmp_path, "marker.py", MARKER_SCRIPT)
    marker = tmp_path / "ran.txt"
    proc = run_cli("record", "-o", output.format(tmp=tmp_path), script, marker, env=env)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_full_disk_stops_recording_not_the_script(tmp_path):
    """A file size limit (EFBIG, as ENOSPC would) reached mid-run: the script finishes with
    its own output and exit code, the trace keeps what was committed, a warning says so."""
    out = tmp_path / "full.h5"
    plain = run_plain("torch_mlp.py", "--steps", "40")   # a few steps already pass 9 MiB
    proc = record("torch_mlp.py", out, "--steps", "40", env={"TRACEDIFF_MIN_FREE_MB": "0"},
                  check=False, file_size_limit=9 << 20)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout
    assert "recording stopped early" in proc.stderr and "Traceback" not in proc.stderr
    with tracediff.load(out) as t:
        assert not t.complete and len(t) > 0
        assert "file size limit" in t.manifest["recording_error"]
        assert t.manifest["end"]["exit_code"] == 0
        _check_values(t)


MOVING = """
    import os, sys, torch
    x = torch.ones(3)
    os.chdir(sys.argv[1])          # a folder of the script's own, with its own t.h5
    for _ in range(3):
        x = torch.sin(x)
    print(repr(x.sum().item()))
"""


def test_a_relative_output_stays_where_record_started_when_the_script_chdirs(tmp_path):
    """`-o t.h5` is fixed at start: the close-time rewrite never replaces the t.h5 of the
    folder the script moved to, and the size printed is the real trace's."""
    from tracediff.report.numbers import fmt_bytes

    script = _script(tmp_path, "moving.py", MOVING)
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    theirs = elsewhere / "t.h5"    # a trace of the script's own, that the rewrite could take
    from tracediff.trace.writer import TraceWriter
    w = TraceWriter(theirs, {"script": {"name": "theirs"}})
    w.add_value(w.add_event(framework=2, kind=3, op="theirs"), 0, np.arange(5.0))
    w.close()
    content = theirs.read_bytes()
    theirs.chmod(0o444)
    before = os.stat(theirs)
    proc = run_cli("record", "-o", "t.h5", script, elsewhere, cwd=start)
    assert proc.returncode == 0, proc.stderr
    after = os.stat(theirs)
    assert theirs.read_bytes() == content
    assert (after.st_ino, after.st_mode, after.st_mtime_ns) == \
        (before.st_ino, before.st_mode, before.st_mtime_ns)
    trace = start / "t.h5"
    with tracediff.load(trace) as t:
        assert t.complete and [t.event(i)["op"] for i in range(len(t))].count("aten::sin") == 3
        _check_values(t)
    assert os.path.getsize(trace) < 512 << 10     # rewritten without its chunks' empty tails
    assert f"({'level full'}, {fmt_bytes(os.path.getsize(trace))})" in proc.stderr, proc.stderr


FILLS_THE_DISK = """
    import subprocess, sys, torch
    x = torch.ones(1 << 16)        # 256 KiB a value: the first flush comes after 4 ops
    for _ in range(8):
        x = torch.sin(x)
    # another process fills the disk the trace is on (a 20 MB tmpfs; 64 MiB at most)
    subprocess.run([sys.executable, "-c", "import sys\\n"
                    "with open(sys.argv[1], 'wb') as f:\\n"
                    "    for _ in range(1024): f.write(bytes(1 << 16)); f.flush()",
                    sys.argv[1] + "/fill"], stderr=subprocess.DEVNULL)
    for _ in range(40):            # 10 MiB more: the next flush does not fit
        x = torch.cos(x)
    print("finished", x.shape[0])
"""


def _in_a_small_tmpfs(tmp_path, command):
    """Run COMMAND (a /bin/sh line; $DISK is a 20 MB tmpfs mounted for it alone, in a mount
    namespace of its own) and return the CompletedProcess."""
    disk = tmp_path / "disk"
    disk.mkdir()
    ns = ["unshare", "--mount", "--propagation", "private"] if os.geteuid() == 0 else \
        ["unshare", "--user", "--map-root-user", "--mount"]
    env = _env({"DISK": str(disk), "TRACEDIFF_MIN_FREE_MB": "1"})
    mount = 'mount -t tmpfs -o size=20m tmpfs "$DISK"'
    try:
        probe = subprocess.run([*ns, "sh", "-c", mount], env=env, capture_output=True,
                               timeout=60)
    except FileNotFoundError:
        probe = None
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or user namespaces)")
    return subprocess.run([*ns, "sh", "-c", f"{mount} || exit 99\n{command}"], env=env,
                          cwd=ROOT, text=True, capture_output=True, timeout=300)


def test_a_disk_filled_by_another_process_keeps_every_committed_event(tmp_path):
    """Another process fills the disk mid-recording: the script ends as it would plainly,
    `record` says the recording stopped early, and the trace still opens with every event
    committed before (it used to be damaged by the close that followed: "trace written",
    exit 0, and nothing readable)."""
    script = _script(tmp_path, "fills.py", FILLS_THE_DISK)
    kept = tmp_path / "kept.h5"
    proc = _in_a_small_tmpfs(tmp_path, f"""
        {sys.executable} -m tracediff record -o "$DISK/t.h5" {script} "$DISK"
        rc=$?
        cp "$DISK/t.h5" {kept}     # as it is on the full disk
        exit $rc""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "finished 65536\n"
    assert "recording stopped early" in proc.stderr and "disk full" in proc.stderr
    assert "Traceback" not in proc.stderr
    with tracediff.load(kept) as t:
        assert not t.complete
        ops = [t.event(i)["op"] for i in range(len(t))]
        # the commits before the disk filled (the first by 1 MiB of values or 2 s), readable
        assert len(ops) >= 1 and ops == ["aten::ones"] + ["aten::sin"] * (len(ops) - 1), ops
        assert f"truncated after {len(t)} events" in proc.stderr
        assert _check_values(t) == len(t)


# -- never perturb ---------------------------------------------------------------------------

# A new recording level is one entry here: (level, loops).
LEVELS = [("full", "opaque"), ("full", "stepped"), ("stats", "opaque"), ("calls", "opaque")]
FIXTURE_RUNS = {"jax": ("jax_control_flow.py", ()), "torch": ("torch_mlp.py", ("--steps", "3"))}


def _combos():
    return [(fw, level, loops) for fw in FIXTURE_RUNS for level, loops in LEVELS
            if fw == "jax" or loops == "opaque"]  # --loops only changes JAX recording


# `tracediff record` options of each (level, loops); the defaults need none, so those runs
# are the session's shared recordings of the fixtures
OPTIONS = {("full", "opaque"): (), ("full", "stepped"): ("--loops", "stepped"),
           ("stats", "opaque"): ("--level", "stats"), ("calls", "opaque"): ("--level", "calls")}


@pytest.fixture(scope="module")
def perturb_runs(recorded):
    """Every (framework, level, loops) recorded once, two at a time, and each fixture run
    plainly: {key: stdout}."""
    jobs = {}
    for fw, level, loops in _combos():
        script, args = FIXTURE_RUNS[fw]
        jobs[(fw, level, loops)] = (script, args, None, OPTIONS[(level, loops)])
    out = {fw: run_plain(script, *args).stdout for fw, (script, args) in FIXTURE_RUNS.items()}
    out.update({key: recorded.proc(path).stdout for key, path in recorded.many(jobs).items()})
    return out


@pytest.mark.parametrize("framework, level, loops", _combos(),
                         ids=["-".join(c) for c in _combos()])
def test_recording_never_changes_the_script_output(framework, level, loops, perturb_runs):
    # the fixtures print repr() of their float results: equal text is bitwise equal
    assert perturb_runs[(framework, level, loops)] == perturb_runs[framework]


DEEP = """
    import sys, torch
    x = torch.ones(3)
    def down(n):
        return torch.sin(x) if n == 0 else down(n - 1)
    y = down(sys.getrecursionlimit() - 20)    # a torch op 20 frames short of the limit
    print(repr(y.sum().item()), sys.getrecursionlimit())
"""


def test_the_recorders_frames_do_not_count_against_the_scripts_recursion_budget(tmp_path):
    """The frames below the script (CLI, runpy) and the recorder's own above each op are
    not the script's: an op that runs plainly 20 frames short of the limit runs recorded,
    is recorded, and the script reads its own limit."""
    script = _script(tmp_path, "deep.py", DEEP)
    plain = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True,
                           text=True, timeout=300)    # a fresh interpreter: no frames below
    assert plain.returncode == 0, plain.stderr
    out = tmp_path / "deep.h5"
    proc = record(str(script), out, check=False)
    assert (proc.returncode, proc.stdout) == (0, plain.stdout), proc.stderr
    with tracediff.load(out) as t:
        (sin,) = [i for i in range(len(t)) if t.event(i)["op"] == "aten::sin"]
        assert t.event(sin)["source"].endswith("deep.py:5")
        _check_values(t)


# -- multi-process ---------------------------------------------------------------------------

def test_rank_detection_and_names():
    assert distributed_rank({}) is None
    assert distributed_rank({"RANK": "0", "WORLD_SIZE": "1"}) is None
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}
    assert distributed_rank(env) == {"rank": 3, "local_rank": 1, "world_size": 4,
                                     "launcher": "torchrun"}
    assert output_path_for("runs/a.h5", env) == "runs/a.rank3.h5"
    assert output_path_for("a", env) == "a.rank3.h5"
    assert distributed_rank({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"})["rank"] == 1
    assert distributed_rank({"RANK": "x", "WORLD_SIZE": "2"}) is None
    assert distributed_rank({"RANK": "5", "WORLD_SIZE": "2"}) is None


THREADS = """
    import threading, torch
    def work():
        a = torch.ones(64, 64)
        for _ in range(200):
            a = torch.tanh(a @ a / 64)
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    x = torch.arange(16.0)
    for _ in range(100):
        x = torch.sin(x) + 1
    for t in threads:
        t.join()
    print(repr(x.sum().item()))
"""


def test_threads_never_corrupt_the_trace(tmp_path):
    script = _script(tmp_path, "threads.py", THREADS)
    proc = record(str(script), tmp_path / "th.h5")
    assert proc.returncode == 0
    with tracediff.load(tmp_path / "th.h5") as t:
        assert t.complete and len(t) >= 200
        _check_values(t)
