"""Cross-framework pairing cost: a Flax MLP + optax.adam and its torch port trained in
one process (fixtures/port_mlp_adam.py), recorded for N steps, then located as one trace
(JAX side against torch side).

Reported per N: events in the trace, computing units per side, pairs, the time to build
the cross-framework differ (units, atoms, supports, classes, pairs) and the whole locate
without the replay verdict (one process, CPU seconds included).

    python benchmarks/port_pairing.py [--steps 2 30 120] [--keep DIR]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, nargs="+", default=[2, 30, 120])
    ap.add_argument("--keep", default=None, help="folder for the traces (kept)")
    args = ap.parse_args()
    import tracediff
    from tracediff.diff.locate import open_differ

    folder = args.keep or tempfile.mkdtemp()
    os.makedirs(folder, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT)
    print("steps  events  units a  units b  pairs  differ s  differ CPU s  locate s")
    for n in args.steps:
        path = os.path.join(folder, f"mlp{n}.h5")
        if not os.path.exists(path):
            subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", path,
                            os.path.join(ROOT, "fixtures", "port_mlp_adam.py"), "--steps", str(n)],
                           env=env, check=True, capture_output=True)
        with tracediff.load(path) as t:
            w, c = time.perf_counter(), time.process_time()
            d, _ = open_differ(t, t)
            dw, dc = time.perf_counter() - w, time.process_time() - c
            units = (len(d.ga.units), len(d.gb.units), len(d.p.pairs))
            w = time.perf_counter()
            tracediff.locate(t, explain=False)
            lw = time.perf_counter() - w
        print(f"{n:5d}  {len(t):6d}  {units[0]:7d}  {units[1]:7d}  {units[2]:5d}  {dw:8.2f}  "
              f"{dc:12.2f}  {lw:8.2f}")


if __name__ == "__main__":
    main()
