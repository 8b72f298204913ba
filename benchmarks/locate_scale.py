"""`tracediff locate` at scale: a generated pair of traces with >= 1M events and several GB.

The pair is written through the real `TraceWriter` into a temporary folder (deleted after):
N torch-like op events, each with one float32 output of E elements and a dataflow edge
from the previous event. Trace b equals a up to event D1; from D1 on one element of every
value is one ULP off (bitwise different, within tolerance: locate must read and compare
them all); from D2 on the values are 1% off (beyond tolerance). locate must name D1 as the
first bitwise difference and D2 as the first beyond tolerance.

Reported: generation time, trace sizes, locate wall and CPU seconds, MB/s over the two
files and over the value bytes it actually compared, and its peak RSS (the locate runs in
a child process: `ru_maxrss` of the children).

    python benchmarks/locate_scale.py [--events 1050000] [--elements 768] [--keep DIR [--reuse]]
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tracediff.trace import schema  # noqa: E402
from tracediff.trace.writer import TraceWriter  # noqa: E402

OPS = ["aten::addmm", "aten::relu", "aten::mul.Tensor", "aten::add.Tensor", "aten::tanh"]


def generate(path, n, elements, d1, d2, perturbed):
    rng = np.random.default_rng(0)
    pool = [rng.standard_normal(elements).astype(np.float32) for _ in range(61)]
    w = TraceWriter(path, {"tracediff_version": "bench", "recording": {"level": "full",
                                                                        "hash": "xxh3_64"},
                           "script": {"name": "generated.py"}})
    one_ulp = np.float32(np.finfo(np.float32).eps)
    for i in range(n):
        eid = w.add_event(framework=schema.FW_TORCH, kind=schema.KIND_OP, op=OPS[i % len(OPS)],
                          origin=schema.ORIGIN_EAGER, name_stack=f"layer{(i // 50) % 24}",
                          source="generated.py:1", step=i // 10_000)
        if i:
            w.add_input(eid, 0, eid - 1, 0)
        v = pool[i % len(pool)] + np.float32(i % 1000)
        if perturbed and i >= d1:
            v = v.copy()
            v[i % elements] *= (1 + one_ulp)
            if i >= d2:
                v *= np.float32(1.01)
        w.add_value(eid, 0, v)
    w.close(end={"status": "completed", "exit_code": 0})


def run_locate(a, b):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "tracediff", "locate", a, b, "--json"],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr[-3000:])
    return wall, cpu, after.ru_maxrss / 1024, json.loads(proc.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_050_000)
    ap.add_argument("--elements", type=int, default=768)
    ap.add_argument("--keep", default=None, help="write the pair here and keep it")
    ap.add_argument("--reuse", action="store_true",
                    help="with --keep: use the pair already there (same --events/--elements)")
    args = ap.parse_args()
    n, e = args.events, args.elements
    d1, d2 = int(n * 0.66), int(n * 0.95)
    folder = args.keep or tempfile.mkdtemp(prefix="tracediff-locate-scale-", dir="/tmp")
    os.makedirs(folder, exist_ok=True)
    a, b = os.path.join(folder, "a.h5"), os.path.join(folder, "b.h5")
    try:
        t0 = time.perf_counter()
        if not (args.reuse and os.path.isfile(a) and os.path.isfile(b)):
            for path, perturbed in ((a, False), (b, True)):
                generate(path, n, e, d1, d2, perturbed)
        gen = time.perf_counter() - t0
        size = os.path.getsize(a) + os.path.getsize(b)
        wall, cpu, rss, rep = run_locate(a, b)
        fd, ft = rep["first_difference"], rep["first_beyond_tolerance"]
        compared = (n - d1) * e * 4 * 2  # value bytes the tolerance pass must read
        out = {
            "events_per_trace": n, "elements_per_value": e, "trace_bytes_total": size,
            "generate_s": round(gen, 1), "locate_wall_s": round(wall, 2),
            "locate_cpu_s": round(cpu, 2), "peak_rss_mb": round(rss),
            "mb_per_s_files": round(size / 1e6 / wall), "mb_per_s_values_compared":
                round(compared / 1e6 / wall),
            "first_difference": fd and fd["a"]["index"], "expected_first_difference": d1,
            "first_beyond_tolerance": ft and ft["a"]["index"], "expected_beyond": d2,
        }
        print(json.dumps(out, indent=2))
        ok = out["first_difference"] == d1 and out["first_beyond_tolerance"] == d2
        print("correct" if ok else "WRONG ANSWER", file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
