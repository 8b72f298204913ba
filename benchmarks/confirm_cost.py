"""What `tracediff confirm` costs against the plain runs it stands for (issue 64): a script
recorded plainly (a) and under settings (b), then `confirm a b` timed, beside one plain run
of the script (no tracediff) times the number of runs confirm made.

    python benchmarks/confirm_cost.py SCRIPT [KEY=VALUE ...]     # b's settings
    python benchmarks/confirm_cost.py fixtures/torch_mlp.py ATEN_CPU_CAPABILITY=default
"""

import json
import os
import subprocess
import sys
import tempfile
import time

SETTING_PREFIXES = ("ATEN_", "ONEDNN_", "OMP_", "XLA_FLAGS", "JAX_")


def _env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(SETTING_PREFIXES)}
    env.update(extra)
    return env


def _timed(words, env, cwd):
    t0 = time.perf_counter()
    subprocess.run(words, env=env, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main(script, settings):
    script = os.path.abspath(script)
    extra = dict(s.split("=", 1) for s in settings)
    with tempfile.TemporaryDirectory() as tmp:
        plain = min(_timed([sys.executable, script], _env({}), tmp) for _ in range(2))
        for name, env in (("a", {}), ("b", extra)):
            _timed([sys.executable, "-m", "tracediff", "record", "-o", f"{name}.h5", script],
                   _env(env), tmp)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "tracediff", "confirm", "a.h5", "b.h5",
                              "--json", "--dir", "runs"], env=_env({}), cwd=tmp, check=True,
                             capture_output=True, text=True).stdout
        wall = time.perf_counter() - t0
    doc = json.loads(out)
    runs = len(doc["runs"])
    recorded = sum(r["seconds"] for r in doc["runs"])
    print(f"{os.path.basename(script)} with {' '.join(settings)} on {os.cpu_count()} cores: "
          f"confirm {wall:.1f} s wall, {runs} runs (their recording {recorded:.1f} s summed); "
          f"plain run {plain:.2f} s x {runs} = {plain * runs:.1f} s; "
          f"ratio {wall / (plain * runs):.1f}x")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
