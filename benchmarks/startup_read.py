"""What a short command costs before and after its real work: recording a small eager
torch script, opening a trace, reading its values one by one.

- `record`: `tracediff record` of a 20,000-op eager torch loop (no optimizer), in a fresh
  process each time, CPU seconds of the whole process and of the loop (the script's own
  timer); once as it is, once with the script importing torch._dynamo first: what every
  torch recording paid before the recorder stopped importing Dynamo at its first op (and
  what a training script pays anyway, at its first optimizer step).
- `open`: `Trace(path)` of the loop's trace and of a torch GRU trace, ms an open (all the checks a
  stranger's trace gets).
- `read`: `Trace.read_value` of every stored value of that trace, ms a value.

Each measurement is repeated (`--repeat`) and interleaved, and the median printed: this
machine's speed drifts by ±15 % from minute to minute.

    python benchmarks/startup_read.py [--repeat 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LOOP = """
import sys, time, torch
if {dynamo}:
    import torch._dynamo
x = torch.ones(8)
t = time.process_time()
for _ in range(20000):
    x = x * 1.0001
print(f"loop_cpu_s={{time.process_time() - t:.4f}}", file=sys.stderr)
"""


def _record(folder, dynamo):
    """(process CPU s, loop CPU s) of one `tracediff record` of the loop."""
    script = os.path.join(folder, f"loop_{int(dynamo)}.py")
    with open(script, "w") as fh:
        fh.write(LOOP.format(dynamo=dynamo))
    before = os.times()
    proc = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o",
                           os.path.join(folder, "loop.h5"), script], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    loop = float(proc.stderr.split("loop_cpu_s=")[1].split()[0])
    return cpu, loop


def _open_and_read(path, repeat_opens=50):
    from tracediff.trace.reader import Trace

    t0 = time.process_time()
    for _ in range(repeat_opens):
        Trace(path).close()
    open_ms = (time.process_time() - t0) * 1000 / repeat_opens
    with Trace(path) as t:
        rows = list(t.values)
        t0 = time.process_time()
        n = sum(1 for row in rows if t.read_value(row) is not None)
        read_ms = (time.process_time() - t0) * 1000 / max(n, 1)
    return open_ms, read_ms, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rec = {False: [], True: []}
        for _ in range(args.repeat):
            for dynamo in (False, True):
                rec[dynamo].append(_record(folder, dynamo))
        for dynamo, rows in rec.items():
            cpu = statistics.median(r[0] for r in rows)
            loop = statistics.median(r[1] for r in rows)
            label = "script imports Dynamo" if dynamo else "eager, no Dynamo"
            print(f"record 20,000 ops ({label}): {cpu:.2f} CPU-s in all, loop {loop:.2f} s")
        traces = {"20,000-op loop": os.path.join(folder, "loop.h5")}
        gru = os.path.join(folder, "gru.h5")
        subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", gru,
                        os.path.join(ROOT, "fixtures", "torch_gru_adam.py"), "--steps", "2"],
                       cwd=ROOT, capture_output=True, check=True)
        traces["torch GRU"] = gru
        for name, path in traces.items():
            runs = [_open_and_read(path) for _ in range(args.repeat)]
            print(f"{name} trace: open {statistics.median(r[0] for r in runs):.1f} ms, "
                  f"read_value {statistics.median(r[1] for r in runs):.3f} ms a value "
                  f"({runs[0][2]} values)")


if __name__ == "__main__":
    main()
