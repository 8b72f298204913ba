"""A warm process that forks one child per recording, so that a recording in the tests does
not pay ~3 CPU-seconds of `import torch` and ~3 of `import jax` each time.

The suite records ~90 real runs; most of a small run's CPU time is the interpreter and the
frameworks starting. The zygote imports them once (no JAX backend, no BLAS call: nothing
that reads the environment a job could change), then for each job forks a child that
takes the job's argv, working directory and stdout/stderr files and runs exactly what
`python -m tracediff ...` or `python script.py ...` would run, ending as an interpreter
ends (non-daemon threads joined, atexit handlers run, exit status).

A job's environment may differ from the zygote's only in what is read after start-up
(tests/helpers.zygote_for: XLA_FLAGS, read when JAX starts its backend; MKL_CBWR, at the
first BLAS call; TRACEDIFF_MIN_FREE_MB, when a recording starts) and in PYTHONPATH,
whose sitecustomize (a test perturbation) the child imports before the script, as `site`
would; any other job gets a fresh interpreter. The recorder then finds torch and JAX
already imported, the path `tracediff.record()` users take; the command-line path, where the
script imports them after the recorder is armed, keeps its own fresh-process tests.

One zygote per framework set serves the whole test run: the pytest-xdist workers connect
to it over a Unix socket (tests/helpers.Zygote; the first that needs it starts it).

Protocol (one JSON object a line, on each client's connection): the client sends {"id",
"argv", "env", "cwd", "stdout", "stderr"} and optionally "rlimits" ({"RLIMIT_FSIZE":
bytes, ...}) and "ignore_signals" (["SIGXFSZ", ...]), what a subprocess's preexec_fn
would set; argv[0] is "-m" MODULE or a script path. The zygote answers {"id", "rc"} on
that connection when the child has ended (children run concurrently); it prints
{"ready": true} to its stdout once, when it listens.
"""

import json
import os
import select
import sys

from tests.helpers import apply_limits


def _preload(frameworks):
    """Import what every child would import: tracediff, and the frameworks its scripts
    import (`frameworks`: "torch", "jax" or both; a script's trace lists the frameworks
    it found imported, so a JAX script never runs in a zygote that imported torch)."""
    import importlib

    import h5py  # noqa: F401
    import numpy  # noqa: F401

    import tracediff.cli  # noqa: F401
    import tracediff.runner.script  # noqa: F401
    # torch._dynamo too (~2.5 CPU-s): a recording imports it at its first op (torch wraps
    # a TorchDispatchMode's __torch_dispatch__ in `_disable_dynamo`, which imports Dynamo
    # on its first call), and so does a plain run at its first optimizer step; importing
    # it earlier changes nothing a child computes or records
    mods = {"torch": ["torch", "torch._dynamo", "tracediff.capture.torch.recorder"],
            "jax": ["jax", "jax.numpy", "tracediff.capture.jax.recorder"]}
    for fw in frameworks:
        for mod in mods[fw]:
            importlib.import_module(mod)
    if "jax" in frameworks:
        from jax._src import xla_bridge
        assert not xla_bridge._backends, "the zygote must not start a JAX backend before forking"


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_child(job):
    """In the forked child: become `python ARGV...` and never return."""
    import atexit
    import runpy
    import threading
    import traceback

    import signal

    code = 1
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the zygote's own handler is not the job's
    try:
        # the subprocess timeout a fresh process would have had: SIGALRM ends the child
        # (exit status -14, reported as any other)
        signal.alarm(int(job.get("timeout", 900)))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        apply_limits(job)   # what a preexec_fn would have set
        os.environ.clear()   # the job's environment: the client's now (it may have changed
        os.environ.update(job["env"])   # since the zygote started, in what is read lazily)
        os.chdir(job["cwd"])
        argv = job["argv"]
        try:
            sys.path[0] = os.getcwd() if argv[0] == "-m" else \
                os.path.dirname(os.path.abspath(argv[0]))
            # what `site` does at start-up: the job's PYTHONPATH after the script's folder
            # (entries the zygote's own PYTHONPATH put there already stay where they are),
            # then the sitecustomize it finds first (a test perturbation)
            extra = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep)
                     if p and p not in sys.path]
            if extra:
                sys.path[1:1] = extra
                if any(os.path.exists(os.path.join(p, "sitecustomize.py")) for p in extra):
                    sys.modules.pop("sitecustomize", None)
                    import sitecustomize  # noqa: F401
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            threading._shutdown()   # what the interpreter does at exit: join non-daemon threads
        except Exception:
            pass
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


IDLE_EXIT_SECONDS = 30   # no client and no child for this long: the run is over


def serve(frameworks, address):
    """Serve jobs from any number of clients (the run's pytest processes) connected to
    the Unix socket ADDRESS; "ready" goes to stdout once it listens. Ends when no client
    has been connected and no child running for IDLE_EXIT_SECONDS (the run's conftest
    also ends it when the run ends)."""
    import socket
    import time

    import signal

    _preload(frameworks)
    # the run's end (tests/conftest.py) is a SIGTERM: end as an interpreter does (atexit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(8)
    print(json.dumps({"ready": True}), flush=True)
    null = os.open(os.devnull, os.O_WRONLY)   # the starter may end before this zygote
    os.dup2(null, 1)
    os.close(null)
    clients = {}     # socket -> bytes not yet a whole line
    children = {}    # pid -> (client socket, job id)
    idle_since = time.monotonic()
    while True:
        ready, _, _ = select.select([listener, *clients], [], [], 0.02)
        for sock in ready:
            if sock is listener:
                conn, _ = listener.accept()
                clients[conn] = b""
                continue
            chunk = sock.recv(65536)
            if not chunk:                      # the client's process ended
                del clients[sock]
                sock.close()
                continue
            clients[sock] += chunk
            while b"\n" in clients[sock]:
                line, clients[sock] = clients[sock].split(b"\n", 1)
                job = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in clients:
                        other.close()
                    _run_child(job)
                children[pid] = (sock, job["id"])
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            sock, job_id = children.pop(pid)
            if sock in clients:
                reply = {"id": job_id, "rc": os.waitstatus_to_exitcode(status)}
                sock.sendall((json.dumps(reply) + "\n").encode())
        if clients or children:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_EXIT_SECONDS:
            try:
                os.unlink(address)   # a client arriving now starts a new zygote
            except FileNotFoundError:
                pass
            listener.close()
            return


if __name__ == "__main__":
    serve([f for f in sys.argv[1].split(",") if f], sys.argv[2])
