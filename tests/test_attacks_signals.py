"""Hostile scripts against `record`'s promise that recording never changes how a program
ends: its own signal handlers (none, SIG_IGN, a flag, SystemExit, KeyboardInterrupt, a
handler that dies again by the default action), the signal (SIGTERM, SIGINT, SIGHUP),
when it comes (before the first step, in a Python loop, blocked in a C call), descriptor
games (closing every descriptor, dup2 of a file of its own over the trace's number) and
exit codes.

Each attack runs the same script twice, plain and recorded, and sends the same signal at
the same point (the script creates a `ready` file: a marker that survives a script that
closed its standard descriptors); the plain run is the truth for the exit status, the
output and the script's own file, and the recorded run's trace must open and say how the
run ended. The attacks run a few at a time in one fixture (they mostly wait on each
other's signals); each is its own test. No framework is imported: the interpreter's own
start-up is what they pay for.
"""

import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tracediff.trace.reader import Trace

from .helpers import script_env

# its own CI stage (pytest -m deep): a batch of hostile cases, each against its truth
pytestmark = pytest.mark.deep

ATTACK = """\
    import ctypes, os, signal, sys, time
    handler, signame, timing, game, code = sys.argv[1:6]
    sig = getattr(signal, signame) if signame != "none" else None
    stop = False

    def flag(signum, frame):
        global stop
        stop = True

    def systemexit(signum, frame):
        sys.exit(int(code))

    def keyboardinterrupt(signum, frame):
        raise KeyboardInterrupt

    def rekill(signum, frame):      # clean up, then die by the signal as the default would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def ready():
        os.close(os.open("ready", os.O_WRONLY | os.O_CREAT))

    if sig is not None and handler == "ign":
        signal.signal(sig, signal.SIG_IGN)
    elif sig is not None and handler != "default":
        signal.signal(sig, globals()[handler])
    if timing == "first":           # the signal comes before the script's first output
        ready()
        wait = time.monotonic() + 2.0
        while not stop and time.monotonic() < wait:
            time.sleep(0.005)
    print("started", flush=True)
    if game == "closerange3":
        os.closerange(3, 65536)
    elif game == "closerange0":
        os.closerange(0, 65536)
    elif game == "dup2":            # a file of its own over every low number: the trace's too
        own = os.open("own.txt", os.O_RDWR | os.O_CREAT)
        for fd in range(3, 24):
            if fd != own:
                os.dup2(own, fd)
    if timing == "blocked":         # system() retries its wait on EINTR: no Python meanwhile;
        # the marker is made by its child, while the call waits (and ignores SIGINT)
        ctypes.CDLL(None).system(b"touch ready; exec sleep 0.5 >/dev/null 2>&1")
    elif timing != "first":
        ready()
    deadline = time.monotonic() + 1.0
    n = 0
    while not stop and time.monotonic() < deadline:
        n += 1
        time.sleep(0.005)
    print("end", stop, flush=True)
    sys.exit(int(code))
"""

HANDLERS = ["default", "ign", "flag", "systemexit", "keyboardinterrupt", "rekill"]

ATTACKS = (
    # every handler kind, every signal, in a Python loop
    [(h, s, "loop", "none", "0") for h in HANDLERS for s in ("SIGTERM", "SIGINT", "SIGHUP")]
    # before the first step, and blocked in a C call
    + [(h, "SIGTERM", "first", "none", "3") for h in HANDLERS]
    + [(h, "SIGTERM", "blocked", "none", "0") for h in HANDLERS]
    + [(h, s, "blocked", "none", "0") for h in ("default", "flag") for s in ("SIGINT", "SIGHUP")]
    + [("default", "SIGINT", "first", "none", "0")]
    # descriptor games
    + [(h, "SIGTERM", "loop", "closerange3", "0") for h in ("default", "ign", "flag", "systemexit")]
    + [(h, "SIGTERM", "blocked", "closerange3", "0") for h in ("default", "flag")]
    + [(h, "SIGTERM", "loop", "dup2", "0") for h in ("default", "flag", "systemexit", "rekill")]
    + [("default", "SIGTERM", "blocked", "dup2", "0")]
    + [("flag", "SIGTERM", "loop", "closerange0", "0"), ("default", "SIGTERM", "loop", "closerange0", "0")]
    # no signal: exit codes, with and without descriptor games
    + [("default", "none", "loop", g, c) for g, c in [("none", "0"), ("none", "3"), ("none", "255"),
                                                      ("closerange0", "4"), ("closerange3", "4"),
                                                      ("dup2", "3")]]
    # exit codes chosen by the script's handler after the signal
    + [(h, "SIGTERM", "loop", "none", c) for h in ("flag", "systemexit") for c in ("3", "255")]
)
IDS = ["-".join(a) for a in ATTACKS]
assert len(ATTACKS) >= 50 and len(set(IDS)) == len(IDS)


