"""Where a recorded step's host time goes, on whatever backend JAX has here: `tracediff
record` of fixtures/jax_mlp.py under cProfile, twice per level (`--steps` and
`--steps` + `--more`), and the functions that take the most of the difference, in
milliseconds a step: the steady state, start-up and compiles cancelled out.

Beside each level the loop's own time a step with and without the profiler (cProfile
adds a fixed cost a Python call, so functions called per value look dearer than they
are), and the plain script's.

    python benchmarks/record_profile.py [--levels calls,full] [--steps 20] [--more 200]
                                        [--top 25]
                                        [--args "--sizes 4096,4096 --batch 1024"]
                                        [--extra "--jax-values compiled"]
"""

import argparse
import os
import pstats
import shlex
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from issue30 import run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP = os.path.join(ROOT, "fixtures", "jax_mlp.py")


def per_step(label, ms):
    return f"{label}: {ms:.3f} ms a step"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="calls,stats,full")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--more", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--args", default="", help="more fixtures/jax_mlp.py options")
    parser.add_argument("--extra", default="", help="more `tracediff record` options")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    def script(steps):
        return [MLP, *shlex.split(args.args), "--steps", str(steps), "--time"]

    long = args.steps + args.more
    plain = run([sys.executable, *script(long)], env)
    print(per_step("plain", plain["loop_wall"] * 1e3 / (long - 1)), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for level in args.levels.split(","):
            trace = os.path.join(tmp, "t.h5")

            def record(steps):
                return ["-m", "tracediff", "record", "-o", trace, "--level", level,
                        *shlex.split(args.extra), *script(steps)]

            bare = run([sys.executable, *record(long)], env)
            profiles, loop = [], None
            for steps in (args.steps, long):
                prof = os.path.join(tmp, f"{level}-{steps}.prof")
                res = run([sys.executable, "-m", "cProfile", "-o", prof, *record(steps)], env)
                profiles.append(pstats.Stats(prof).stats)
                loop = res["loop_wall"]
            print(f"\n## {level}: " + per_step("loop", bare["loop_wall"] * 1e3 / (long - 1)) +
                  "; " + per_step("under cProfile", loop * 1e3 / (long - 1)))
            short, full = profiles
            rows = []
            for key, (_, calls, own, total, _) in full.items():
                _, c0, o0, t0, _ = short.get(key, (0, 0, 0.0, 0.0, None))
                rows.append((key, (calls - c0) / args.more, (own - o0) * 1e3 / args.more,
                             (total - t0) * 1e3 / args.more))
            print("| function | calls a step | own ms a step | with callees, ms a step |")
            print("|---|---|---|---|")
            for (path, line, name), calls, own, total in sorted(
                    rows, key=lambda r: -r[2])[:args.top]:
                where = os.path.relpath(path, ROOT) if path.startswith(ROOT) else \
                    os.path.basename(path)
                print(f"| {where}:{line}({name}) | {calls:.1f} | {own:.3f} | {total:.3f} |")
            os.unlink(trace)


if __name__ == "__main__":
    main()
