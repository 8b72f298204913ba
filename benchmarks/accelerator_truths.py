"""Issue 37's behaviours on whatever backend JAX has here, each beside its truth computed
without tracediff, so that one run on an accelerator machine checks them with the code of
the day (`ONLY=truths bash benchmarks/on_device.sh OUT`):

  ending    fixtures/jax_gru_expm_adam.py (float64 + complex `expm`, unimplemented in part
            on a TPU): truth, the plain run's exit code, printed results and last line of
            stderr; the recorded run must end the same way
  backends  fixtures/jax_mlp.py --steps 3 at `--level stats --hash words64`, on this
            backend and with JAX_PLATFORMS=cpu: truth, whether the two plain runs print
            the same results; locate must find a difference where they do not, compare
            hash to hash what it paired, and explain must rank the backend first
  dense     fixtures/port_dense_linear.py --in 768 --out 512 (the seed's Flax Dense vs
            torch Linear, one trace; needs torch): truth, whether JAX's matmul here equals
            a float64 product of bfloat16-rounded inputs (one bf16 pass, a TPU's default)
            or of the float32 ones; explain must name the bf16 pass and its fix exactly
            where the truth is a bf16 pass

    python benchmarks/accelerator_truths.py [--only ending,backends,dense] [--folder DIR]

Prints one table row per check: the truth, what tracediff said, and whether they agree;
exits 1 if any disagrees.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures")
FIX_PRECISION = "default_matmul_precision"


def _run(cmd, env=None):
    return subprocess.run([sys.executable, *cmd], env=env, capture_output=True, text=True,
                          timeout=1200)


def _last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def _tracediff(*args, env=None):
    return _run(["-m", "tracediff", *map(str, args)], env)


def _json(*args):
    proc = _tracediff(*args, "--json")
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"tracediff {args[0]} failed: {_last_line(proc.stderr)}")
    return json.loads(proc.stdout)


def ending(folder, env):
    """The float64 + complex program ends as its plain run does."""
    script = [os.path.join(FIX, "jax_gru_expm_adam.py"), "--steps", "2"]
    plain = _run(script, env)
    rec = _tracediff("record", "-o", os.path.join(folder, "ending.h5"), "--level", "stats",
                     *script, env=env)
    truth = f"exit {plain.returncode}: {_last_line(plain.stderr) or _last_line(plain.stdout)}"
    script_err = "\n".join(line for line in rec.stderr.splitlines()
                           if not line.startswith("tracediff:"))
    got = f"exit {rec.returncode}: {_last_line(script_err) or _last_line(rec.stdout)}"
    same = rec.returncode == plain.returncode and rec.stdout == plain.stdout and (
        plain.returncode == 0 or _last_line(plain.stderr) in rec.stderr)
    return "ending", truth, got, same


def backends(folder, env, backend):
    """This backend against the host CPU: a difference is found where the plain runs
    differ, and the backend is its first cause."""
    script = [os.path.join(FIX, "jax_mlp.py"), "--steps", "3"]
    cpu = dict(env, JAX_PLATFORMS="cpu")
    plains = [_run(script, e).stdout for e in (env, cpu)]
    traces = []
    for name, e in (("here", env), ("cpu", cpu)):
        out = os.path.join(folder, f"backend_{name}.h5")
        proc = _tracediff("record", "-o", out, "--level", "stats", "--hash", "words64",
                          *script, env=e)
        if proc.returncode != 0:
            raise RuntimeError(f"record on {name} failed: {_last_line(proc.stderr)}")
        traces.append(out)
    differ = plains[0] != plains[1]
    rep = _json("locate", *traces)
    an = _json("explain", *traces)
    first = rep.get("first_difference") or {}
    causes = (an.get("environment") or {}).get("causes") or []
    cov = rep["coverage"]["a"]
    got = (f"{rep['verdict']}; first difference "
           f"{(first.get('a') or {}).get('op', '-')} ({first.get('level', '-')}); first cause "
           f"{causes[0]['key'] if causes else '-'}; paired {cov['paired']}/{cov['events']}, "
           f"compared {cov['compared']}")
    truth = f"{backend} vs cpu: plain results {'differ' if differ else 'equal'}"
    if differ:
        same = bool(first) and bool(causes) and causes[0]["key"] == "frameworks.jax.backend"
    else:
        same = backend != "cpu" or rep["verdict"] == "match"
    return "backends", truth, got, same


def dense_truth():
    """In a process of its own (one process at a time may hold a TPU): JAX's Dense output
    for the fixture's weights and input, made here again without tracediff, against
    float64 products of float32 and of bfloat16-rounded inputs; prints JSON."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    key1, _ = jax.random.split(jax.random.PRNGKey(0))
    x = np.random.default_rng(0).normal(size=(2, 768)).astype(np.float32)
    layer = nn.Dense(512)
    params = layer.init(key1, jnp.ones((2, 768)))
    got = np.asarray(layer.apply(params, x), np.float64)
    k = np.asarray(params["params"]["kernel"])
    b = np.asarray(params["params"]["bias"], np.float64)

    def product(dtype):
        return x.astype(dtype).astype(np.float64) @ k.astype(dtype).astype(np.float64) + b

    print(json.dumps({"off32": float(np.abs(got - product(np.float32)).max()),
                      "off16": float(np.abs(got - product(ml_dtypes.bfloat16)).max())}))


