"""Shared test helpers: run the real CLI in a subprocess, as a user would."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")


def run_cli(*args, env=None, cwd=None, check=False, timeout=600):
    """Run `python -m tracediff ARGS...`; returns CompletedProcess (text)."""
    full_env = dict(os.environ)
    full_env.pop("XLA_FLAGS", None)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, full_env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "tracediff", *map(str, args)], env=full_env,
                          cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"tracediff {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}")
    return proc


def record(script, out, *script_args, env=None, extra=(), check=True):
    """Record fixtures/SCRIPT into OUT in a fresh subprocess; returns CompletedProcess."""
    path = script if os.path.isabs(script) else os.path.join(FIXTURES, script)
    return run_cli("record", "-o", out, *extra, path, *script_args, env=env, check=check)


def run_plain(script, *script_args, env=None):
    """Run a fixture without tracediff; returns CompletedProcess (text)."""
    path = script if os.path.isabs(script) else os.path.join(FIXTURES, script)
    full_env = dict(os.environ)
    full_env.pop("XLA_FLAGS", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, path, *script_args], env=full_env, capture_output=True,
                          text=True, timeout=600, check=True)


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
            full_env = dict(os.environ)
            full_env.pop("XLA_FLAGS", None)
            full_env.update(env or {})
            full_env["PYTHONPATH"] = os.pathsep.join(
                p for p in ((env or {}).get("PYTHONPATH"), ROOT) if p)
            proc = subprocess.Popen([sys.executable, "-m", "tracediff", "record", "-o", str(out),
                                     *(options[0] if options else ()), path, *args], env=full_env, cwd=ROOT, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            running.append((key, proc))
        key, proc = running.pop(0)
        stdout, stderr = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise AssertionError(f"recording {key} exited {proc.returncode}:\n{stderr[-5000:]}")
        done[key] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return done
