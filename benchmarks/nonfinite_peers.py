"""tracediff's origin of a NaN beside the tools people reach for, on the same programs
(issue 68): torch's `detect_anomaly`, JAX's `jax_debug_nans` (alone, and with
`jax_debug_infs`). For each case of fixtures/torch_nonfinite.py and jax_nonfinite.py:
the truth (tests/nonfinite_truth.py), what each tool names, and its wall time against the
plain run. tracediff: `record --level stats` then `info --json` (both timed).

    python benchmarks/nonfinite_peers.py     # prints a Markdown table
"""

import json
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.child import run_timed  # noqa: E402

CASES = [("torch_nonfinite.py", c) for c in ("log", "norm", "half", "adam")] + \
    [("jax_nonfinite.py", c) for c in ("sqrt", "norm", "half", "adam")]
ANOMALY = ("import runpy, sys, torch; torch.autograd.set_detect_anomaly(True); "
           "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def _peer(script, case, env):
    argv = [os.path.join(ROOT, "fixtures", script), "--case", case]
    if script.startswith("torch"):
        proc, wall, _ = run_timed([sys.executable, "-c", ANOMALY, *argv], env)
        m = re.search(r"Function '(\w+)' returned (nan|inf) values", proc.stderr)
        return [("detect_anomaly", m.group(1) + f" ({m.group(2)})" if m else "nothing", wall)]
    out = []
    for name, extra in (("jax_debug_nans", {"JAX_DEBUG_NANS": "1"}),
                        ("jax_debug_nans + infs", {"JAX_DEBUG_NANS": "1", "JAX_DEBUG_INFS": "1"})):
        proc, wall, _ = run_timed([sys.executable, *argv], {**env, **extra})
        m = re.search(r"invalid value \((nan|inf)\) encountered in (\w+)", proc.stderr)
        out.append((name, f"{m.group(2)} ({m.group(1)})" if m else "nothing", wall))
    return out


def main():
    env = dict(os.environ)
    folder = tempfile.mkdtemp()
    print("| program | truth | tracediff (stats) | record + info | peer | peer names | peer |")
    print("|---|---|---|---|---|---|---|")
    for script, case in CASES:
        argv = [os.path.join(ROOT, "fixtures", script), "--case", case]
        _, plain, _ = run_timed([sys.executable, *argv], env)
        truth_file = os.path.join(folder, f"{script}-{case}.json")
        run_timed([sys.executable, os.path.join(ROOT, "tests", "nonfinite_truth.py"),
                   truth_file, *argv], env)
        with open(truth_file) as fh:
            truth = json.load(fh)
        trace = os.path.join(folder, f"{script}-{case}.h5")
        _, rec, _ = run_timed([sys.executable, "-m", "tracediff", "record", "--level", "stats",
                               "-o", trace, *argv], env)
        info, inf_wall, _ = run_timed([sys.executable, "-m", "tracediff", "info", "--json",
                                       trace], env)
        nf = json.loads(info.stdout)["first_nonfinite"]
        ours = f"{nf['op']} {nf['phase']} step {nf['step']} ({nf['kind']})"
        if nf["nan_at"]:
            ours += f", NaN at {nf['nan_at']['op']}"
        want = f"{truth['op']} {truth.get('phase', '')} step {truth['step']} ({truth['made']})"
        for name, named, wall in _peer(script, case, env):
            print(f"| {script[:-3]} {case} | {want} | {ours} | {rec / plain:.1f}x + "
                  f"{inf_wall:.1f} s | {name} | {named} | {wall / plain:.2f}x |")
        print(f"| | plain run {plain:.1f} s | | | | | |", flush=True)


if __name__ == "__main__":
    main()
