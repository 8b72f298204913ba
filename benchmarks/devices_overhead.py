"""Recording cost of JAX per-device capture (issue 13): fixtures/jax_sharded_dp.py and
fixtures/jax_shard_map_pmean.py on 8 simulated CPU devices, recorded with and without
`--devices`, one run each after a warm-up, in one session; prints the recording's CPU
seconds (user + system of the child: stable on a shared machine, where wall time is
not), wall seconds, trace bytes and the ratios.

Usage: PYTHONPATH=. python benchmarks/devices_overhead.py [--steps 4]
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record(script, out, devices, steps):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=ROOT)
    t0 = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", out,
                    "--devices" if devices else "--no-devices",
                    os.path.join(ROOT, "fixtures", script), "--steps", str(steps)],
                   env=env, check=True, capture_output=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return cpu, os.path.getsize(out), time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for script in ("jax_sharded_dp.py", "jax_shard_map_pmean.py"):
            record(script, os.path.join(tmp, "warm.h5"), True, 1)
            off = record(script, os.path.join(tmp, "off.h5"), False, args.steps)
            on = record(script, os.path.join(tmp, "on.h5"), True, args.steps)
            print(f"{script} --steps {args.steps}: without {off[0]:.1f} s CPU ({off[2]:.1f} s wall) "
                  f"{off[1] / 1e3:.0f} KB, with per-device {on[0]:.1f} s CPU ({on[2]:.1f} s wall) "
                  f"{on[1] / 1e3:.0f} KB (x{on[0] / off[0]:.2f} CPU, x{on[1] / off[1]:.2f} bytes)")


if __name__ == "__main__":
    main()
