"""The cost of one recorded jit call at `--level calls`, split: a trivial jitted function
(`--arrays` arrays in, as many out, ~no compute) called N times, timed by its own loop
(wall microseconds a call):

    plain               JAX's C++ fast path
    python path         the same calls made through JAX's Python dispatch path, as every
                        call the hook records is (the fast path turned off, nothing
                        recorded)
    calls, hook (host)  `tracediff record --level calls` with every call through the hook
                        (TRACEDIFF_JAX_FAST_JIT=0), values hashed on the host
    calls (host)        the same on the fast path (capture/jax/fastjit.py, the default)
    calls, hook (device), calls (device)
                        the same two, hashed and summarised on the device (the
                        accelerator default; TRACEDIFF_JAX_DIGEST_ON_DEVICE=1 on a CPU)

Beyond `plain`, the `calls` rows are tracediff's own work a call (its rows, the digest
program's dispatch) and, through the hook, JAX's Python path. On an accelerator the step
of a small model is a few of these calls plus its device time: docs/accelerators.md.

    python benchmarks/jax_call_floor.py [--calls 3000] [--arrays 2] [--repeat 3]
"""

import argparse
import os
import statistics
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from issue30 import run  # noqa: E402

SCRIPT = textwrap.dedent("""
    import sys, time, jax, jax.numpy as jnp
    if "--python-path" in sys.argv:   # what tracediff's interception costs JAX itself
        from jax._src import pjit
        pjit._get_fastpath_data = lambda *a, **k: None

    @jax.jit
    def f(xs):
        return [x * 1.0001 + 1.0 for x in xs]

    xs = [jnp.ones((8,)) for _ in range(int(sys.argv[2]))]
    for _ in range(3):
        xs = f(xs)
    jax.block_until_ready(xs)
    n = int(sys.argv[1])
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        xs = f(xs)
    jax.block_until_ready(xs)
    print(f"loop_cpu_s={time.process_time() - c:.4f} loop_wall_s={time.perf_counter() - t:.4f}",
          file=sys.stderr)
""")


def per_call(cmd, env, calls):
    """Microseconds a call: the script's loop wall time over its calls."""
    return run(cmd, env)["loop_wall"] / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--arrays", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "tiny_jit.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        trace = os.path.join(tmp, "t.h5")
        own = [script, str(args.calls), str(args.arrays)]
        record = [sys.executable, "-m", "tracediff", "record", "-o", trace, "--level",
                  "calls", *own]
        hook, fast = {"TRACEDIFF_JAX_FAST_JIT": "0"}, {"TRACEDIFF_JAX_FAST_JIT": "1"}
        host, device = {"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "0"}, \
            {"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "1"}
        rows = [("plain", [sys.executable, *own], {}),
                ("python path", [sys.executable, *own, "--python-path"], {}),
                ("calls, hook (host)", record, {**hook, **host}),
                ("calls (host)", record, {**fast, **host}),
                ("calls, hook (device)", record, {**hook, **device}),
                ("calls (device)", record, {**fast, **device})]
        times = {name: [] for name, _, _ in rows}
        for _ in range(args.repeat):       # interleaved: the machine may be shared
            for name, cmd, extra in rows:
                times[name].append(per_call(cmd, {**os.environ, **extra}, args.calls))
    import jax

    print(f"backend={jax.default_backend()} calls={args.calls} arrays={args.arrays} "
          f"repeat={args.repeat} (median)")
    print("| run | per call | vs plain |")
    print("|---|---|---|")
    plain = statistics.median(times["plain"])
    for name, _, _ in rows:
        t = statistics.median(times[name])
        print(f"| {name} | {t:.1f} us | {t / plain:.1f}x |")


if __name__ == "__main__":
    main()
