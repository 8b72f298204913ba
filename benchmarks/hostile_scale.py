"""Hostile traces at the sizes of the reported attacks: time and peak memory of the command.

Each attack is a real recording (fixtures/torch_dot.py) edited with h5py by the builders of
tests/test_untrusted_bounds.py, at full size:

  cross     `locate` on a cross-framework pair with N unpaired external inputs per side
  regions   `locate` on a same-framework pair with R anchor regions of L differing ops
  expand    `locate` (with its replay verdict) on a pair whose first difference is an
            aten::expand whose parameters ask for a [S, 4] float32 output
  manifest  `info` on a trace with an M-byte manifest
  strings   `info` on a trace with K extra (unreferenced) strings

Each command runs in a child process (its peak RSS is its VmHWM), with a timeout and
wall time measured (not CPU: the machine may be shared); `--root` picks the tracediff source tree to run (e.g. an export of the previous
commit, for before/after numbers):

    python benchmarks/hostile_scale.py [--root DIR] [--only cross,regions] [--timeout 600]
        [--cross 100000] [--regions 40x1100] [--expand 250000000] [--manifest 250000000]
        [--strings 5000000] [--limit-gb 0]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests import test_untrusted_bounds as hostile  # noqa: E402
from tests.helpers import record  # noqa: E402


def run(root, args, timeout, limit_gb):
    """(wall s or None on timeout, CPU s, peak RSS MB, exit code, last stderr line, stdout)
    (CPU and peak are None when the command did not exit normally).
    The peak is the child's VmHWM, written by the child as it exits (ru_maxrss of a
    child counts its parent's RSS at the fork too)."""
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=root)
    env.pop("XLA_FLAGS", None)
    fd, peak_file = tempfile.mkstemp(suffix=".peak")
    os.close(fd)
    code = ("import atexit, os, resource, sys\n"
            + (f"resource.setrlimit(resource.RLIMIT_AS, ({int(limit_gb * 2**30)}, "
               f"{int(limit_gb * 2**30)}))\n" if limit_gb else "")
            + "def peak():\n"
            "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
            "    t = os.times()\n"
            f"    open({peak_file!r}, 'w').write(hwm[0].split()[1] + ' ' + str(t.user + t.system))\n"
            "atexit.register(peak)\n"
            "sys.argv = ['tracediff'] + sys.argv[1:]\n"
            "from tracediff.cli import main\n"
            "main()\n")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env, cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        wall = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        wall = None
    text = open(peak_file).read().split()
    os.remove(peak_file)
    peak, cpu = (int(text[0]) / 1024, float(text[1])) if text else (None, None)
    last = (err.strip().splitlines() or [""])[-1][:200]
    return wall, cpu, peak, proc.returncode, last, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=ROOT, help="tracediff source tree to run")
    ap.add_argument("--only", default="cross,regions,expand,manifest,strings")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--limit-gb", type=float, default=0, help="RLIMIT_AS of each command")
    ap.add_argument("--cross", type=int, default=100_000)
    ap.add_argument("--regions", default="40x1100")
    ap.add_argument("--expand", type=int, default=250_000_000)
    ap.add_argument("--manifest", type=int, default=250_000_000)
    ap.add_argument("--strings", type=int, default=5_000_000)
    ap.add_argument("--trace", help="an existing recording of fixtures/torch_dot.py")
    args = ap.parse_args()
    only = args.only.split(",")
    with tempfile.TemporaryDirectory() as d:
        src = args.trace
        if src is None:
            src = os.path.join(d, "dot.h5")
            record("torch_dot.py", src)
        a, b = os.path.join(d, "a.h5"), os.path.join(d, "b.h5")
        jobs = []
        if "cross" in only:
            jobs.append((f"cross, {args.cross:,} inputs per side",
                         lambda: hostile.many_inputs(src, a, b, args.cross),
                         ("locate", a, b, "--json", "--no-explain"), (a, b)))
        if "regions" in only:
            r, L = map(int, args.regions.split("x"))
            jobs.append((f"regions, {r} x {L:,} ops",
                         lambda: hostile.many_regions(src, a, b, r, L),
                         ("locate", a, b, "--json", "--no-explain"), (a, b)))
        if "expand" in only:
            jobs.append((f"expand to [{args.expand:,}, 4]",
                         lambda: hostile.expand_op(src, a, b, (args.expand, 4)),
                         ("locate", a, b, "--json"), (a, b)))
        if "manifest" in only:
            jobs.append((f"manifest of {args.manifest:,} bytes",
                         lambda: hostile.huge_manifest(src, a, args.manifest),
                         ("info", a, "--json"), (a,)))
        if "strings" in only:
            jobs.append((f"{args.strings:,} strings",
                         lambda: hostile.many_strings(src, a, args.strings),
                         ("info", a, "--json"), (a,)))
        print(f"root {args.root}; load {os.getloadavg()[0]:.1f}")
        print("| attack | files MB | command | wall s | CPU s | peak RSS MB | exit | last line |")
        print("|---|---:|---|---:|---:|---:|---:|---|")
        for name, build, cmd, files in jobs:
            build()
            mb = sum(os.path.getsize(p) for p in files) / 1e6
            wall, cpu, peak, rc, last, _ = run(args.root, cmd, args.timeout, args.limit_gb)
            wall_s = f"{wall:.1f}" if wall is not None else f"> {args.timeout:.0f} (killed)"
            cpu_s = f"{cpu:.1f}" if cpu is not None else "?"
            peak_s = f"{peak:,.0f}" if peak is not None else "?"
            last = last.replace(d, "DIR").replace("|", "/")
            print(f"| {name} | {mb:.1f} | {cmd[0]} | {wall_s} | {cpu_s} | {peak_s} | {rc} | "
                  f"{last} |", flush=True)
            for p in files:
                os.remove(p)


if __name__ == "__main__":
    main()
