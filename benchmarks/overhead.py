"""Recording overhead per level (plain / calls / stats / full), trace size, in one run.

Workloads (fixtures/):
  torch_gru  GRUCell + Linear + Adam, tiny ops, 100 steps; the loop's own CPU seconds
             (`--time`) are compared, so interpreter start-up and imports do not count.
  torch_mlp  MLP 1024-4096-4096-1024, batch 64, 20 steps. Full values are ~1.8 GB per
             step, so the full level runs with a window (`--steps 0:1`: one step at full,
             the other 19 unrecorded) and its size is reported per recorded step.
  jax_gru    the GRU + expm + Adam example; JAX has no loop timer, so each level runs at
             two step counts and the *difference* gives the steady-state CPU per step
             (without one-time compilation); the per-equation replay cost is derived
             from it and the number of replayed equations per step.
  jax_mlp    an MLP 256-1024-1024-256, batch 64, 100 steps; the loop's own CPU seconds
             after the first (compiling) step; full level through a one-step window.
  jax_mlp_values  the same MLP, 30 steps, stats and full on every step, equation values
             replayed op by op (default) or from the compiled values program
             (`--jax-values compiled`).

Every configuration runs `--repeat` times, interleaved with the others (the machine may be
shared); the minimum is kept. CPU seconds are user+sys of the child. The script checks
that every recording printed exactly what the plain run printed.

    python benchmarks/overhead.py [--repeat 2] [--only torch_gru,jax_gru] [--threads 1]
"""

import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from child import run_timed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures")

MLP_T = ["--sizes", "1024,4096,4096,1024", "--batch", "64"]
WORKLOADS = {
    # name: (script, args, step counts, levels {label: record options}, loop timer?)
    "torch_gru": ("torch_gru_adam.py", [], (100,),
                  {"calls": ["--level", "calls"], "stats": ["--level", "stats"],
                   "full": ["--level", "full"]}, True),
    # where the per-op cost goes: the dispatch mode and the event, dataflow and metadata
    # bookkeeping alone (`--ops '^$'`: no op's values kept, every op still an event with
    # its inputs, shapes and dtypes), then the values (stats: hash + statistics; full:
    # hash + bytes); benchmarks/dispatch_floor.py gives the bare dispatch mode's share
    "torch_gru_ladder": ("torch_gru_adam.py", [], (100,),
                         {"events, no values": ["--ops", "^$"], "stats": ["--level", "stats"],
                          "full": ["--level", "full"]}, True),
    "torch_mlp": ("torch_mlp.py", MLP_T, (20,),
                  {"calls": ["--level", "calls"], "stats": ["--level", "stats"],
                   "full --steps 0:1": ["--level", "full", "--steps", "0:1"]}, True),
    "jax_gru": ("jax_gru_expm_adam.py", [], (5, 40),
                {"calls": ["--level", "calls"], "stats": ["--level", "stats"],
                 "full": ["--level", "full"]}, False),
    # the MLP fixture has a loop timer (`--time`: steps 2..N, after the first step
    # compiled); full values are ~220 MB per step, so full runs through a one-step window
    "jax_mlp": ("jax_mlp.py", ["--sizes", "256,1024,1024,256", "--batch", "64"], (100,),
                {"calls": ["--level", "calls"], "stats": ["--level", "stats"],
                 "full --steps 1:2": ["--level", "full", "--steps", "1:2"]}, True),
    # the same MLP, every step at stats and at full, with each way of getting the values
    # of the equations inside a jit call: replayed op by op (the default) or compiled once
    # with every intermediate as an output (`--jax-values compiled`); ~220 MB a step at full
    "jax_mlp_values": ("jax_mlp.py", ["--sizes", "256,1024,1024,256", "--batch", "64"], (30,),
                       {"stats": ["--level", "stats"],
                        "stats --jax-values compiled": ["--level", "stats", "--jax-values", "compiled"],
                        "full": ["--level", "full"],
                        "full --jax-values compiled": ["--level", "full", "--jax-values", "compiled"]},
                       True),
}


