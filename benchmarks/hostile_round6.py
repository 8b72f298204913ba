"""Issue 66's attack round on its own code, re-runnable: each attack tries to make tracediff
hand back a wrong program, load a planted file, hang, lie in a statistic, blame the
hardware for a program change, stop a recording, or change what a script's signals do.
Prints a Markdown table (area, attack, held or not, what was seen) and the count held.

    python benchmarks/hostile_round6.py [--only AREA[,AREA]] [--keep DIR]

Areas: cache (tracediff's program cache: every setting, hostile entries, folders, a full
disk), sources (degenerate pairs of real recordings), stats (statistics at the float
limits, host and device path), optimizer (settings that cannot be formatted), signals
(fork, SIGTERM), nonfinite (where a NaN came from, on hostile traces).
Runs on the CPU; the device path is forced on XLA:CPU as the tests force it.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.attacks import AREAS  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="comma-separated areas: " + ", ".join(AREAS))
    ap.add_argument("--keep", help="folder for the attacks' files (kept)")
    args = ap.parse_args()
    areas = args.only.split(",") if args.only else list(AREAS)
    folder = args.keep or tempfile.mkdtemp(prefix="round6-")
    os.makedirs(folder, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    for area in areas:
        for name, attack in AREAS[area]:
            work = os.path.join(folder, f"{area}-{len(rows):03d}")
            os.makedirs(work, exist_ok=True)
            start = time.perf_counter()
            try:
                held, seen = attack(work)
            except Exception as exc:   # an attack that breaks the harness did not hold
                held, seen = False, f"harness: {type(exc).__name__}: {str(exc)[:160]}"
            rows.append((area, name, held, seen, time.perf_counter() - start))
            print(f"{'held' if held else 'FAILED':6} {area:10} {name}: {seen}", file=sys.stderr,
                  flush=True)
    print("| area | attack | held | what was seen |")
    print("|---|---|---|---|")
    for area, name, held, seen, _ in rows:
        print(f"| {area} | {name} | {'yes' if held else '**no**'} | {seen.replace('|', '/')} |")
    n = sum(1 for r in rows if r[2])
    print(f"\n{n} of {len(rows)} attacks held ({time.perf_counter() - t0:.0f} s)")
    sys.exit(0 if n == len(rows) else 1)


if __name__ == "__main__":
    main()
