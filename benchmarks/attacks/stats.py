"""Statistics at the float limits, end to end: a script makes values of every float dtype
whose sums or squares leave the dtype's range (tiny, subnormal, huge, near the maximum,
all mixed; small and large values), recorded at `--level stats` (torch on the host, JAX
with its values digested on the device, forced on XLA:CPU); each stored mean and L2
against float64 truth (math.fsum of exactly scaled numbers)."""

import math
import os
import subprocess
import sys

import numpy as np

KINDS = ("tiny", "subnormal", "huge", "near_max", "mixed")

MAKE = """
import sys
import ml_dtypes
import numpy as np
fw, kind, out = sys.argv[1], sys.argv[2], sys.argv[3]
rng = np.random.default_rng(0)
made = {}
for name, dt in (("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16),
                 ("float32", np.float32), ("float64", np.float64)):
    fi = ml_dtypes.finfo(dt) if name == "bfloat16" else np.finfo(dt)
    for n in (1000, (1 << 16) // np.dtype(dt).itemsize + 100):
        s = rng.choice([-1.0, 1.0], n) * rng.uniform(0.5, 2.0, n)
        v = {"tiny": s * float(fi.tiny) ** 0.75, "huge": s * float(fi.max) ** 0.75,
             "subnormal": s * float(fi.smallest_subnormal) * rng.integers(1, 2 ** (fi.nmant - 1), n),
             "near_max": float(fi.max) * rng.uniform(0.5, 1.0, n)}
        if kind == "mixed":
            x = v["huge"].copy(); x[::3] = v["tiny"][::3]; x[1::3] = v["subnormal"][1::3]
        else:
            x = v[kind]
        made[f"{name}_{n}"] = x.astype(dt)
if fw == "torch":
    import torch
    for k, x in made.items():
        t = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16) if "bfloat16" in k else \\
            torch.from_numpy(x)
        t.clone()                                  # a recorded op whose output is x
else:
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    copy = jax.jit(lambda x: x + 0)                # -0.0 + 0 is 0.0: same numbers
    for k, x in made.items():
        copy(jnp.asarray(x)).block_until_ready()
np.savez(out, **{k: (x.view(np.uint16) if "bfloat16" in k else x) for k, x in made.items()})
"""


def _truth(x):
    """(mean, L2) in float64 of finite numbers, exact sums of exactly scaled values."""
    x = x.astype(np.float64)
    m = float(np.max(np.abs(x))) if x.size else 0.0
    if m == 0:
        return 0.0, 0.0
    e = math.frexp(m)[1]
    scaled = [math.ldexp(v, -e) for v in x.tolist()]
    mean = math.ldexp(math.fsum(scaled) / len(scaled), e)
    try:
        l2 = math.ldexp(math.sqrt(math.fsum(v * v for v in scaled)), e)
    except OverflowError:   # past float64's largest: no float64 holds it
        l2 = math.inf
    return mean, l2


def _close(got, want, rel):
    if want == 0 or math.isinf(want):
        return got == want
    return math.isfinite(got) and abs(got - want) <= rel * abs(want)


def _attack(fw, kind):
    def attack(work):
        import ml_dtypes

        from tracediff.trace.reader import Trace

        script, trace, saved = (os.path.join(work, n) for n in ("make.py", "t.h5", "made.npz"))
        with open(script, "w") as f:
            f.write(MAKE)
        env = {**os.environ, "TRACEDIFF_JAX_DIGEST_ON_DEVICE": "1"}
        extra = ["--jax-values", "compiled"] if fw == "jax" else []
        proc = subprocess.run([sys.executable, "-m", "tracediff", "record", "--level", "stats",
                               *extra, "-o", trace, script, fw, kind, saved], env=env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return False, proc.stderr.strip()[-160:]
        made = dict(np.load(saved))
        bad, checked = [], 0
        with Trace(trace) as t:
            v = t.values
            for key, x in made.items():
                if "bfloat16" in key:
                    x = x.view(ml_dtypes.bfloat16)
                want = _truth(x)
                hits = [i for i in range(len(v)) if v["role"][i] == 0 and
                        t.string(v["dtype"][i]) == key.split("_")[0] and
                        t.string(v["shape"][i]) == str(x.size) and
                        v["hash"][i] == _hash(t, x)]
                if not hits:
                    bad.append(f"{key}: not found")
                    continue
                st = t.value_stats(v[hits[0]])
                checked += 1
                # float32 sums of n numbers (the device's, a narrow dtype's on the host):
                # a relative error up to n * 2^-24; the mean of numbers of both signs is
                # judged against the magnitude of the numbers (their L2 / sqrt(n))
                rel = max(1e-6, x.size * 2.0 ** -24) if fw == "jax" or x.itemsize <= 4 else 1e-9
                scale = want[1] / math.sqrt(x.size) if math.isfinite(want[1]) else abs(want[0])
                if not (abs(st["mean"] - want[0]) <= rel * max(abs(want[0]), scale) and
                        _close(st["l2"], want[1], rel)):
                    bad.append(f"{key}: mean {st['mean']:.3g}/{want[0]:.3g}, l2 {st['l2']:.3g}/{want[1]:.3g}")
        return not bad and checked == len(made), \
            f"{checked} values checked" + (f"; {'; '.join(bad)[:150]}" if bad else ": every mean and L2 right")
    return attack


def _hash(t, x):
    """The trace's hash of x's bytes, with the trace's own function."""
    return t.hash_function(np.ascontiguousarray(x).tobytes())


ATTACKS = [(f"{fw} values {k}: mean and L2 against float64", _attack(fw, k))
           for fw in ("torch", "jax") for k in KINDS]
