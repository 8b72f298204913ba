"""Whole-process seconds of a JAX recording with tracediff's program cache cold and warm
(capture/jax/program_cache.py), beside the plain run: fixtures/jax_mlp.py (or `--script`)
with the given arguments; for each level, one run into an empty cache folder, then one run that loads what
it stored. The script's printed results must equal the plain run's, and the warm trace the
cold one (every value row; statistics value by value).

    python benchmarks/program_cache.py [--args "--sizes 4096,4096,4096,4096,4096 --batch 1024
        --steps 20"] [--levels stats,calls] [--extra "--jax-values compiled"]
    python benchmarks/program_cache.py --script fixtures/flax_block_adam.py --args "" \
        --levels full          # issue 55's Flax block

On the CPU tracediff compiles no program of its own by default (values replayed, hashed on
the host): pass `--extra "--jax-values compiled"` and TRACEDIFF_JAX_DIGEST_ON_DEVICE=1 to
measure the device path there. docs/accelerators.md (ninth to twelfth sessions) has the TPU's numbers.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP = os.path.join(ROOT, "fixtures", "jax_mlp.py")


def timed(cmd, env):
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def rows(path):
    import h5py
    import numpy as np

    with h5py.File(path) as f:
        manifest = json.loads(f["manifest"][()])
        return (np.asarray(f["values"]).tobytes(),
                np.sort(np.asarray(f["stats"]), order="value").tobytes(),
                manifest["frameworks"]["jax"].get("program_cache"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--args", default="--steps 30")
    parser.add_argument("--levels", default="stats,calls")
    parser.add_argument("--extra", default="")
    parser.add_argument("--script", default=MLP)
    opts = parser.parse_args()
    script = [os.path.abspath(opts.script), *shlex.split(opts.args)]
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)   # JAX's own cache would hold them instead
    with tempfile.TemporaryDirectory() as tmp:
        plain, expected = timed([sys.executable, *script], env)
        print(f"plain {plain:.1f} s  ({opts.args})")
        for level in opts.levels.split(","):
            env["TRACEDIFF_XLA_CACHE"] = os.path.join(tmp, f"xla-{level}")
            got = {}
            for run in ("cold", "warm"):
                out = os.path.join(tmp, f"{level}-{run}.h5")
                wall, printed = timed([sys.executable, "-m", "tracediff", "record", "--level",
                                       level, *shlex.split(opts.extra), "-o", out, *script], env)
                assert printed == expected, f"{level} {run}: the script printed otherwise"
                got[run] = rows(out)
                print(f"{level:5s} {run}: {wall:6.1f} s  {wall / plain:4.2f}x plain  "
                      f"cache: {got[run][2]}")
            same = got["cold"][:2] == got["warm"][:2]
            print(f"{level:5s} warm trace = cold trace: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
