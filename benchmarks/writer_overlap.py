"""The trace writer's whole chunks of value bytes written in the program's thread or
behind it, by the thread that fsyncs the flush (`TRACEDIFF_WRITE_BEHIND=1`), the disk
started on them as they are written or at the fsync (`TRACEDIFF_EARLY_WRITEBACK`), on the
load of a JAX step recorded at `full` on an accelerator: each step a large buffer of
values held as it is (a device's joined values, `keep_joined`), a few hundred small
values copied, and host work that holds the GIL (the recorder's own Python),
`--compute-ms` a step. No accelerator is used: it measures the host's side alone.

Each mode runs in its own process (`--repeat` times, alternating), the step timed by
the loop itself after `--warmup` steps; beside them the same loop writing nothing, and
`dd ... conv=fsync oflag=nocache` of the bytes the timed steps wrote (as
benchmarks/issue30.py measures the disk). Prints ms a step and the extra over the loop
alone, in ms and over dd's time for those bytes: issue 37 asks for at most 1.5.

    python benchmarks/writer_overlap.py [--steps 40] [--mb 10] [--values 300]
                                        [--compute-ms 6] [--repeat 3] [--folder DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from issue30 import dd_seconds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(args):
    """One recording (or none, `--mode none`): prints JSON {ms_step, bytes}."""
    import numpy as np

    from tracediff.trace import writer as W

    rng = np.random.default_rng(0)
    held = [rng.integers(0, 256, args.mb << 20, dtype=np.uint8) for _ in range(4)]
    small = rng.standard_normal((args.values, 64)).astype(np.float32)
    w = None if MODES[args.mode][1] is None else W.TraceWriter(args.out, {"script": {"name": "x"}})
    times, written = [], 0
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        if w is not None:
            before = w.bytes_recorded
            e = w.add_event(framework=2, kind=3, op="step", source="loop.py:1")
            w.keep_joined(held[step % len(held)])
            for i in range(args.values):
                w.add_value(e, i + 1, small[i])
            if step >= args.warmup:
                written += w.bytes_recorded - before
        end = start + args.compute_ms / 1e3
        while time.perf_counter() < end:   # the recorder's Python: holds the GIL
            pass
        times.append(time.perf_counter() - start)
    t0 = time.perf_counter()
    if w is not None:
        w.close()
    close_s = time.perf_counter() - t0
    print(json.dumps({"ms_step": 1e3 * statistics.fmean(times[args.warmup:]),
                      "bytes": written, "close_s": close_s}))


# mode: its label and the writer's settings (None: no trace)
MODES = {
    "none": ("(no trace)", None),
    "inline": ("in the program's thread", {"TRACEDIFF_WRITE_BEHIND": "0"}),
    "behind": ("behind it", {"TRACEDIFF_WRITE_BEHIND": "1"}),
    "inline_late": ("in the program's thread, disk started at the fsync",
                    {"TRACEDIFF_WRITE_BEHIND": "0", "TRACEDIFF_EARLY_WRITEBACK": "0"}),
    "behind_late": ("behind it, disk started at the fsync",
                    {"TRACEDIFF_WRITE_BEHIND": "1", "TRACEDIFF_EARLY_WRITEBACK": "0"}),
}


def run(mode, args, folder):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    env.update(MODES[mode][1] or {})
    out = os.path.join(folder, f"{mode}.h5")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode,
           "--out", out, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--mb", str(args.mb), "--values", str(args.values),
           "--compute-ms", str(args.compute_ms)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    if os.path.exists(out):
        os.remove(out)
    if MODES[mode][1] is not None:
        res["dd"], res["dd_bytes"] = dd_seconds(folder, res["bytes"])
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--mb", type=int, default=10, help="MiB held a step")
    parser.add_argument("--values", type=int, default=300, help="small values a step")
    parser.add_argument("--compute-ms", type=float, default=6.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="behind", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    folder = args.folder or tempfile.mkdtemp(prefix="writer_overlap_")
    os.makedirs(folder, exist_ok=True)
    runs = {mode: [] for mode in MODES}
    for _ in range(args.repeat):
        for mode in runs:
            runs[mode].append(run(mode, args, folder))
    base = statistics.median(r["ms_step"] for r in runs["none"])
    print(f"{args.mb} MiB held + {args.values} small values a step, host work "
          f"{args.compute_ms} ms a step, {args.steps} timed steps, {args.repeat} runs each, "
          f"median; cpus {os.cpu_count()}")
    print("| whole chunks written | ms a step | extra ms a step | dd MB/s | extra / dd | close s |")
    print("|---|---|---|---|---|---|")
    print(f"| (no trace) | {base:.2f} | | | | |")
    for mode, (label, _) in list(MODES.items())[1:]:
        rs = runs[mode]
        ms = statistics.median(r["ms_step"] for r in rs)
        # each run against the dd beside it (the disk's speed drifts between minutes)
        ratio = statistics.median((r["ms_step"] - base) * args.steps / 1e3 / r["dd"] for r in rs)
        speed = statistics.median(r["dd_bytes"] / r["dd"] for r in rs) / 1e6
        close = statistics.median(r["close_s"] for r in rs)
        print(f"| {label} | {ms:.2f} | {ms - base:.2f} | {speed:.0f} | {ratio:.2f} | "
              f"{close:.2f} |")


if __name__ == "__main__":
    main()
