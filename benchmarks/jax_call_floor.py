"""The cost of one recorded jit call at `--level calls`, split: a trivial jitted function
(2 arrays in, 2 out, ~no compute) called N times, timed by its own loop (wall
microseconds a call):

    plain           JAX's C++ fast path
    python path     the same calls made through JAX's Python dispatch path, as every
                    intercepted call is (the fast path turned off, nothing recorded)
    calls (host)    `tracediff record --level calls`, values hashed on the host
    calls (device)  the same, hashed and summarised on the device (the accelerator
                    default; TRACEDIFF_JAX_DIGEST_ON_DEVICE=1 on a CPU)

The rows beyond `python path` are tracediff's own work a call (its rows, the digest
program's dispatch). On an accelerator the step of a small model is a few of these calls
plus its device time: docs/accelerators.md.

    python benchmarks/jax_call_floor.py [--calls 3000] [--repeat 3]
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
    def f(a, b):
        return a * b + 1.0, a - b

    a, b = jnp.ones((8,)), jnp.ones((8,))
    for _ in range(3):
        a, b = f(a, b)
    jax.block_until_ready(a)
    n = int(sys.argv[1])
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        a, b = f(a, b)
    jax.block_until_ready(a)
    print(f"loop_cpu_s={time.process_time() - c:.4f} loop_wall_s={time.perf_counter() - t:.4f}",
          file=sys.stderr)
""")


def per_call(cmd, env, calls):
    """Microseconds a call: the script's loop wall time over its calls."""
    return run(cmd, env)["loop_wall"] / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "tiny_jit.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        trace = os.path.join(tmp, "t.h5")
        record = [sys.executable, "-m", "tracediff", "record", "-o", trace, "--level",
                  "calls", script, str(args.calls)]
        rows = [("plain", [sys.executable, script, str(args.calls)], {}),
                ("python path", [sys.executable, script, str(args.calls), "--python-path"], {}),
                ("calls (host)", record, {"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "0"}),
                ("calls (device)", record, {"TRACEDIFF_JAX_DIGEST_ON_DEVICE": "1"})]
        times = {name: [] for name, _, _ in rows}
        for _ in range(args.repeat):       # interleaved: the machine may be shared
            for name, cmd, extra in rows:
                times[name].append(per_call(cmd, {**os.environ, **extra}, args.calls))
    import jax

    print(f"backend={jax.default_backend()} calls={args.calls} repeat={args.repeat} (median)")
    print("| run | per call | vs plain |")
    print("|---|---|---|")
    plain = statistics.median(times["plain"])
    for name, _, _ in rows:
        t = statistics.median(times[name])
        print(f"| {name} | {t:.1f} us | {t / plain:.1f}x |")


if __name__ == "__main__":
    main()
