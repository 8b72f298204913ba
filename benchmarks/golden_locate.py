"""Golden `locate --json` answers on the fixtures: record the cases with this checkout,
locate them, and write each answer with what varies between runs (paths, times, hosts,
pids, sizes on disk) taken out; then compare two such folders.

A change that is meant to be invisible to users (a faster recorder, a codec, a new package
layout) must leave every answer equal:

    python benchmarks/golden_locate.py write /tmp/golden-before      # on the old commit
    python benchmarks/golden_locate.py write /tmp/golden-after       # on the new one
    python benchmarks/golden_locate.py compare /tmp/golden-before /tmp/golden-after

Cases: real mechanisms only (a perturbed kernel loaded through PYTHONPATH, XLA's ISA
limit, a fixture's own switch), at levels full and stats, torch, JAX and a Flax port.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERTURB = os.path.join(ROOT, "tests", "perturb")
SSE = {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"}


def _perturb(name):
    return {"PYTHONPATH": os.path.join(PERTURB, name)}


# name: (a: (script, args, env, record options), b: (...) or None for a one-trace port)
CASES = {
    "torch_dot_broken": (("torch_dot.py", [], {}, []), ("torch_dot.py", [], _perturb("broken_dot"), [])),
    "torch_max_dim": (("torch_max_dim.py", [], {}, []),
                      ("torch_max_dim.py", [], _perturb("max_dim_indices"), [])),
    "torch_mlp_tf32": (("torch_mlp.py", ["--steps", "2"], {}, []),
                       ("torch_mlp.py", ["--steps", "2"], _perturb("tf32_addmm"), [])),
    "torch_gru_tf32": (("torch_gru_adam.py", ["--steps", "3"], {}, []),
                       ("torch_gru_adam.py", ["--steps", "3"], _perturb("tf32_addmm"), [])),
    "torch_gru_tf32_stats": (("torch_gru_adam.py", ["--steps", "3"], {}, ["--level", "stats"]),
                             ("torch_gru_adam.py", ["--steps", "3"], _perturb("tf32_addmm"),
                              ["--level", "stats"])),
    "torch_autocast": (("torch_autocast.py", [], {}, []), ("torch_autocast.py", ["--autocast"], {}, [])),
    "jax_gru_sse": (("jax_gru_expm_adam.py", [], {}, []), ("jax_gru_expm_adam.py", [], SSE, [])),
    "jax_gru_sse_stats": (("jax_gru_expm_adam.py", [], {}, ["--level", "stats"]),
                          ("jax_gru_expm_adam.py", [], SSE, ["--level", "stats"])),
    "jax_fma_sse": (("jax_fused_fma.py", [], {}, []), ("jax_fused_fma.py", [], SSE, [])),
    "jax_mlp_sse": (("jax_mlp.py", ["--sizes", "16,32,8", "--steps", "3"], {}, []),
                    ("jax_mlp.py", ["--sizes", "16,32,8", "--steps", "3"], SSE, [])),
    "jax_mlp_sse_stats": (("jax_mlp.py", ["--sizes", "16,32,8", "--steps", "3"], {}, ["--level", "stats"]),
                          ("jax_mlp.py", ["--sizes", "16,32,8", "--steps", "3"], SSE,
                           ["--level", "stats"])),
    "flax_vs_torch_linear": (("flax_dense.py", [], {}, []), ("torch_linear.py", [], {}, [])),
    "port_transformer_swap_qk": (("port_transformer.py", ["--swap-qk"], {}, []), None),
    "port_mlp_adam_decay": (("port_mlp_adam.py", ["--adamw", "--decay-mask"], {}, []), None),
}

# keys whose values differ between two recordings of the same case on one machine
VOLATILE = {"path", "trace_a", "trace_b", "created", "hostname", "pid", "elapsed", "seconds",
            "bytes", "file_size", "size", "duration", "wall", "time", "argv", "executable",
            "sha256_file", "command", "commands", "repro", "traces"}


def _scrub(obj, tmp):
    if isinstance(obj, dict):
        return {k: ("<volatile>" if k in VOLATILE else _scrub(v, tmp)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub(v, tmp) for v in obj]
    if isinstance(obj, str):
        return obj.replace(tmp, "<tmp>").replace(ROOT, "<root>")
    return obj


def _record(tmp, name, side, spec):
    script, args, env, options = spec
    out = os.path.join(tmp, f"{name}.{side}.h5")
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **env)
    proc = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", out, *options,
                           os.path.join(ROOT, "fixtures", script), *args],
                          env=full_env, cwd=tmp, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} ({side}): record exited {proc.returncode}\n{proc.stderr[-2000:]}")
    return out


def write(folder, only=None):
    os.makedirs(folder, exist_ok=True)
    for name, (a, b) in CASES.items():
        if only and name not in only:
            continue
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
            paths = [_record(tmp, name, "a", a)] + ([_record(tmp, name, "b", b)] if b else [])
            proc = subprocess.run([sys.executable, "-m", "tracediff", "locate", "--json", *paths],
                                  cwd=tmp, capture_output=True, text=True)
            if proc.returncode not in (0, 1):
                raise SystemExit(f"{name}: locate exited {proc.returncode}\n{proc.stderr[-2000:]}")
            answer = {"exit_code": proc.returncode, "locate": _scrub(json.loads(proc.stdout), tmp)}
        with open(os.path.join(folder, f"{name}.json"), "w") as fh:
            json.dump(answer, fh, indent=1, sort_keys=True)
        print(f"{name}: exit {proc.returncode} ({time.time() - t0:.0f} s)", flush=True)


def _diff(a, b, where=""):
    if type(a) is not type(b):
        return [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'new' if k in b else 'old'}")
            else:
                out += _diff(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def compare(old, new):
    bad = 0
    for fn in sorted(os.listdir(old)):
        if not fn.endswith(".json"):
            continue
        if not os.path.exists(os.path.join(new, fn)):
            print(f"{fn}: missing in {new}")
            bad += 1
            continue
        with open(os.path.join(old, fn)) as fa, open(os.path.join(new, fn)) as fb:
            diffs = _diff(json.load(fa), json.load(fb))
        print(f"{fn}: {'same' if not diffs else f'{len(diffs)} differences'}")
        for d in diffs[:20]:
            print("   ", d)
        bad += bool(diffs)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("folder")
    w.add_argument("--only", help="comma-separated case names")
    c = sub.add_parser("compare")
    c.add_argument("old")
    c.add_argument("new")
    args = ap.parse_args()
    if args.cmd == "write":
        write(args.folder, set(args.only.split(",")) if args.only else None)
    else:
        sys.exit(compare(args.old, args.new))


if __name__ == "__main__":
    main()
