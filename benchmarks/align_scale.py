"""Alignment and `locate --no-explain` on the cross-version pair at a realistic size.

The seed's script (fixtures/jax_gru_expm_adam.py: Flax GRU + expm + optax Adam under jit)
recorded for N steps under the oldest supported JAX (0.7.2, its own Python) and under this
one: another JAX version adds, drops and reorders equations, so thousands of events are
unpaired (the issue measured ~900 and ~2,300 at 25 MB). Reported, CPU seconds of this
process (the machine is shared: wall seconds are printed too, for what they are worth):

* reading the two traces, preparing their signatures, aligning them (anchored on calls
  and optimizer steps, the regions diffed inside);
* the same alignment with the anchors removed (one region of ~70k events, as a trace
  without calls or optimizer steps would be): module boundaries first, diff inside;
* the whole `locate --no-explain` (in process), and its findings.

    python benchmarks/align_scale.py --old-python JAX072_VENV/bin/python \
        [--steps 100] [--keep DIR [--reuse]]

The old JAX's Python needs only jax/flax/optax: tracediff comes from this checkout
(PYTHONPATH).
"""

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tracediff  # noqa: E402
from tracediff.diff.align import sequence as _align  # noqa: E402
from tracediff.trace import schema  # noqa: E402
from tracediff.trace.reader import Trace  # noqa: E402

SCRIPT = os.path.join(ROOT, "fixtures", "jax_gru_expm_adam.py")


def record(python, out, steps):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    t0 = time.time()
    proc = subprocess.run([python, "-m", "tracediff", "record", "-o", out, SCRIPT,
                           "--steps", str(steps)], env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"recording with {python} failed:\n{proc.stderr[-3000:]}")
    return time.time() - t0


class Clock:
    def __init__(self):
        self.c, self.w = time.process_time(), time.time()

    def lap(self):
        c, w = time.process_time(), time.time()
        out = (c - self.c, w - self.w)
        self.c, self.w = c, w
        return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old-python", required=True, help="a Python with jax 0.7.2, flax, optax")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--keep", help="folder for the traces (kept)")
    p.add_argument("--reuse", action="store_true", help="use the traces in --keep if there")
    args = p.parse_args()
    folder = args.keep or tempfile.mkdtemp(prefix="align_scale_")
    os.makedirs(folder, exist_ok=True)
    old, new = os.path.join(folder, "old.h5"), os.path.join(folder, "new.h5")
    try:
        for python, path in ((args.old_python, old), (sys.executable, new)):
            if not (args.reuse and os.path.exists(path)):
                print(f"recording {os.path.basename(path)} ({args.steps} steps) with {python}: "
                      f"{record(python, path, args.steps):.0f} s wall", flush=True)
        mb = (os.path.getsize(old) + os.path.getsize(new)) / 1e6
        clock = Clock()
        ta, tb = Trace(old), Trace(new)
        read = clock.lap()
        strings = _align.StringIds()
        sa, sb = _align.prepare(ta, strings), _align.prepare(tb, strings)
        prep = clock.lap()
        al = _align.align(sa, sb)
        aligned = clock.lap()
        st = al.stats()
        print(f"traces: {os.path.getsize(old) / 1e6:.1f} MB (jax 0.7.2) and "
              f"{os.path.getsize(new) / 1e6:.1f} MB; events {st['events_a']} / {st['events_b']}; "
              f"matched {st['matched']}, only in a {st['only_in_a']}, only in b {st['only_in_b']}, "
              f"anchors {st['anchors_matched']}, fallback regions {st['fallback_regions']}")
        print(f"read {read[0]:.2f} s CPU ({read[1]:.2f} wall); prepare {prep[0]:.2f} s "
              f"({prep[1]:.2f}); align {aligned[0]:.3f} s ({aligned[1]:.3f})")
        # no anchors: one region (kinds rewritten to plain ops), as a trace without calls
        flat = [dataclasses.replace(s, kind=np.full(len(s.kind), schema.KIND_OP)) for s in (sa, sb)]
        clock.lap()
        fl = _align.align(*flat)
        f_t = clock.lap()
        positional = _align.align(*[dataclasses.replace(s, ns=None) for s in flat])
        p_t = clock.lap()
        m = fl.a2b >= 0
        agree = float(np.mean(al.a2b[m] == fl.a2b[m])) if m.any() else float("nan")
        print(f"no anchors, module boundaries first: {f_t[0]:.3f} s CPU, matched "
              f"{int(m.sum())} ({100 * agree:.1f}% of them as the anchored alignment pairs "
              f"them); without module boundaries (position fallback): {p_t[0]:.3f} s, "
              f"matched {int((positional.a2b >= 0).sum())}")
        ta.close()
        tb.close()
        clock.lap()
        r = tracediff.locate(old, new, explain=False)
        loc = clock.lap()
        print(f"locate --no-explain: {loc[0]:.2f} s CPU ({loc[1]:.2f} wall), {mb / loc[0]:.1f} "
              f"MB/s of CPU; verdict {r.verdict}, first difference "
              f"#{r.first_difference.a.index if r.first_difference else '-'}, first beyond "
              f"tolerance #{r.first_beyond_tolerance.a.index if r.first_beyond_tolerance else '-'}")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
