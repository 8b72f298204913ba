"""Where the main thread of a sampled run spent its time (benchmarks/stack_sampler): the
stretches of its timeline where one place held it longer than --min seconds (an XLA
compile, a wait on a background compile), then the callers of its samples in native XLA
compiles and thread waits, grouped by tracediff's frames.

    python benchmarks/stack_waits.py /tmp/s.12345 [--min 0.4] [--frames 6]

How the twelfth session found a first run's compiles on the script's thread on the TPU
(docs/accelerators.md).
"""

import argparse
import collections

WAITS = ("backend_compile", "threading.py:wait")


def stretches(timeline, least):
    """[(start, end, place)] where consecutive samples stayed in one place >= least s."""
    out, place, start, t = [], None, 0.0, 0.0
    for line in timeline:
        t_text, where = line.split(" ", 1)
        t = float(t_text)
        if where != place:
            if place is not None and t - start >= least:
                out.append((start, t, place))
            place, start = where, t
    if place is not None and t - start >= least:
        out.append((start, t, place))
    return out


def waits(stacks, frames):
    """Counter of the main thread's samples waiting in a compile or on a thread, by the
    last `frames` tracediff or script frames above the wait and the leaf."""
    got = collections.Counter()
    for line in stacks:
        stack, n = line.rsplit(" ", 1)
        parts = stack.split(";")
        if parts[0] != "main" or not any(w in parts[-1] for w in WAITS):
            continue
        ours = [p for p in parts if p.startswith("td/") or "fixtures" in p]
        got[" > ".join(ours[-frames:]) + "  ||  " + parts[-1]] += int(n)
    return got


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--min", type=float, default=0.4)
    parser.add_argument("--frames", type=int, default=6)
    parser.add_argument("--top", type=int, default=12)
    opts = parser.parse_args()
    with open(opts.path) as f:
        stacks, _, timeline = f.read().partition("#TIMELINE\n")
    print("main thread, stretches in one place:")
    for start, end, place in stretches(timeline.splitlines(), opts.min):
        print(f"  {start:7.2f}-{end:7.2f} ({end - start:5.2f} s) {place}")
    print("main thread samples waiting (compiles, threads), by caller:")
    for where, n in waits(stacks.splitlines(), opts.frames).most_common(opts.top):
        print(f"  {n:6d}  {where}")


if __name__ == "__main__":
    main()
