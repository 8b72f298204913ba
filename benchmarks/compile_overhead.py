"""The cost of recording a torch.compile run: compile time and steady-state steps.

Workload: fixtures/torch_compiled_gpt2.py, a tiny GPT-2 (2 layers, 32 wide, vocabulary
64, batch 2x16) trained with AdamW under torch.compile (inductor), N steps. The fixture
times its own steps (`--time`): the first step (Dynamo + AOT autograd + inductor:
the compile) and the mean of the later steps (steady state), wall and CPU.

Runs, interleaved `--repeat` times after one warm-up that fills the inductor cache
(kept in a temporary folder for the whole benchmark, as a user's cache would be):
plain, and `tracediff record` at --level calls, stats and full; and the same script
eagerly (no torch.compile), plain and recorded at --level full, for comparison. The script checks that
every recording printed exactly what the plain run printed. OMP_NUM_THREADS=1: with more
threads two unrecorded runs differ in the last bits (some of inductor's multi-threaded CPU
kernels are not deterministic), and nothing could be compared bitwise.

    python benchmarks/compile_overhead.py [--steps 12] [--repeat 2] [--layers 2]
"""

import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from child import run_timed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "fixtures", "torch_compiled_gpt2.py")
# label: (tracediff record options, or None for an unrecorded run; backend)
LEVELS = {"plain": (None, "inductor"), "calls": (["--level", "calls"], "inductor"),
          "stats": (["--level", "stats"], "inductor"), "full": (["--level", "full"], "inductor"),
          "eager": (None, "eager"), "eager full": (["--level", "full"], "eager")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tracediff-compile-bench-")
    # one thread: with two, three unrecorded runs printed three different parameter sums
    # (some of inductor's multi-threaded CPU kernels are not deterministic), and the
    # comparison below is bitwise
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    base = [SCRIPT, "--steps", str(args.steps), "--layers", str(args.layers), "--time"]

    def run(label):
        out = os.path.join(tmp, f"{label.replace(' ', '_')}.h5")
        options, backend = LEVELS[label]
        cmd = [sys.executable, *base, "--backend", backend] if options is None else \
            [sys.executable, "-m", "tracediff", "record", "-o", out, *options, *base,
             "--backend", backend]
        proc, wall, cpu = run_timed(cmd, env)
        if proc.returncode != 0:
            raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
        m = re.search(r"first_step_s=([0-9.]+) later_step_s=([0-9.]+) later_step_cpu_s=([0-9.]+)",
                      proc.stderr)
        size = os.path.getsize(out) / 1e6 if options is not None else None
        return {"stdout": proc.stdout, "first": float(m.group(1)), "later": float(m.group(2)),
                "later_cpu": float(m.group(3)), "wall": wall, "cpu": cpu, "mb": size}

    with open("/proc/loadavg") as fh:
        print("load average before:", fh.read().split()[:3])
    warm = run("plain")
    print(f"warm-up (cold inductor cache): compile (first step) {warm['first']:.1f} s")
    best = {}
    for _ in range(args.repeat):
        for label in LEVELS:
            r = run(label)
            if label.startswith("eager"):
                ref = best.get("eager", r)
                if r["stdout"] != ref["stdout"]:
                    raise SystemExit(f"{label}: printed {r['stdout']!r}, eager printed {ref['stdout']!r}")
            elif r["stdout"] != warm["stdout"]:
                raise SystemExit(f"{label}: printed {r['stdout']!r}, plain printed {warm['stdout']!r}")
            old = best.get(label)
            best[label] = r if old is None else {k: (min(v, old[k]) if isinstance(v, float) else v)
                                                 for k, v in r.items()}
    with open("/proc/loadavg") as fh:
        print("load average after:", fh.read().split()[:3])
    p = best["plain"]
    print(f"\n{args.steps} steps, minimum of {args.repeat}; every recording printed what the plain run printed")
    print("x: against the compiled plain run (eager rows: the eager run's own first step "
          "is not a compile)")
    print(f"{'run':10s} {'compile s':>10s} {'x':>6s} {'step ms':>9s} {'x':>6s} {'step CPU ms':>12s} "
          f"{'x':>6s} {'process s':>10s} {'trace MB':>9s}")
    for label, r in best.items():
        print(f"{label:10s} {r['first']:10.2f} {r['first'] / p['first']:6.2f} {r['later'] * 1e3:9.1f} "
              f"{r['later'] / p['later']:6.1f} {r['later_cpu'] * 1e3:12.1f} "
              f"{r['later_cpu'] / p['later_cpu']:6.1f} {r['wall']:10.1f} "
              f"{'' if r['mb'] is None else format(r['mb'], '9.1f')}")


if __name__ == "__main__":
    main()
