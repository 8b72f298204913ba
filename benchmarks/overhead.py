"""Recording overhead, trace size and locate time, measured in one run, side by side.

For each workload: the plain script and `tracediff record` on it, interleaved, at two
step counts; the difference between step counts gives the steady-state cost per step
(without one-time compilation), the totals give what a user waits. CPU seconds (user+sys
of the child) are reported beside wall seconds because the machine may be shared.

    python benchmarks/overhead.py [--repeat 2] [--only jax_gru,torch_gru] [--markdown]
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures")

WORKLOADS = {
    # name: (script, args, (few steps, many steps))
    "jax_gru": ("jax_gru_expm_adam.py", [], (5, 100)),
    "jax_mlp": ("jax_mlp.py", ["--sizes", "256,1024,1024,256", "--batch", "64"], (2, 10)),
    "torch_gru": ("torch_gru_adam.py", [], (10, 100)),
    "torch_mlp": ("torch_mlp.py", ["--sizes", "1024,4096,4096,1024", "--batch", "64"], (2, 20)),
}


def timed(cmd, env=None):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def trace_stats(path):
    import tracediff

    t = tracediff.load(path)
    return len(t), os.path.getsize(path)


def measure(name, repeat, folder):
    script, args, (few, many) = WORKLOADS[name]
    script = os.path.join(FIX, script)
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    rows = {}
    for steps in (few, many):
        plain, rec = [], []
        for r in range(repeat):
            out = os.path.join(folder, f"{name}_{steps}_{r}.h5")
            p = timed([sys.executable, script, *args, "--steps", str(steps)], env)
            q = timed([sys.executable, "-m", "tracediff", "record", "-o", out, script, *args,
                       "--steps", str(steps)], env)
            assert p[2] == q[2], f"{name}: recording changed the script's output"
            plain.append(p[:2])
            rec.append(q[:2])
        events, size = trace_stats(out)
        locate_start = time.perf_counter()
        other = os.path.join(folder, f"{name}_{steps}_0.h5")
        subprocess.run([sys.executable, "-m", "tracediff", "locate", other, out, "--json"],
                       env=env, capture_output=True)
        locate_s = time.perf_counter() - locate_start
        rows[steps] = {"plain": min(plain), "rec": min(rec), "events": events, "bytes": size,
                       "locate_s": locate_s}
    return rows


def report(name, rows, markdown):
    (few, a), (many, b) = sorted(rows.items())
    lines = []
    for steps, r in ((few, a), (many, b)):
        lines.append((f"{name} {steps} steps", r["plain"][0], r["rec"][0], r["rec"][0] / r["plain"][0],
                      r["plain"][1], r["rec"][1], r["rec"][1] / r["plain"][1], r["events"],
                      r["bytes"] / 1e6, r["locate_s"]))
    d_plain = (b["plain"][1] - a["plain"][1]) / (many - few)
    d_rec = (b["rec"][1] - a["rec"][1]) / (many - few)
    steady = (f"{name} steady state: {d_plain * 1e3:.2f} ms/step plain, {d_rec * 1e3:.2f} ms/step "
              f"recorded (CPU), ratio {d_rec / d_plain if d_plain > 0 else float('nan'):.1f}x")
    if markdown:
        out = []
        for ln in lines:
            out.append("| {} | {:.1f} | {:.1f} | {:.1f}x | {:.1f} | {:.1f} | {:.1f}x | {:,} | {:.1f} | {:.1f} |".format(*ln))
        return "\n".join(out) + "\n\n" + steady
    return "\n".join("{:<22} wall {:.1f}s -> {:.1f}s ({:.1f}x)  cpu {:.1f}s -> {:.1f}s ({:.1f}x)  "
                     "{:,} events  {:.1f} MB  locate {:.1f}s".format(*ln) for ln in lines) + "\n" + steady


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.markdown:
        print("| workload | plain wall s | recorded wall s | ratio | plain CPU s | recorded CPU s | "
              "ratio | events | trace MB | locate s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.only.split(","):
            print(report(name, measure(name, args.repeat, folder), args.markdown), flush=True)


if __name__ == "__main__":
    main()