def dense(folder, env):
    """The seed's Dense vs Linear: the bf16 pass named exactly where JAX's matmul is one."""
    proc = _run([os.path.abspath(__file__), "--dense-truth"], env)
    if proc.returncode != 0:
        return "dense", "-", f"not run: {_last_line(proc.stderr)}", True
    offs = json.loads(proc.stdout)
    bf16 = offs["off16"] < 1e-5 <= offs["off32"]
    truth = (f"JAX's matmul {'= one bf16 pass' if bf16 else 'float32'} (off a bf16 "
             f"product {offs['off16']:.1e}, a float32 one {offs['off32']:.1e})")
    out = os.path.join(folder, "dense.h5")
    proc = _tracediff("record", "-o", out, os.path.join(FIX, "port_dense_linear.py"),
                      "--in", "768", "--out", "512", env=env)
    if proc.returncode != 0:
        return "dense", truth, f"not recorded: {_last_line(proc.stderr)}", "torch" in proc.stderr
    an = _json("explain", out)
    mechanism = (an.get("replay") or {}).get("mechanism") or ""
    causes = (an.get("environment") or {}).get("causes") or []
    named = "bf16 pass" in mechanism and FIX_PRECISION in mechanism
    got = (f"{an['verdict']}; bf16 pass and fix named: {'yes' if named else 'no'}; first "
           f"cause {causes[0]['key'] if causes else '-'}")
    same = named == bf16 and (not bf16 or (causes and causes[0]["key"] ==
                                           "frameworks.jax.backend"))
    return "dense", truth, got, same


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="ending,backends,dense")
    parser.add_argument("--folder", default=None)
    parser.add_argument("--dense-truth", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dense_truth:
        return dense_truth()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), ROOT) if p)
    # JAX is opened in child processes only: one process at a time may hold a TPU
    probe = _run(["-c", "import jax; print(jax.default_backend(), "
                        "jax.devices()[0].device_kind)"], env)
    backend = probe.stdout.split()[0] if probe.returncode == 0 else "?"
    print(f"backend={backend} kind={' '.join(probe.stdout.split()[1:])}", flush=True)
    print("| check | truth | tracediff | agrees |\n|---|---|---|---|", flush=True)
    bad = 0
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        for name in args.only.split(","):
            fn = {"ending": lambda: ending(folder, env),
                  "backends": lambda: backends(folder, env, backend),
                  "dense": lambda: dense(folder, env)}[name]
            try:
                check, truth, got, same = fn()
            except Exception as exc:   # a check that could not run is a disagreement
                check, truth, got, same = name, "-", f"failed: {exc}", False
            bad += not same
            print(f"| {check} | {truth} | {got} | {'yes' if same else 'NO'} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
