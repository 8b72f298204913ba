"""A recording's loop time before and after a change: plain / a git revision / this tree,
alternating, in one batch (a shared machine moves single runs by 15-30 %).

Each round runs the fixture plainly, then `tracediff record` with the revision's tracediff
(`git archive REV tracediff` into a temporary folder, imported from there), then with this
tree's; the fixture's own loop timer (`--time`: `loop_cpu_s`, steps 2..N) is compared, so
start-up, imports and the first (compiling) step do not count. Every run must print what
the plain run printed (the loss and parameter sum), or the script stops.

    python benchmarks/against_revision.py --rev 721e00e --rounds 9
    python benchmarks/against_revision.py --rev HEAD~3 --script torch_gru_adam.py --args ""
    python benchmarks/against_revision.py --rev-tree DIR ...   # DIR/tracediff: a revision's
                                                             # files (a machine without git)

The whole process's wall seconds are printed beside the loop's, so that a gain in one
never hides a loss in the other.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from child import run_timed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP = "--sizes 256,1024,1024,256 --batch 64 --steps 30"


def _loop_and_result(proc, what):
    """(loop CPU seconds, the lines the script printed but its timings)."""
    if proc.returncode != 0:
        sys.exit(f"{what} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    found = re.search(r"loop_cpu_s=([0-9.]+)", proc.stdout + proc.stderr)
    if found is None:
        sys.exit(f"{what}: no loop_cpu_s= line (does the fixture take --time?)")
    printed = [line for line in proc.stdout.splitlines() if "loop_" not in line]
    return float(found.group(1)), printed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rev", help="the git revision to compare with")
    parser.add_argument("--rev-tree", help="a folder holding that revision's tracediff/ "
                                           "(`git archive REV tracediff | tar -x -C DIR`)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--script", default="jax_mlp.py", help="a fixture with --time")
    parser.add_argument("--args", default=MLP)
    parser.add_argument("--level", default="stats")
    parser.add_argument("--threads", default="1", help="OMP_NUM_THREADS ('' to leave)")
    opts = parser.parse_args()
    if not (opts.rev or opts.rev_tree):
        parser.error("--rev or --rev-tree")
    script = os.path.join(ROOT, "fixtures", opts.script)
    args = [*opts.args.split(), "--time"]
    env = dict(os.environ)
    if opts.threads:
        env["OMP_NUM_THREADS"] = opts.threads
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base")
        os.mkdir(base)
        if opts.rev_tree:
            subprocess.run(["cp", "-r", os.path.join(opts.rev_tree, "tracediff"), base], check=True)
        else:
            archive = subprocess.run(["git", "-C", ROOT, "archive", opts.rev, "tracediff"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        trace = os.path.join(tmp, "t.h5")
        # `python -m` puts the working folder first on sys.path: the revision's tracediff
        # from `base`, this tree's from ROOT
        runs = {"plain": (None, [sys.executable, script, *args]),
                "before": (base, [sys.executable, "-m", "tracediff", "record", "-o", trace,
                                  "--level", opts.level, script, *args]),
                "after": (ROOT, [sys.executable, "-m", "tracediff", "record", "-o", trace,
                                 "--level", opts.level, script, *args])}
        for cwd in (base, ROOT):   # each run imports the tracediff it is meant to
            where = subprocess.run(
                [sys.executable, "-c", "import tracediff; print(tracediff.__file__)"],
                cwd=cwd, capture_output=True, text=True, env=env).stdout
            if not where.startswith(cwd):
                sys.exit(f"tracediff from {cwd} imports {where.strip()} instead")
        loops = {k: [] for k in runs}
        walls = {k: [] for k in runs}
        want = None
        for r in range(opts.rounds):
            for name, (cwd, cmd) in runs.items():
                os.chdir(cwd or tmp)
                proc, wall, _ = run_timed(cmd, env)
                loop, printed = _loop_and_result(proc, name)
                want = printed if want is None else want
                if printed != want:
                    sys.exit(f"{name} printed {printed}, the plain run {want}")
                loops[name].append(loop)
                walls[name].append(wall)
            p, w = loops["plain"][-1], walls["plain"][-1]
            print(f"round {r + 1}: plain {p:.3f} s (whole {w:.1f} s), before "
                  f"{loops['before'][-1] / p:.2f}x ({walls['before'][-1] / w:.2f}x), after "
                  f"{loops['after'][-1] / p:.2f}x ({walls['after'][-1] / w:.2f}x), load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    plain = statistics.median(loops["plain"])
    whole = statistics.median(walls["plain"])
    print(f"\n{opts.script} {opts.args} --level {opts.level}, {opts.rounds} rounds: loop CPU s, "
          f"and the whole process's wall s")
    print("| run | loop median s | loop x plain | loop: median of per-round ratios | "
          "whole median s | whole x plain |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| plain | {plain:.3f} | 1.00x | | {whole:.1f} | 1.00x |")
    for name in ("before", "after"):
        med = statistics.median(loops[name])
        per = statistics.median(a / b for a, b in zip(loops[name], loops["plain"]))
        wmed = statistics.median(walls[name])
        print(f"| {name} | {med:.3f} | {med / plain:.2f}x | {per:.2f}x | {wmed:.1f} | "
              f"{wmed / whole:.2f}x |")


if __name__ == "__main__":
    main()
