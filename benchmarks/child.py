"""One shared way to time a child process: wall seconds and the child's CPU seconds."""

import resource
import subprocess
import time


def run_timed(cmd, env):
    """Run `cmd`; returns (CompletedProcess, wall seconds, child user+sys CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall, cpu
