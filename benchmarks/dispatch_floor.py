"""The floor under any Python aten-level recorder: the GRU+Adam loop under a
TorchDispatchMode that only calls the op (nothing recorded), against the plain loop;
with `--levels`, the recorder itself at those levels beside them.

    python benchmarks/dispatch_floor.py [--steps 100] [--repeat 3] [--levels full,stats]

`--levels` runs `tracediff record --level L` on the same loop in subprocesses, interleaved
with plain runs of the script (the machine may be shared), OMP_NUM_THREADS=1, and prints
the median loop CPU seconds of each, its ratio to plain and the recorder's cost per
recorded op (the extra loop seconds over the trace's op count).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures")
sys.path.insert(0, FIX)


def _loop_seconds(cmd, env):
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    m = re.search(r"loop_cpu_s=([0-9.]+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return float(m.group(1))


def _ops_in(path):
    import tracediff

    with tracediff.load(path) as t:
        return int(((t.manifest.get("frameworks") or {}).get("torch") or {}).get("ops", 0))


def levels(steps, repeat, names):
    """Median loop CPU seconds: plain and recorded at each level, interleaved."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    script = [os.path.join(FIX, "torch_gru_adam.py"), "--steps", str(steps), "--time"]
    runs, ops = {}, {}
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        for _ in range(repeat):
            runs.setdefault("plain", []).append(_loop_seconds([sys.executable, *script], env))
            for level in names:
                out = os.path.join(folder, f"{level}.h5")
                runs.setdefault(level, []).append(_loop_seconds(
                    [sys.executable, "-m", "tracediff", "record", "-o", out, "--level", level,
                     *script], env))
                ops[level] = _ops_in(out)
                os.unlink(out)
    base = statistics.median(runs["plain"])
    print(f"load average: {os.getloadavg()}; loop CPU s, median of {repeat} interleaved runs")
    print("| run | loop CPU s | x plain | recorder us per op | ops |")
    print("|---|---:|---:|---:|---:|")
    print(f"| plain | {base:.3f} | 1.0x | | |")
    for level in names:
        t = statistics.median(runs[level])
        per = (t - base) / ops[level] * 1e6 if ops[level] else float("nan")
        print(f"| {level} | {t:.3f} | {t / base:.1f}x | {per:.1f} | {ops[level]:,} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--levels", default="",
                    help="comma-separated record levels to run beside plain (e.g. full,stats)")
    args = ap.parse_args()
    if args.levels:
        levels(args.steps, args.repeat, [x for x in args.levels.split(",") if x])
        return
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch_gru_adam import train

    torch.set_num_threads(1)

    class Bare(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    train(3)
    best = {}
    for _ in range(args.repeat):
        for name in ("plain", "bare dispatch mode"):
            if name == "plain":
                t = train(args.steps)[2]
            else:
                with Bare():
                    t = train(args.steps)[2]
            best[name] = min(best.get(name, 1e9), t)
    base = best["plain"]
    print(f"load average: {os.getloadavg()}")
    for name, t in best.items():
        print(f"| {name} | {t:.3f} | {t / base:.1f}x |")


if __name__ == "__main__":
    main()
