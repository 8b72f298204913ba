"""Every row of issue #30's table in one command, with the disk's speed beside the full rows.

Rows (loop CPU seconds of the fixture's own timer, steps 2..N for the JAX MLP, all steps
for the torch GRU; the minimum of `--repeat` interleaved runs, as benchmarks/overhead.py;
OMP_NUM_THREADS=1):

  jax_mlp   fixtures/jax_mlp.py 256-1024-1024-256, batch 64: full / stats / calls with the
            default values (replay), then full / stats with `--jax-values compiled`
  torch_gru fixtures/torch_gru_adam.py, 100 steps (~34k tiny ops): full / stats

For every full row the script also writes the trace's byte count with
`dd if=/dev/zero of=FILE bs=1M count=N conv=fsync oflag=nocache` in the same folder,
right after the recording (nocache: dd drops its pages from the page cache as it goes, as
the trace writer does after each fsync; without it dd's speed here swung 157-1145 MB/s with
whether the VM's free pages had been touched before), and prints the disk's speed and the
ratio issue #30 asks about: the recording's time beyond the plain loop (loop wall
seconds, recorded minus plain) over dd's time for the bytes written inside the timed
loop (the trace's bytes x (N-1)/N for the JAX MLP, whose timer starts after the first
step). Only the JAX fixture prints its loop's wall
time; the torch rows give CPU ratios.

The issue's JAX rows are 30 steps (a 6.1 GB trace at full); `--jax-steps` makes them
shorter (each trace is deleted as soon as it is measured; the disk needs room for one
trace and one dd file of its size).

    python benchmarks/issue30.py [--repeat 2] [--jax-steps 30] [--gru-steps 100]
                                 [--only jax_mlp,torch_gru] [--codec none|zstd]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from child import run_timed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures")
MLP = ["--sizes", "256,1024,1024,256", "--batch", "64"]
COMPILED = ["--jax-values", "compiled"]


def workloads(jax_steps, gru_steps, codec):
    full = ["--level", "full"] + (["--codec", codec] if codec != "none" else [])
    return {
        "jax_mlp": ("jax_mlp.py", MLP + ["--steps", str(jax_steps)], jax_steps, {
            "full": full,
            "stats": ["--level", "stats"],
            "calls": ["--level", "calls"],
            "full --jax-values compiled": full + COMPILED,
            "stats --jax-values compiled": ["--level", "stats"] + COMPILED,
        }),
        "torch_gru": ("torch_gru_adam.py", ["--steps", str(gru_steps)], gru_steps, {
            "full": full,
            "stats": ["--level", "stats"],
        }),
    }


def run(cmd, env):
    proc, wall, cpu = run_timed(cmd, env)
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    loop = re.search(r"loop_cpu_s=([0-9.]+)", proc.stderr)
    loop_wall = re.search(r"loop_wall_s=([0-9.]+)", proc.stderr)
    script_end = re.search(r"script_end_unix=([0-9.]+)", proc.stderr)
    return {"wall": wall, "cpu": cpu, "loop": float(loop.group(1)),
            "loop_wall": float(loop_wall.group(1)) if loop_wall else None,
            # seconds from the script's last line to the process's end: a recording's last
            # flush and its fsync, the trace's close, and the interpreter's exit
            "tail": ended - float(script_end.group(1)) if script_end else None,
            "stdout": proc.stdout, "stderr": proc.stderr}


def dd_seconds(folder, nbytes):
    """Seconds `dd ... conv=fsync oflag=nocache` takes to write `nbytes` (whole MiB) into
    `folder`."""
    count = max(1, nbytes >> 20)
    path = os.path.join(folder, "dd.bin")
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}", "conv=fsync",
                    "oflag=nocache"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - start
    os.unlink(path)
    return seconds, count << 20


def measure(name, spec, repeat, folder, env):
    script, args, steps, levels = spec
    script = os.path.join(FIX, script)
    runs = {}
    for _ in range(repeat):
        plain = run([sys.executable, script, *args, "--time"], env)
        runs.setdefault("plain", []).append(plain)
        for label, opts in levels.items():
            out = os.path.join(folder, f"{name}.h5")
            res = run([sys.executable, "-m", "tracediff", "record", "-o", out, *opts, script,
                       *args, "--time"], env)
            assert res["stdout"] == plain["stdout"], f"{name} {label}: output changed"
            res["bytes"] = os.path.getsize(out)
            per_step = re.search(r"values: ([0-9.]+ [KMG]?B) a step", res["stderr"])
            res["per_step"] = per_step.group(1) if per_step else ""
            os.unlink(out)
            if "full" in label:
                loop_share = (steps - 1) / steps if res["loop_wall"] is not None else 1.0
                res["dd"], res["dd_bytes"] = dd_seconds(folder, int(res["bytes"] * loop_share))
            runs.setdefault(label, []).append(res)
    return runs


def best(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return min(vals) if vals else None


def report(name, steps, runs):
    plain_cpu, plain_wall = best(runs["plain"], "loop"), best(runs["plain"], "loop_wall")
    for label, rs in runs.items():
        cpu, wall = best(rs, "loop"), best(rs, "loop_wall")
        row = (f"| {name} | {label} | {steps} | {cpu:.2f} | {cpu / plain_cpu:.1f}x | "
               f"{'-' if wall is None else f'{wall:.2f}'} | ")
        size = max(r.get("bytes", 0) for r in rs)
        row += f"{size / 1e6:.1f} | {rs[0].get('per_step', '') or '-'} | "
        if "dd" in rs[0]:
            # each run against the dd beside it (the disk's speed drifts between minutes)
            ratios = [(r["loop_wall"] - plain_wall) / r["dd"] for r in rs
                      if r["loop_wall"] is not None]
            speed = max(r["dd_bytes"] / r["dd"] for r in rs) / 1e6
            row += (f"{min(r['dd'] for r in rs):.2f} | {speed:.0f} | "
                    f"{'-' if not ratios else ' / '.join(f'{x:.2f}' for x in ratios)} |")
        else:
            row += "| | |"
        print(row, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--jax-steps", type=int, default=30)
    parser.add_argument("--gru-steps", type=int, default=100)
    parser.add_argument("--only", default="jax_mlp,torch_gru")
    parser.add_argument("--codec", default="none", choices=["none", "zstd"],
                        help="record the full rows with this codec")
    parser.add_argument("--folder", default=None,
                        help="where traces and dd's file go (default: a new folder in /tmp)")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("XLA_FLAGS", None)
    specs = workloads(args.jax_steps, args.gru_steps, args.codec)
    print(f"load average at start: {os.getloadavg()}, OMP_NUM_THREADS=1, codec {args.codec}")
    print("| workload | level | steps | loop CPU s | ratio (CPU) | loop wall s | trace MB | "
          "values a step | dd s (loop's bytes) | disk MB/s | extra wall / dd |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    parent = args.folder or "/tmp"
    with tempfile.TemporaryDirectory(dir=parent) as folder:
        for name in args.only.split(","):
            spec = specs[name]
            report(name, spec[2], measure(name, spec, args.repeat, folder, env))
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
