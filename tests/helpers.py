"""Shared test helpers: run the real CLI in a subprocess, as a user would."""

import functools
import hashlib
import json
import os
import shlex
import subprocess
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")


def fixture_line(script, text):
    """`script:N`: the line of fixtures/`script` holding `text`, as a recorded source
    (so a test follows edits of the fixture)."""
    with open(os.path.join(FIXTURES, script)) as fh:
        for n, line in enumerate(fh, 1):
            if text in line:
                return f"{script}:{n}"
    raise AssertionError(f"{text!r} is not in {script}")


def rel_l2(a, b):
    """||a - b|| / ||a|| over every array of `a` (a dict or an .npz file, by key), in
    float64: the relative L2 of two runs' parameters that the sources' truths compare."""
    import numpy as np

    num = sum(float(np.sum((np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)) ** 2))
              for k in a)
    return (num / sum(float(np.sum(np.asarray(a[k], np.float64) ** 2)) for k in a)) ** 0.5


def line_in(path, marker):
    """The number of the first line of `path` (a test's own __file__) that holds `marker`
    outside a `def` line: where a test's inline program records its op."""
    with open(path) as fh:
        return next(i for i, text in enumerate(fh, 1) if marker in text and "def " not in text)


# Commands that run a user's script (or a recorder) need a process of their own; every
# other command only reads traces, so it runs in this process through click's CliRunner:
# the same code path as `python -m tracediff`, without paying ~3-5 s of interpreter, jax and
# torch start-up per call.
OWN_PROCESS = {"record", "check", "demo"}


def run_cli(*args, env=None, cwd=None, check=False, timeout=600, own_process=None,
            file_size_limit=None):
    """Run `tracediff ARGS...` as a user would; returns a CompletedProcess (text).

    Read-only commands run in-process (click's CliRunner, stdout and stderr apart, env
    applied for the call); `record`, `check` and `demo` run `python -m tracediff` in a
    subprocess. An exception escaping the CLI in-process is appended to stderr as the
    traceback a subprocess would have printed, so "no traceback" assertions still hold.
    `file_size_limit` (bytes): the process's RLIMIT_FSIZE, SIGXFSZ ignored, so that a write
    past it fails with EFBIG as one on a full disk fails with ENOSPC.
    """
    args = tuple(map(str, args))
    if own_process is None:
        own_process = not args or args[0] in OWN_PROCESS or file_size_limit is not None
    limits = {} if file_size_limit is None else {
        "rlimits": {"RLIMIT_FSIZE": int(file_size_limit)}, "ignore_signals": ["SIGXFSZ"]}
    zygote = zygote_for(env, args) if own_process else None
    if zygote is not None:
        proc = zygote.run(["-m", "tracediff", *args], cwd=cwd, env=env, **limits)
    elif own_process:
        proc = subprocess.run([sys.executable, "-m", "tracediff", *args], env=script_env(env),
                              cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_preexec(limits) if limits else None)
    else:
        proc = _run_in_process(args, env, cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"tracediff {' '.join(args)} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}")
    return proc


def apply_limits(limits):
    """In the process about to run a job: the "rlimits" ({"RLIMIT_FSIZE": bytes, ...}) and
    "ignore_signals" (["SIGXFSZ", ...]) of LIMITS (a job of tests/zygote.py, or a dict)."""
    import resource
    import signal

    for name in limits.get("ignore_signals", ()):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    for name, value in limits.get("rlimits", {}).items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _preexec(limits):
    """A subprocess preexec_fn applying LIMITS (apply_limits)."""
    return lambda: apply_limits(limits)


