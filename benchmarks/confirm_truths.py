"""`tracediff confirm` on issue 64's four cases of several settings at once, each against
its truth from plain counterfactual runs (tests/confirm_truth.py: final parameters with
numpy; for torch, the aten ops each setting changes on the same inputs), and its cost
against the plain runs it stands for. Prints Markdown (docs/root-cause.md quotes it).

    python benchmarks/confirm_truths.py [CASE ...]     # default: all four
"""

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests import confirm_truth as truth_of  # noqa: E402
from tests.helpers import rel_l2  # noqa: E402

FX = os.path.join(ROOT, "fixtures")
ISA = {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"}
# name: (fixture, b's environment, b's arguments)
CASES = {
    "torch-cnn": ("torch_cnn_settings.py", {"ATEN_CPU_CAPABILITY": "default",
                                            "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"},
                  []),
    "torch-autocast": ("torch_attention_autocast.py", {"ATEN_CPU_CAPABILITY": "default"},
                       ["--autocast"]),
    "jax-flag": ("jax_mlp_flags.py", ISA, []),
    "jax-flag-bf16": ("jax_mlp_flags.py", ISA, ["--bf16"]),
}


def _settings(env_b, args_b):
    """[(label, env of 'without', args of 'without', env of 'alone', args of 'alone')]."""
    out = []
    for k, v in env_b.items():
        label = k if k != "XLA_FLAGS" else f"XLA flag {v.split('=')[0]}"
        out.append((label, {o: w for o, w in env_b.items() if o != k}, args_b, {k: v}, []))
    if args_b:
        out.append(("script arguments", env_b, [], {}, args_b))
    return out


def _truth(script, env_b, args_b, tmp):
    n = [0]

    def final(env, args):
        n[0] += 1
        return truth_of.final(script, args, env, os.path.join(tmp, f"t{n[0]}.npz"))

    a = final({}, [])
    t0 = time.perf_counter()
    b = final(env_b, args_b)
    plain = time.perf_counter() - t0
    whole = rel_l2(a, b)
    rows = {}
    for label, env_w, args_w, env_o, args_o in _settings(env_b, args_b):
        rows[label] = (1 - rel_l2(a, final(env_w, args_w)) / whole,
                       rel_l2(a, final(env_o, args_o)) / whole)
    return whole, rows, plain


def _confirm(script, env_b, args_b, tmp):
    for name, env, args in (("a", {}, []), ("b", env_b, args_b)):
        subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", f"{name}.h5", script,
                        *args], env=truth_of.environment(env), cwd=tmp, check=True,
                       capture_output=True)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tracediff", "confirm", "a.h5", "b.h5",
                          "--json", "--dir", "runs"], env=truth_of.environment({}), cwd=tmp,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out), time.perf_counter() - t0


def run(name):
    fixture, env_b, args_b = CASES[name]
    script = os.path.join(FX, fixture)
    with tempfile.TemporaryDirectory() as tmp:
        whole, truth, plain = _truth(script, env_b, args_b, tmp)
        ops = truth_of.ops_changed(script, [], tmp, env_b) if fixture.startswith("torch") \
            else {}
        doc, wall = _confirm(script, env_b, args_b, tmp)
    print(f"\n### {name}: `{' '.join(f'{k}={v}' for k, v in env_b.items())} "
          f"{fixture} {' '.join(args_b)}`\n")
    print(f"relative L2 of the final parameters: {whole:.3g} (plain runs), "
          f"{doc['distance']:.3g} (traces)\n")
    print("| setting | removes (truth) | removes (confirm) | alone (truth) | alone (confirm) "
          "| interaction named |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for e in doc["settings"]:
        label = e["setting"]
        t = truth.get(label) or next((v for k, v in truth.items() if label.startswith(k)),
                                     (None, None))
        errs = [abs(x - y) for x, y in ((t[0], e["removal"]), (t[1], e["alone"]))
                if x is not None and y is not None]
        worst = max([worst, *errs])
        print(f"| {label} | {_p(t[0])} | {_p(e['removal'])} | {_p(t[1])} | {_p(e['alone'])} | "
              f"{'yes' if e['interacts'] else '-'} |")
    print(f"\nlargest error: {worst:.3f}\n")
    if ops:
        print("ops each setting changes on the same inputs (truth): " + "; ".join(
            f"{k}: {', '.join(o.split('::')[-1] for o in v)}" for k, v in ops.items()) + "\n")
    print("| source | ops | estimated | measured | cause by experiment | verdict |")
    print("|---|---|---|---|---|---|")
    for s in doc["sources"]:
        print(f"| {s['rank']} | {s['ops']} ({s['mechanism']}) | {_p(s['estimated'])} | "
              f"{_p(s['measured'])} | {', '.join(s['causes_measured']) or '-'} | "
              f"{s['verdict']} |")
    runs = len(doc["runs"])
    print(f"\ncost: confirm {wall:.0f} s wall for {runs} runs; the plain run {plain:.1f} s, "
          f"x {runs} = {plain * runs:.0f} s: {wall / (plain * runs):.1f}x "
          f"({os.cpu_count()} cores)")


def _p(x):
    return "-" if x is None else f"{100 * x:.1f}%"


if __name__ == "__main__":
    for case in sys.argv[1:] or list(CASES):
        run(case)