def timed(cmd, env):
    proc, wall, cpu = run_timed(cmd, env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    m = re.search(r"loop_cpu_s=([0-9.]+)", proc.stderr)
    return {"wall": wall, "cpu": cpu, "loop": float(m.group(1)) if m else None,
            "stdout": proc.stdout}


def trace_info(path):
    import tracediff

    with tracediff.load(path) as t:
        jax_m = (t.manifest.get("frameworks") or {}).get("jax") or {}
        return {"events": len(t), "bytes": os.path.getsize(path),
                "equations": jax_m.get("equations", 0)}


def measure(name, repeat, folder, env):
    script, args, step_counts, levels, has_loop = WORKLOADS[name]
    script = os.path.join(FIX, script)
    results = {}
    for steps in step_counts:
        extra = ["--steps", str(steps)] + (["--time"] if has_loop else [])
        for r in range(repeat):
            plain = timed([sys.executable, script, *args, *extra], env)
            results.setdefault((steps, "plain"), []).append(plain)
            for label, opts in levels.items():
                out = os.path.join(folder, f"{name}_{steps}_{label.replace(' ', '_')}.h5")
                res = timed([sys.executable, "-m", "tracediff", "record", "-o", out, *opts,
                             script, *args, *extra], env)
                assert res["stdout"] == plain["stdout"], f"{name} {label}: output changed"
                res.update(trace_info(out))
                os.unlink(out)
                results.setdefault((steps, label), []).append(res)
    best = {}
    for key, runs in results.items():
        b = min(runs, key=lambda x: x["cpu"])
        b["loop"] = min((x["loop"] for x in runs if x["loop"] is not None), default=None)
        b["wall"] = min(x["wall"] for x in runs)
        best[key] = b
    return best, step_counts, levels, has_loop


def table(name, best, step_counts, levels, has_loop):
    rows = []
    labels = ["plain", *levels]
    if has_loop:
        steps = step_counts[-1]
        base = best[(steps, "plain")]
        for label in labels:
            r = best[(steps, label)]
            rows.append(f"| {name} | {label} | {steps} | {r['wall']:.1f} | {r['cpu']:.1f} | "
                        f"{r['loop']:.2f} | {r['loop'] / base['loop']:.1f}x | "
                        f"{r.get('events', 0):,} | {r.get('bytes', 0) / 1e6:.1f} |")
        return rows
    # JAX: process CPU at the larger step count (one-time compilation included) is the
    # ratio; the per-step difference between the two step counts is shown when it is
    # above the noise (a compiled step of these models takes well under a millisecond).
    few, many = step_counts
    base_cpu = best[(many, "plain")]["cpu"]
    calls = best.get((many, "calls"))
    for label in labels:
        a, b = best[(few, label)], best[(many, label)]
        per = (b["cpu"] - a["cpu"]) / (many - few)
        steady = f"{per * 1e3:.1f} ms/step" if per > 0 else "below noise"
        per_eqn = ""
        if b.get("equations") and calls is not None and label != "calls":
            per_eqn = (f"{(b['cpu'] - calls['cpu']) / b['equations'] * 1e6:.0f} us/eqn "
                       f"({b['equations']:,} eqns, compile included)")
        rows.append(f"| {name} | {label} | {many} | {b['wall']:.1f} | {b['cpu']:.1f} | "
                    f"{steady} | {b['cpu'] / base_cpu:.2f}x (process CPU) | "
                    f"{b.get('events', 0):,} | {b.get('bytes', 0) / 1e6:.1f} | {per_eqn} |")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--threads", default="1",
                        help="OMP_NUM_THREADS for every run ('' = library default)")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    if args.threads:
        env["OMP_NUM_THREADS"] = args.threads
    print(f"load average at start: {os.getloadavg()}, OMP_NUM_THREADS={args.threads or 'default'}")
    print("| workload | level | steps | wall s | CPU s | loop CPU s (torch) / steady CPU per step "
          "(JAX) | ratio | events | trace MB | replay cost |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        for name in args.only.split(","):
            for row in table(name, *measure(name, args.repeat, folder, env)):
                print(row, flush=True)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
