"""How the values of `--jax-values compiled` differ from the faithful op-by-op replay.

Records fixtures/jax_mlp.py (default: 64-256-256-64, batch 32, 3 steps) at full level
twice, `--jax-values replay` and `--jax-values compiled`, pairs their equation events in
order (same ops, same source lines) and counts the values that are bitwise equal, and the
largest relative difference of the others; also prints the manifest's count of calls
whose compiled-values program returned the script's outputs bitwise.

    python benchmarks/jax_values.py [--steps 3] [--sizes 64,256,256,64]
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="3")
    ap.add_argument("--sizes", default="64,256,256,64")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    from tracediff.trace import schema
    from tracediff.trace.reader import Trace

    env = dict(os.environ, PYTHONPATH=ROOT)
    with tempfile.TemporaryDirectory() as d:
        paths = {}
        for mode in ("replay", "compiled"):
            paths[mode] = os.path.join(d, f"{mode}.h5")
            subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", paths[mode],
                            "--jax-values", mode, os.path.join(ROOT, "fixtures", "jax_mlp.py"),
                            "--sizes", args.sizes, "--steps", args.steps],
                           env=env, check=True, capture_output=True)
        with Trace(paths["replay"]) as rp, Trace(paths["compiled"]) as cp:
            def eqns(t, origin):
                ev = t.events
                return np.flatnonzero((ev["kind"] == schema.KIND_EQN) & (ev["origin"] == origin))

            ra, ca = eqns(rp, schema.ORIGIN_REPLAY), eqns(cp, schema.ORIGIN_PROBE)
            same = differ = 0
            worst = 0.0
            ops = {}
            for a, b in zip(ra, ca):
                for xa, xb in zip(rp.outputs(a), cp.outputs(b)):
                    if xa is None or xb is None:
                        continue
                    if xa.tobytes() == xb.tobytes():
                        same += 1
                        continue
                    differ += 1
                    op = rp.event(a)["op"]
                    ops[op] = ops.get(op, 0) + 1
                    if xa.dtype.kind == "f":
                        with np.errstate(all="ignore"):
                            rel = np.abs(xa.astype(np.float64) - xb) / np.maximum(np.abs(xa), 1e-30)
                        worst = max(worst, float(np.nanmax(rel)))
            cv = cp.manifest["frameworks"]["jax"]["compiled_values"]
            print(f"equations: replay {len(ra)}, compiled {len(ca)}")
            print(f"values bitwise equal: {same}, different: {differ}, worst relative "
                  f"difference {worst:.3g}")
            print(f"differing values by op: {dict(sorted(ops.items(), key=lambda kv: -kv[1]))}")
            print(f"calls whose values program returned the script's outputs bitwise: "
                  f"{cv['final_outputs_equal_compiled']} of {cv['calls']}")


if __name__ == "__main__":
    main()
