"""What finding every source costs (issue 51: at most 2x what `locate` takes without it).

Records fixtures/jax_mlp.py (30 steps, full level) plainly and with XLA's CPU code limited to
SSE4.2, and the GPT of fixtures/torch_gpt_adamw.py with ATEN_CPU_CAPABILITY=default against
unset; then times, in one process and alternating, `tracediff.locate(a, b)` with its replay
verdict and chain but no sources, and the same with every source of the difference:

    python benchmarks/sources_cost.py [--repeat 3] [--keep DIR]

Prints the median seconds of each and their ratio, and the sources found.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
    "jax_mlp 30 steps, SSE4.2": ("jax_mlp.py", ("--steps", "30"),
                                 {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"}),
    "torch GPT 3 AdamW steps, ATEN_CPU_CAPABILITY": ("torch_gpt_adamw.py", (),
                                                     {"ATEN_CPU_CAPABILITY": "default"}),
}


def record(script, args, env, out):
    full_env = {**os.environ, **(env or {})}
    subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", out,
                    os.path.join(ROOT, "fixtures", script), *args], env=full_env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", help="folder for the traces (reused when they exist)")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    import tracediff

    folder = args.keep or tempfile.mkdtemp()
    os.makedirs(folder, exist_ok=True)
    for name, (script, sargs, env) in CASES.items():
        a = os.path.join(folder, script.replace(".py", ".a.h5"))
        b = os.path.join(folder, script.replace(".py", ".b.h5"))
        if not os.path.exists(a):
            record(script, sargs, None, a)
        if not os.path.exists(b):
            record(script, sargs, env, b)
        tracediff.locate(a, b)   # warm: imports, JAX's compiled replays of this process
        without, with_ = [], []
        result = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            tracediff.locate(a, b, sources=False)
            without.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            result = tracediff.locate(a, b)
            with_.append(time.perf_counter() - t0)
        w, s = statistics.median(without), statistics.median(with_)
        src = result.sources
        print(f"{name}: locate {w:.2f} s, with sources {s:.2f} s, ratio {s / w:.2f}; "
              f"{src.examined} differing ops examined, {src.replayed} op runs replayed")
        for x in src.sources:
            print(f"    {x.rank}. {x.share:6.1%} {x.mechanism} {x.side}: "
                  f"{', '.join(op for op, _ in x.ops[:3])}")


if __name__ == "__main__":
    main()
