"""The floor under any Python aten-level recorder: the GRU+Adam loop under a
TorchDispatchMode that only calls the op (nothing recorded), and under one that does the
least a Python recorder of values must do per op (`Least`), against the plain loop;
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

    class Least(TorchDispatchMode):
        """The least any Python recorder of values and dataflow does per op: the input
        tensors' producers looked up by id, the op called, one event row, and per output
        its host view, a 64-bit hash, its bytes copied into a buffer and a value row. No
        source lines, module paths, versions, aliases or autograd nodes; nothing written
        to disk."""

        def __init__(self):
            super().__init__()
            self.producer, self.events, self.values = {}, [], []
            self.blob = bytearray()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Tensor, producer = torch.Tensor, self.producer
            ins = [producer.get(id(a), -1) for a in args if isinstance(a, Tensor)]
            out = func(*args, **(kwargs or {}))
            eid = len(self.events)
            self.events.append((func.__name__, ins))
            outs = (out,) if isinstance(out, Tensor) else (
                out if isinstance(out, (list, tuple)) else ())
            for slot, o in enumerate(outs):
                if not isinstance(o, Tensor):
                    continue
                producer[id(o)] = (eid, slot)
                arr = (o.detach() if o.requires_grad else o).numpy()
                buf = arr.data.cast("B") if arr.flags.c_contiguous else arr.tobytes()
                self.values.append((eid, slot, len(self.blob), digest(buf)))
                self.blob += buf
            if len(self.blob) > 64 << 20:   # a flush's worth: dropped, not written
                self.blob = bytearray()
            return out

    from tracediff.trace.values import digest

    train(3)
    best = {}
    modes = {"bare dispatch mode": Bare, "least Python recorder (no disk)": Least}
    for _ in range(args.repeat):
        for name in ("plain", *modes):
            if name == "plain":
                t = train(args.steps)[2]
            else:
                with modes[name]():
                    t = train(args.steps)[2]
            best[name] = min(best.get(name, 1e9), t)
    base = best["plain"]
    print(f"load average: {os.getloadavg()}")
    for name, t in best.items():
        print(f"| {name} | {t:.3f} | {t / base:.1f}x |")


if __name__ == "__main__":
    main()
