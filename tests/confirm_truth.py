"""The truth of `tracediff confirm`'s cases, without tracediff (tests/test_confirm.py and
benchmarks/confirm_truths.py): a program's final parameters from plain runs under each
environment (`final`, compared by `helpers.rel_l2`), and, for torch, which aten ops each setting changes on the
same inputs (`ops_changed`).

"""

import os
import subprocess
import sys

import numpy as np

# variables the cases set: every run starts without them, then sets its own
SETTING_PREFIXES = ("ATEN_", "ONEDNN_", "OMP_", "XLA_FLAGS", "JAX_DEFAULT_MATMUL")


def environment(extra, base=None):
    env = {k: v for k, v in (base if base is not None else os.environ).items()
           if not k.startswith(SETTING_PREFIXES)}
    env.update(extra)
    return env


def final(script, args, env, out, base=None):
    """The final parameters of one plain run (`--save-final`), float64."""
    subprocess.run([sys.executable, str(script), *args, "--save-final", str(out)],
                   env=environment(env, base), check=True, capture_output=True)
    with np.load(out) as f:
        return {k: f[k].astype(np.float64) for k in f.files}


# the truth of each op's cause, without tracediff: the script run plainly under a dispatch
# mode that saves the inputs of the first calls of every aten op (torch.save); then, in one
# process per setting, each saved call run again on those inputs and its outputs hashed: a
# setting that changes an op's hash from the plain process's changes how that op computes
OPS = """
import collections, copy, hashlib, io, runpy, sys
import torch
from torch.utils._python_dispatch import TorchDispatchMode

def digest(x):
    ts = [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]
    return hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes() for t in ts
                                   if t.dtype.is_floating_point)).hexdigest()[:16]

if sys.argv[1] == "save":
    calls, seen = [], collections.Counter()

    class Save(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "aten" and seen[func.name()] < 20:
                seen[func.name()] += 1
                detach = lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t
                call = (func.name(), torch.utils._pytree.tree_map(detach, (args, kwargs)))
                try:   # calls holding what cannot be saved (a profiler handle) are left out
                    torch.save(call, io.BytesIO())
                    calls.append(call)
                except Exception:
                    pass
            return func(*args, **kwargs)

    out, sys.argv = sys.argv[2], sys.argv[3:]
    with Save():
        runpy.run_path(sys.argv[0], run_name="__main__")
    torch.save(calls, out)
else:
    for name, (args, kwargs) in torch.load(sys.argv[2], weights_only=False):
        packet, _, overload = name.split("::")[1].partition(".")
        func = getattr(getattr(torch.ops.aten, packet), overload or "default")
        args, kwargs = copy.deepcopy((args, kwargs))
        try:
            print(name, digest(func(*args, **kwargs)))
        except Exception as exc:
            print(name, "failed")
"""


def _op_hashes(calls, env, base):
    out = subprocess.run([sys.executable, "-c", OPS, "run", str(calls)],
                         env=environment(env, base), check=True, capture_output=True,
                         text=True).stdout.splitlines()
    return [line.split() for line in out if line.startswith("aten::")]


def ops_changed(script, args, folder, settings, base=None):
    """{setting: aten op names whose bits change under it alone, on the same saved
    inputs} of a torch script run plainly with `args`."""
    calls = os.path.join(folder, "calls.pt")
    subprocess.run([sys.executable, "-c", OPS, "save", calls, str(script), *args],
                   env=environment({}, base), check=True, capture_output=True)
    plain = _op_hashes(calls, {}, base)
    out = {}
    for k, v in settings.items():
        other = _op_hashes(calls, {k: v}, base)
        out[k] = sorted({op.split(".")[0] for (op, h), (_, h2) in zip(plain, other)
                         if h != h2 and "failed" not in (h, h2) and "empty" not in op})
    return out