def _run(cmd, folder, sig):
    """Run CMD in FOLDER until it creates `ready`, send SIG: (exit status, stdout, stderr)."""
    proc = subprocess.Popen(cmd, cwd=folder, env=script_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        if sig is not None:
            while not os.path.exists(os.path.join(folder, "ready")) and proc.poll() is None:
                time.sleep(0.005)
            if proc.poll() is None:
                proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, stdout, stderr


def _attack(root, attack):
    handler, signame, timing, game, code = attack
    sig = getattr(signal, signame) if signame != "none" else None
    got = {}
    for how in ("plain", "recorded"):
        folder = os.path.join(root, "-".join(attack), how)
        os.makedirs(folder)
        with open(os.path.join(folder, "attack.py"), "w") as f:
            f.write(textwrap.dedent(ATTACK))
        cmd = ["attack.py", *attack]
        cmd = ([sys.executable, "-m", "tracediff", "record", "-o", "trace.h5", *cmd]
               if how == "recorded" else [sys.executable, *cmd])
        rc, stdout, stderr = _run(cmd, folder, sig)
        own = os.path.join(folder, "own.txt")
        got[how] = {"rc": rc, "stdout": stdout, "stderr": stderr,
                    "own": open(own, "rb").read() if os.path.exists(own) else None,
                    "trace": os.path.join(folder, "trace.h5")}
    return got


@pytest.fixture(scope="module")
def attacks(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("attacks"))
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        runs = dict(zip(IDS, pool.map(lambda a: _attack(root, a), ATTACKS)))
    return runs


@pytest.mark.parametrize("attack", ATTACKS, ids=IDS)
def test_a_recorded_attack_ends_as_the_plain_run(attacks, attack):
    got = attacks["-".join(attack)]
    plain, rec = got["plain"], got["recorded"]
    assert (rec["rc"], rec["stdout"], rec["own"]) == (plain["rc"], plain["stdout"], plain["own"]), \
        (plain, rec)
    assert "Traceback (most recent call last)" not in rec["stderr"] or \
        "Traceback (most recent call last)" in plain["stderr"], rec["stderr"]
    with Trace(rec["trace"]) as t:          # the trace opens, whatever the script did
        len(t)
        end = t.manifest.get("end")
        if t.complete:                      # closed by the path the script took: says how
            want = plain["rc"] if plain["rc"] >= 0 else 128 - plain["rc"]
            assert end["exit_code"] == want, end
        else:                               # only a death by a signal's default action
            assert plain["rc"] < 0, (plain, rec)


# -- a forked child gets the script's handlers -----------------------------------------------

FORKED = """\
    import multiprocessing as mp, os, signal, sys, time

    def work(i):
        time.sleep(5)
        return i

    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        if sys.argv[1] == "pool":
            pool = ctx.Pool(2)
            pool.map_async(work, range(2))
            pool.terminate()            # the workers are still starting
            pool.join()
            print("terminated", flush=True)
        else:
            p = ctx.Process(target=work, args=(0,))
            p.start()
            os.kill(p.pid, signal.SIGTERM)
            p.join()
            print("worker exit", p.exitcode, flush=True)
"""

# A module that prepares every child the process forks, imported at start-up (before
# tracediff registers its own fork hooks): the window between fork and tracediff's hook,
# microseconds in a plain Pool (hit once in ~30 pools), made half a second.
SLOW_CHILD_START = """\
    import os, time
    os.register_at_fork(after_in_child=lambda: time.sleep(0.5))
"""


def _run_group(cmd, cwd, env, timeout=60):
    """Run CMD to its end: (exit status, stdout, stderr); whatever it left behind (children
    that outlived it, holding its pipes) is killed with its process group."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return "timed out", stdout, stderr
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, stdout, stderr


def _script_lines(stderr):
    """stderr without tracediff's own closing lines."""
    return [x for x in stderr.splitlines() if not x.startswith("tracediff: ")]


@pytest.mark.parametrize("how", ["pool", "kill"])
def test_a_forked_child_signalled_while_starting_dies_as_the_plain_ones(tmp_path, how):
    """A fork Pool terminated at once (or a worker sent SIGTERM): the plain child dies by
    SIGTERM's default action. Before, the recorded child still had tracediff's handler
    until its fork hook ran: it raised there ("Exception ignored", a traceback) and its
    wakeup byte reached the parent's term_watch, which killed the parent 2 s later."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(textwrap.dedent(SLOW_CHILD_START))
    (tmp_path / "forked.py").write_text(textwrap.dedent(FORKED))
    env = script_env({"PYTHONPATH": str(tmp_path / "site")})
    got = {}
    for run, cmd in [("plain", [sys.executable, "forked.py", how]),
                     ("recorded", [sys.executable, "-m", "tracediff", "record", "-o", "trace.h5",
                                   "forked.py", how])]:
        code, stdout, stderr = _run_group(cmd, tmp_path, env)
        got[run] = (code, stdout, _script_lines(stderr))
    assert got["recorded"] == got["plain"], got
    assert got["plain"][0] == 0 and got["plain"][2] == [], got
    with Trace(str(tmp_path / "trace.h5")) as t:
        assert t.complete and t.manifest["end"] == {"status": "completed", "exit_code": 0}


# -- SIGTERM ends the recorded run where the plain one ends ----------------------------------

TERMINATED = """\
    import atexit, os, signal, sys, threading, time
    feature = sys.argv[1]

    if feature in ("atexit", "handler"):
        atexit.register(lambda: print("atexit ran", flush=True))
    if feature in ("thread", "handler"):    # not a daemon: Python joins it at exit
        def late():
            time.sleep(1.5)
            print("thread ran", flush=True)
        threading.Thread(target=late).start()
    if feature == "handler":
        def leave(signum, frame):
            print("handler ran", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, leave)
    if feature in ("buffered", "handler"):  # a pipe: block-buffered, in the process only
        print("buffered", end="")
    try:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            print("went on", flush=True)
        except:
            if feature in ("except", "handler"):
                print("except ran", flush=True)
            raise
    finally:
        if feature in ("finally", "handler"):
            print("finally ran", flush=True)
"""


def _plain_and_recorded(tmp_path, script, *args):
    """{"plain", "recorded"}: (exit status, stdout, stderr but tracediff's own lines) of
    SCRIPT ARGS, its output block-buffered (no PYTHONUNBUFFERED), and the recorded trace."""
    (tmp_path / "script.py").write_text(textwrap.dedent(script))
    env = script_env()
    env.pop("PYTHONUNBUFFERED", None)
    got = {}
    for run, cmd in [("plain", [sys.executable, "script.py", *args]),
                     ("recorded", [sys.executable, "-m", "tracediff", "record", "-o", "trace.h5",
                                   "script.py", *args])]:
        code, stdout, stderr = _run_group(cmd, tmp_path, env)
        got[run] = (code, stdout, _script_lines(stderr))
    return got, str(tmp_path / "trace.h5")


@pytest.mark.parametrize("feature", ["atexit", "thread", "finally", "except", "buffered"])
def test_sigterm_ends_the_recorded_run_where_the_plain_one_ends(tmp_path, feature):
    """SIGTERM's default action ends the plain run at once: no atexit handler, no thread
    joined, no `finally` or `except` of the script, its buffered output never written.
    tracediff takes SIGTERM to close the trace, then must end there too. Before, its
    handler raised into the script: `finally` and `except` blocks ran (a bare `except:`
    that did not raise again went on running, exit 0), and its buffered output was
    flushed. (atexit and threads matched already: pinned.)"""
    got, trace = _plain_and_recorded(tmp_path, TERMINATED, feature)
    assert got["recorded"] == got["plain"] == (-signal.SIGTERM, "", []), got
    with Trace(trace) as t:
        end = t.manifest["end"]
        assert t.complete and (end["status"], end["exit_code"]) == ("terminated (SIGTERM)", 143)
        assert "script.py" in end["traceback"] and "os.kill" in end["traceback"], end


def test_a_scripts_own_sigterm_handler_runs_with_atexit_threads_and_finally(tmp_path):
    """A script's own SIGTERM handler decides how the run ends, as in the plain run: here it
    exits 3, and Python's exit path runs (`except`, `finally`, the thread joined, atexit
    handlers, the buffered output flushed), in the same order."""
    got, trace = _plain_and_recorded(tmp_path, TERMINATED, "handler")
    assert got["recorded"] == got["plain"], got
    assert got["plain"] == (3, "bufferedhandler ran\nexcept ran\nfinally ran\nthread ran\n"
                               "atexit ran\n", []), got
    with Trace(trace) as t:
        end = t.manifest["end"]
        assert (end["status"], end["exit_code"]) == ("sys.exit", 3), end
        assert end["signals_handled_by_script"] == ["SIGTERM"], end
