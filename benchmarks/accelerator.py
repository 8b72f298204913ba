"""JAX recording on whatever backend JAX has here (TPU, GPU or CPU): plain vs each level.

Rows (the fixture's own loop timer, wall seconds of steps 2..N, after the compiling one;
the minimum of `--repeat` runs): fixtures/jax_mlp.py with its defaults, and the 4096-wide
MLP of issue 37 (`--sizes 4096,4096,4096,4096,4096 --batch 1024`, Adam), plain and at
each level with tracediff's defaults for the backend (`--jax-values auto`, `--hash auto`),
the trace's bytes and its values a step, and beside the full rows the disk's speed (dd
with conv=fsync oflag=nocache, benchmarks/issue30.py) and the ratio issue 37 asks about:
the recording's loop time beyond plain over dd's time for the bytes written in the loop,
and "with the tail": the same plus the time from the script's last line to the process's
end beyond plain's (the last flush, which writes the bytes still buffered when the loop
ended, its fsync and the trace's close).
It also prints the backend, the device kind and the device-to-host copy speed of one
256 MB float32 array (a separate process: one program at a time may hold a TPU).

    python benchmarks/accelerator.py [--only defaults,wide] [--levels calls,stats,full]
                                     [--steps 30] [--wide-steps 30] [--repeat 1]
                                     [--extra "--jax-values replay"]

Only the recorded runs' printed results are checked against the plain run's (the script's
results must not change); a level whose trace would not fit the folder's free space is
skipped with a line saying so.
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from issue30 import dd_seconds, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP = os.path.join(ROOT, "fixtures", "jax_mlp.py")
WIDE = ["--sizes", "4096,4096,4096,4096,4096", "--batch", "1024"]

PROBE = r"""
import time, jax, jax.numpy as jnp
x = jnp.ones((64 << 20,), jnp.float32); jax.device_get(x)   # warm the transfer path
y = x + 1; y.block_until_ready()   # a fresh array: a second device_get of x is a host cache
t = time.perf_counter(); jax.device_get(y); dt = time.perf_counter() - t
d = jax.devices()[0]
print(f"backend={jax.default_backend()} kind={d.device_kind} d2h_GBps={x.nbytes / dt / 1e9:.2f}")
"""


def backend(env):
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()[-300:]


def measure(label, args, steps, levels, extra, repeat, folder, env):
    rows = {}
    for _ in range(repeat):
        plain = run([sys.executable, MLP, *args, "--steps", str(steps), "--time"], env)
        rows.setdefault("plain", []).append(plain)
        for level in levels:
            out = os.path.join(folder, f"{label}.h5")
            free = shutil.disk_usage(folder).free
            res = run([sys.executable, "-m", "tracediff", "record", "-o", out, "--level", level,
                       *extra, MLP, *args, "--steps", str(steps), "--time"], env)
            assert res["stdout"] == plain["stdout"], f"{label} {level}: output changed"
            res["bytes"] = os.path.getsize(out)
            m = re.search(r"values: ([0-9.]+ [KMG]?B) a step", res["stderr"])
            res["per_step"] = m.group(1) if m else "-"
            os.unlink(out)
            if level == "full":
                loop_bytes = int(res["bytes"] * (steps - 1) / steps)
                if loop_bytes < free:
                    res["dd"], res["dd_bytes"] = dd_seconds(folder, loop_bytes)
            rows.setdefault(level, []).append(res)
    return rows


def report(label, steps, rows):
    plain = min(r["loop_wall"] for r in rows["plain"])
    print(f"| {label} | plain | {steps} | {plain * 1e3 / (steps - 1):.2f} ms | 1x | | | | |")
    for level, rs in rows.items():
        if level == "plain":
            continue
        wall = min(r["loop_wall"] for r in rs)
        line = (f"| {label} | {level} | {steps} | {wall * 1e3 / (steps - 1):.2f} ms | "
                f"{wall / plain:.1f}x | {max(r['bytes'] for r in rs) / 1e6:.1f} MB | "
                f"{rs[0]['per_step']} | ")
        if rs[0].get("dd"):
            r = min(rs, key=lambda r: r["loop_wall"])
            line += (f"dd {r['dd']:.2f} s ({r['dd_bytes'] / r['dd'] / 1e6:.0f} MB/s) | "
                     f"extra/dd {(r['loop_wall'] - plain) / r['dd']:.2f}")
            p = min(rows["plain"], key=lambda p: p["loop_wall"])
            if r.get("tail") is not None and p.get("tail") is not None:
                # the bytes left to flush when the loop ends are written after the
                # script's last line: the time from there to the process's end beyond
                # plain's counts them (with the trace's close)
                extra = r["loop_wall"] + r["tail"] - plain - p["tail"]
                line += f"; with the tail {extra / r['dd']:.2f}"
            line += " |"
        else:
            line += "| |"
        print(line, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="defaults,wide")
    parser.add_argument("--levels", default="calls,stats,full")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--wide-steps", type=int, default=30)  # 6 timed a one-off cost
    parser.add_argument("--wide-full-steps", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--extra", default="", help="more `tracediff record` options")
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    if min(args.steps, args.wide_steps, args.wide_full_steps) < 2:
        parser.error("every --*steps must be at least 2: the loop timer starts after the "
                     "compiling step")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    print(backend(env), flush=True)
    levels = args.levels.split(",")
    extra = shlex.split(args.extra)
    print("| program | run | steps | loop a step | vs plain | trace | values a step | disk | |")
    print("|---|---|---|---|---|---|---|---|---|")
    if args.folder:
        os.makedirs(args.folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        for name in args.only.split(","):
            if name == "defaults":
                report("jax_mlp defaults", args.steps,
                       measure(name, [], args.steps, levels, extra, args.repeat, folder, env))
            elif name == "wide":
                cheap = [lv for lv in levels if lv != "full"]
                if cheap:
                    report("jax_mlp 4096x4, batch 1024", args.wide_steps,
                           measure(name, WIDE, args.wide_steps, cheap, extra, args.repeat,
                                   folder, env))
                if "full" in levels:
                    report("jax_mlp 4096x4, batch 1024", args.wide_full_steps,
                           measure(name, WIDE, args.wide_full_steps, ["full"], extra,
                                   args.repeat, folder, env))


if __name__ == "__main__":
    main()