def run_printed_command(command, cwd=None):
    """Run a `tracediff ...` command line that tracediff printed, as a user pasting it into
    a shell would: /bin/sh parses it (quoting, a `VAR=value` prefix) and the parsed
    command runs with run_cli (a warm zygote where the environment allows)."""
    echo = (f"{shlex.quote(sys.executable)} -c 'import json, os, sys; "
            f"print(json.dumps([dict(os.environ), sys.argv[1:]]))'")
    assert command.startswith("tracediff ") or " tracediff " in command, command
    base = script_env()
    shown = subprocess.run(command.replace("tracediff", echo, 1), shell=True, env=base,
                           cwd=cwd or ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    environ, argv = json.loads(shown.stdout)
    extra = {k: v for k, v in environ.items()   # what the command's prefix set
             if base.get(k) != v and k not in ("PWD", "OLDPWD", "SHLVL", "_")}
    return run_cli(*argv, env=extra or None, cwd=cwd)


def _run_in_process(args, env, cwd):
    from click.testing import CliRunner

    from tracediff.cli import main

    here = os.getcwd()
    os.chdir(cwd or ROOT)
    try:
        result = CliRunner().invoke(main, list(args), env=dict(env or {}), prog_name="tracediff")
    finally:
        os.chdir(here)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(
            traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["tracediff", *args], result.exit_code,
                                       result.stdout, stderr)


def loopback_refused():
    """Why no process here can open a TCP socket on the loopback (gVisor sandboxes without
    a network, such as the TPU machine's), or None. torchrun with gloo, jax.distributed and
    Dask clusters need one."""
    import socket
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
    except OSError as e:
        return f"no TCP socket on the loopback here ({e}): multi-process runs cannot start"
    return None


def require_loopback():
    """Skip the test (with the reason) where processes cannot talk over the loopback."""
    import pytest
    why = loopback_refused()
    if why:
        pytest.skip(why)


_FUSIONS_ALIKE = """
import numpy as np, jax, jax.numpy as jnp
from tracediff.capture.jax import digest_programs as dp
from tracediff.trace import values
def prog(a):
    h = jax.lax.iota(jnp.float32, 2059) / np.float32(2059.0)
    kept = jax.lax.optimization_barrier([a * (np.float32(1.0) - h)])
    return kept[0], dp.lanes(kept[0])
x, lanes = jax.jit(prog)(jnp.float32(-1.0))
print(tuple(int(v) for v in np.asarray(lanes)) == tuple(int(v) for v in values.words_lanes(np.asarray(x))))
"""


@functools.lru_cache(maxsize=None)
def xla_cpu_hashes_what_it_returns():
    """Why XLA:CPU here does not hash inside a program the very values the program returns,
    or None. The device path hashes a value behind an optimization barrier in the program
    that returns it; XLA:CPU expands barriers and may recompute a cheap value inside the
    hashing fusion, and where its code generator rounds the two fusions' copies apart (seen
    under AVX2 code: `jnp.linspace`'s `1 - iota / n`, a TPU host's CPU), the hash is of
    other bytes. The product hashes on the host on XLA:CPU; tests that force the device
    path there check this premise first."""
    proc = subprocess.run([sys.executable, "-c", _FUSIONS_ALIKE], env=script_env(),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return f"the premise check failed to run: {proc.stderr.strip()[-300:]}"
    if proc.stdout.strip() != "True":
        return ("XLA:CPU on this CPU recomputes a value inside the hashing fusion with other "
                "rounding (optimization barriers are expanded there): device-path hashes on "
                "XLA:CPU cannot be of the returned bytes here")
    return None


def script_env(extra=None):
    """The environment of a subprocess that runs tracediff or a fixture: this one, without
    XLA_FLAGS (so a developer's flags never leak in), with EXTRA, and this checkout on
    PYTHONPATH after any PYTHONPATH in EXTRA (a perturbation's sitecustomize first) and
    before this process's own (where a machine keeps its packages: the TPU host's JAX)."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env.update(extra or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in ((extra or {}).get("PYTHONPATH"), ROOT,
                                                    os.environ.get("PYTHONPATH")) if p)
    return env


def locate_json(a, b, *extra):
    """`tracediff locate A B --json EXTRA...` -> the report (exit code checked against it)."""
    proc = run_cli("locate", a, b, "--json", *extra)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["exit_code"] == proc.returncode
    return report


def explain_json(a, b, *extra):
    """`tracediff explain A B --json EXTRA...` -> the analysis."""
    proc = run_cli("explain", a, b, "--json", *extra)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def record(script, out, *script_args, env=None, extra=(), check=True, file_size_limit=None):
    """Record fixtures/SCRIPT into OUT in a process of its own; returns CompletedProcess."""
    path = script if os.path.isabs(script) else os.path.join(FIXTURES, script)
    return run_cli("record", "-o", out, *extra, path, *script_args, env=env, check=check,
                   file_size_limit=file_size_limit)


def run_plain(script, *script_args, env=None, cwd=None, check=True):
    """Run a fixture (or a script given by its absolute path) without tracediff, in CWD
    (default: the checkout); returns CompletedProcess (text), raising on a non-zero exit
    status when `check`."""
    path = script if os.path.isabs(script) else os.path.join(FIXTURES, script)
    argv = [path, *map(str, script_args)]
    zygote = zygote_for(env, argv)
    if zygote is not None:
        proc = zygote.run(argv, cwd=cwd, env=env)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc
    return subprocess.run([sys.executable, *argv], env=script_env(env), cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=600, check=check)


class Zygote:
    """Client of tests/zygote.py: a warm process (tracediff and the frameworks imported)
    that forks a child per job instead of starting an interpreter; one per framework set
    for the whole test run, shared by the pytest-xdist workers over a Unix socket in
    TRACEDIFF_TESTS_ZYGOTES (tests/conftest.py; without it, one per pytest process). The
    first process that needs it starts it, under a file lock. Jobs run concurrently:
    `start` returns a handle, `finish` waits for it (a child ends itself after 900 s, as
    a timeout would)."""

    def __init__(self, frameworks):
        import socket
        import tempfile

        from filelock import FileLock

        self.folder = tempfile.mkdtemp(prefix="tracediff-zygote-")
        shared = os.environ.get("TRACEDIFF_TESTS_ZYGOTES") or self.folder
        name = frameworks.replace(",", "+")
        address, env_file = (os.path.join(shared, f"{name}{ext}") for ext in (".sock", ".env"))
        with FileLock(os.path.join(shared, f"{name}.lock")):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(address)
            except OSError:   # none yet, or one that ended idle: start one
                if os.path.exists(address):
                    os.unlink(address)
                env = script_env(None)
                starter = subprocess.Popen([sys.executable, "-m", "tests.zygote", frameworks,
                                            address], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE, text=True,
                                           start_new_session=True)
                assert json.loads(starter.stdout.readline()) == {"ready": True}
                starter.stdout.close()
                with open(env_file, "w") as f:
                    json.dump({"pid": starter.pid, "env": env}, f)
                self.sock.connect(address)
            with open(env_file) as f:
                self.env = json.load(f)["env"]   # what the zygote's imports saw
        # replies are read through a file, jobs sent on the socket itself: a text file
        # open for both would drop the replies it has read ahead whenever it writes
        self.replies = self.sock.makefile("r", encoding="utf-8")
        self.alive = True
        self.next_id = 0
        self.done = {}

    def start(self, argv, cwd=None, env=None, **limits):
        """`limits`: "rlimits" and "ignore_signals" of the protocol (tests/zygote.py)."""
        self.next_id += 1
        job = {"id": self.next_id, "argv": list(map(str, argv)), "cwd": str(cwd or ROOT),
               "env": script_env(env), **limits,
               "stdout": os.path.join(self.folder, f"{self.next_id}.out"),
               "stderr": os.path.join(self.folder, f"{self.next_id}.err")}
        self.sock.sendall((json.dumps(job) + "\n").encode())
        return job

    def finish(self, job):
        """CompletedProcess of a started job (args as `python ARGV...` would have)."""
        while job["id"] not in self.done:
            line = self.replies.readline()
            if not line:
                self.alive = False
            assert line, "the test zygote died"
            msg = json.loads(line)
            self.done[msg["id"]] = msg["rc"]
        rc = self.done.pop(job["id"])
        outs = []
        for key in ("stdout", "stderr"):
            with open(job[key], errors="replace") as f:
                outs.append(f.read())
            os.unlink(job[key])
        return subprocess.CompletedProcess([sys.executable, *job["argv"]], rc, *outs)

    def run(self, argv, cwd=None, env=None, **limits):
        return self.finish(self.start(argv, cwd, env, **limits))

    def close(self):
        import shutil
        self.alive = False
        self.replies.close()
        self.sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def stop_zygotes(folder):
    """End the zygotes started in FOLDER (TRACEDIFF_TESTS_ZYGOTES) and their children."""
    import glob
    import signal

    for env_file in glob.glob(os.path.join(folder, "*.env")):
        if not os.path.exists(env_file[:-len(".env")] + ".sock"):
            continue   # it ended idle (and removed its socket)
        try:
            with open(env_file) as f:
                os.killpg(json.load(f)["pid"], signal.SIGTERM)   # its own session
        except (OSError, ValueError, KeyError):
            pass


_ZYGOTES = {}
_LAZY = {"XLA_FLAGS", "MKL_CBWR", "PYTHONPATH", "TRACEDIFF_MIN_FREE_MB"}
# environment variables torch, JAX or XLA may read when imported (the zygote imported them)
_READ_AT_IMPORT = ("JAX_", "XLA_", "TF_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_",
                   "PYTHON")


def zygote_for(env, argv):
    """The zygote for the job `python ARGV...` with ENV (tests/zygote.py), or None when the
    job needs a fresh interpreter or TRACEDIFF_TESTS_ZYGOTE=0 says so.

    The zygote is the one that imported the frameworks the job's script imports (found in
    its source; a script importing neither gets a fresh interpreter). ENV may set what is
    read after start-up (XLA_FLAGS when JAX starts its backend, MKL_CBWR at the first BLAS
    call: the zygote did neither; TRACEDIFF_MIN_FREE_MB when a recording starts) and
    PYTHONPATH (a perturbation's sitecustomize, run by the child as `site` would); anything
    else needs a fresh interpreter."""
    if os.environ.get("TRACEDIFF_TESTS_ZYGOTE", "1") == "0" or set(env or ()) - _LAZY:
        return None
    frameworks = _frameworks_of(argv)
    if not frameworks:
        return None
    z = _ZYGOTES.get(frameworks)
    if z is not None and z.alive:
        # a variable the frameworks read when imported changed since the zygote started
        # (tests change this process's environment): the job needs a fresh interpreter
        now, then = script_env(None), z.env
        if any(now.get(k) != then.get(k) for k in {*now, *then} if k.startswith(_READ_AT_IMPORT)):
            return None
        return z
    import atexit
    z = _ZYGOTES[frameworks] = Zygote(frameworks)
    atexit.register(z.close)
    return z


def _frameworks_of(argv):
    """"torch", "jax" or "torch,jax": what the first script in ARGV imports."""
    import re

    script = next((a for a in map(str, argv) if a.endswith(".py") and os.path.isfile(a)), None)
    if script is None:
        return ""
    with open(script, encoding="utf-8", errors="replace") as f:
        text = f.read()
    found = set(re.findall(r"^\s*from\s+(torch|jax|flax|optax)\b", text, re.M))
    for names in re.findall(r"^\s*import\s+([\w., ]+)", text, re.M):   # import a, torch
        found.update(n.split()[0].split(".")[0] for n in names.split(",") if n.strip())
    return ",".join(fw for fw in ("torch", "jax") if fw in found or
                    (fw == "jax" and found & {"flax", "optax"}))


def record_many(jobs, max_parallel=2):
    """Record several fixtures concurrently. jobs: {key: (script, out, args, env[, options])}
    with `options` for tracediff record itself (before the script).

    Returns {key: CompletedProcess}; raises if any recording fails.
    """
    pending, running, done = list(jobs.items()), [], {}
    while pending or running:
        while pending and len(running) < max_parallel:
            key, (script, out, args, env, *options) = pending.pop(0)
            path = script if os.path.isabs(script) else os.path.join(FIXTURES, script)
            argv = ["-m", "tracediff", "record", "-o", str(out), *(options[0] if options else ()),
                    path, *map(str, args)]
            zygote = zygote_for(env, argv)
            if zygote is not None:
                running.append((key, zygote, zygote.start(argv, env=env)))
            else:
                running.append((key, None, subprocess.Popen(
                    [sys.executable, *argv], env=script_env(env), cwd=ROOT, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
        key, zygote, job = running.pop(0)
        if zygote is not None:
            proc = zygote.finish(job)
        else:
            stdout, stderr = job.communicate(timeout=900)
            proc = subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)
        if proc.returncode != 0:
            raise AssertionError(f"recording {key} exited {proc.returncode}:\n{proc.stderr[-5000:]}")
        done[key] = proc
    return done


def shared_folder(tmp_path_factory, name):
    """A folder of this test run that every pytest-xdist worker sees (without xdist, a new
    temporary folder): for recordings made once per run, under a file lock."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.getbasetemp().parent / name
        folder.mkdir(exist_ok=True)
        return folder
    return tmp_path_factory.mktemp(name)


class Recordings:
    """Recordings shared by the whole test run: each distinct (script, args, env, options,
    tag) is recorded once, whichever module asks first, and handed to every module that
    asks again — across pytest-xdist workers too: FOLDER is shared by the workers, a file
    lock per recording makes the first worker that asks record it while another that asks
    waits for it, and the recording's output (stdout, stderr) is kept beside the trace.
    The files are made read-only so that no test edits a shared trace in place (copy it
    first). `tag` tells apart two recordings of the same run (two identical runs must
    match)."""

    def __init__(self, folder):
        self.folder = folder
        self.paths = {}
        self.procs = {}

    @staticmethod
    def _key(script, args=(), env=None, options=(), tag=""):
        return (script, tuple(map(str, args)), tuple(sorted((env or {}).items())),
                tuple(map(str, options)), tag)

    def _out(self, key):
        digest = hashlib.sha1(repr(key).encode()).hexdigest()[:12]
        return self.folder / f"{os.path.basename(key[0])[:-3]}-{digest}.h5"

    def __call__(self, script, *args, env=None, options=(), tag=""):
        """The path of SCRIPT ARGS recorded with ENV and `tracediff record` OPTIONS."""
        return self.many({"one": (script, args, env, options, tag)})["one"]

    def many(self, jobs):
        """{key: (script, args, env[, options[, tag]])} -> {key: path}; what no worker
        has recorded yet is recorded here, two at a time."""
        from filelock import FileLock, Timeout

        keys = {k: self._key(*job) for k, job in jobs.items()}
        mine, theirs = {}, {}
        for key in dict.fromkeys(keys.values()):
            if key in self.paths:
                continue
            lock = FileLock(str(self._out(key)) + ".lock")
            try:
                lock.acquire(timeout=0)
            except Timeout:             # another worker is recording it now
                theirs[key] = lock
                continue
            if self._load(key):
                lock.release()
            else:
                mine[key] = lock
        try:
            self._record(list(mine))
        finally:
            for lock in mine.values():
                lock.release()
        for key, lock in theirs.items():
            with lock:
                if not self._load(key):  # that worker failed: record it here
                    self._record([key])
        return {k: self.paths[key] for k, key in keys.items()}

    def _record(self, keys):
        if not keys:
            return
        outs = {key: self._out(key) for key in keys}
        procs = record_many({i: (key[0], outs[key], key[1], dict(key[2]), list(key[3]))
                             for i, key in enumerate(keys)})
        for i, key in enumerate(keys):
            proc = procs[i]
            os.chmod(outs[key], 0o444)
            with open(str(outs[key]) + ".json", "w") as f:   # written last: "recorded"
                json.dump({"args": proc.args, "stdout": proc.stdout, "stderr": proc.stderr}, f)
            self.paths[key], self.procs[outs[key]] = outs[key], proc

    def _load(self, key):
        """Take a recording another worker finished; False if there is none."""
        out = self._out(key)
        try:
            with open(str(out) + ".json") as f:
                done = json.load(f)
        except FileNotFoundError:
            return False
        self.paths[key] = out
        self.procs[out] = subprocess.CompletedProcess(done["args"], 0, done["stdout"],
                                                      done["stderr"])
        return True

    def proc(self, path):
        """The CompletedProcess of the recording at PATH (its stdout is the script's)."""
        return self.procs[path]

    def plain(self, script, *args, env=None):
        """`run_plain(SCRIPT, ARGS...)`, run once per test run like a recording: what the
        script prints without tracediff, for every module that compares a recording's
        output with it."""
        from filelock import FileLock

        key = self._key(script, args, env, (), "plain")
        out = str(self._out(key))[:-3] + ".plain.json"
        with FileLock(out + ".lock"):
            if not os.path.exists(out):
                proc = run_plain(script, *args, env=env)
                with open(out + ".part", "w") as f:
                    json.dump({"args": list(map(str, proc.args)), "stdout": proc.stdout,
                               "stderr": proc.stderr}, f)
                os.replace(out + ".part", out)
            with open(out) as f:
                done = json.load(f)
        return subprocess.CompletedProcess(done["args"], 0, done["stdout"], done["stderr"])


def render_terminal(render, *args, width=200, **kw):
    """What a terminal renderer (print_locate, print_analysis, ...) prints, as plain text
    on a WIDTH-column console without colour."""
    import io

    from rich.console import Console

    out = io.StringIO()
    render(*args, console=Console(file=out, width=width, no_color=True, highlight=False,
                                  soft_wrap=True, emoji=False), **kw)
    return out.getvalue()


def check_values(t):
    """Every stored value of an open trace reads back and matches its recorded hash;
    returns how many were checked."""
    from tracediff.trace import values

    n = 0
    for row in t.values:
        if t.read_value(row) is None:
            continue
        raw = t._blob[int(row["offset"]):int(row["offset"]) + int(row["nbytes"])].tobytes()
        assert values.digest(raw) == int(row["hash"])
        n += 1
    return n


def metadata_only_copy(src, dst):
    """A copy of trace `src` at `dst` with every value marked metadata only (no bytes, no
    hash), as a recorder that could not read them leaves them; returns `dst`."""
    import shutil

    import h5py
    import numpy as np

    from tracediff.trace import schema

    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        v = f["values"][...]
        v["flags"] = (v["flags"] | schema.VFLAG_NOT_STORED) & ~np.uint8(schema.VFLAG_STATS)
        v["offset"] = -1
        f["values"][...] = v
    return dst


_STRING_FIELDS = {"events": ("op", "params", "name_stack", "source", "node"),
                  "values": ("dtype", "storage", "shape", "name"),
                  "sources": ("source", "lines", "sha256"), "devices": ("device",),
                  "shards": ("device", "index", "shape"),
                  "placements": ("placements", "mesh", "coord", "global_shape", "offset",
                                 "param"),
                  "optim_settings": ("key", "text")}


def trace_rows(path, by_value=False):
    """Every table of a trace as lists of row tuples, string indices resolved to their
    text (two traces intern strings in their own order); stats rows keyed by value row
    and sorted (device results fill them later, in another order). `by_value`: each value
    row's blob offset replaced by the sha256 of its bytes, and the blob not compared as a
    whole (values fetched as one buffer keep its layout)."""
    import h5py

    from tracediff.trace import schema

    out = {}
    with h5py.File(path, "r") as f:
        strings = [s.decode() if isinstance(s, bytes) else s for s in f["strings"][:]]
        for name in schema.TABLES:
            if name not in f:
                out[name] = []
                continue
            rows = f[name][:]
            fields = rows.dtype.names
            text = set(_STRING_FIELDS.get(name, ()))
            out[name] = [tuple(strings[v] if k in text and v >= 0 else
                               (None if k in text else v.item()) for k, v in zip(fields, r))
                         for r in rows]
        out["stats"].sort()
        blob = f["blob"][:].tobytes() if "blob" in f else b""
        out["blob"] = "" if by_value else hashlib.sha256(blob).hexdigest() if blob else ""
    if by_value:
        at = {k: i for i, k in enumerate(schema.TABLES["values"].names)}
        out["values"] = [r[:at["offset"]] + (None if r[at["offset"]] < 0 else hashlib.sha256(
            blob[r[at["offset"]]:r[at["offset"]] + r[at["nbytes"]]]).hexdigest(),) +
            r[at["offset"] + 1:] for r in out["values"]]
    return out


def first_difference(a, b, stats_rtol=0.0, by_value=False):
    """None when two traces hold the same rows (trace_rows; `by_value`: the same bytes
    for each value, wherever in the blob), else where they first differ.
    `stats_rtol`: statistics equal within it count as equal (the host reduces small values
    in batches whose makeup follows the flush clock: float32 or float64 accumulation)."""
    ra, rb = trace_rows(a, by_value), trace_rows(b, by_value)
    for name in ra:
        if len(ra[name]) != len(rb[name]):
            return f"{name}: {len(ra[name])} rows against {len(rb[name])}"
        if name == "blob":
            if ra[name] != rb[name]:
                return "blob bytes differ"
            continue
        for i, (x, y) in enumerate(zip(ra[name], rb[name])):
            if x != y and not (x == x or y == y):   # NaN statistics
                continue
            if x != y:
                same_nan = all(p == q or (p != p and q != q) or (
                    name == "stats" and stats_rtol and isinstance(p, float) and
                    abs(p - q) <= stats_rtol * max(abs(p), abs(q))) for p, q in zip(x, y))
                if not same_nan:
                    return f"{name} row {i}: {x} against {y}"
    return None
