"""A program run plainly and recorded, the same way: the plain run is the truth for what
the recorded one prints and how it ends (used by the signals and optimizer areas)."""

import os
import signal
import subprocess
import sys
import time

import h5py


def both(work, program, *args, sigterm=False, env=None):
    """{"plain": (returncode, stdout), "recorded": (...)} of PROGRAM (text) run in `work`;
    with `sigterm`, SIGTERM is sent once the program has made a file named `ready`."""
    script = os.path.join(work, "script.py")
    with open(script, "w") as f:
        f.write(program)
    out = {}
    for run, cmd in (("plain", [sys.executable, script, *args]),
                     ("recorded", [sys.executable, "-m", "tracediff", "record", "-o",
                                   os.path.join(work, "trace.h5"), script, *args])):
        ready = os.path.join(work, "ready")
        if os.path.exists(ready):
            os.remove(ready)
        proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, **(env or {})})
        if sigterm:
            deadline = time.time() + 120
            while not os.path.exists(ready) and time.time() < deadline and proc.poll() is None:
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
        out[run] = (proc.returncode, stdout)
        out[run + "_stderr"] = stderr
    return out


def manifest(work):
    import json

    with h5py.File(os.path.join(work, "trace.h5"), "r") as f:
        return json.loads(f["manifest"][()])


def same(got):
    """Held where the recorded run printed and ended as the plain one."""
    return got["recorded"] == got["plain"], \
        f"plain {got['plain'][0]} {got['plain'][1][-60:]!r}, recorded {got['recorded'][0]} " \
        f"{got['recorded'][1][-60:]!r}"
