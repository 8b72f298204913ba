"""HF ports in the field suite (CLIP text, ViT): each case recorded as a user records it, and
the truth independent of tracediff: torch forward hooks on every module and Flax
`capture_intermediates`, paired by module path; the first module, in the order torch's
modules finish, whose output differs beyond float32 tolerance."""

import os
import subprocess
import sys

import numpy as np

from ..helpers import script_env

RTOL, ATOL = 1e-5, 1e-6     # float32 (compare.DEFAULT_TOLERANCES)


def load_program(path):
    """The field program at `path` as a module (its model builders, for the truth)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3] + "_program", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def record_cases(program, cases, folder, extra=()):
    """{case: trace} of `tracediff record PROGRAM --bug BUG [EXTRA]` for each (case, bug); BUG
    may be the program's whole argument list instead (["--attn", "sdpa", "--bug", "none"])."""
    env = script_env()
    env.pop("XLA_FLAGS", None)
    out = {}
    for name, bug in cases.items():
        path = str(folder / f"{name}.h5")
        args = ["--bug", bug] if isinstance(bug, str) else list(bug)
        r = subprocess.run([sys.executable, "-m", "tracediff", "record", "-o", path, program,
                            *args, *extra], cwd=folder, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
        out[name] = path
    return out


def first_array(x):
    """The first array of a module's output (a tuple, a transformers ModelOutput)."""
    while isinstance(x, (tuple, list)) or hasattr(x, "to_tuple"):
        x = x.to_tuple()[0] if hasattr(x, "to_tuple") else x[0]
    return np.asarray(x.detach().numpy() if hasattr(x, "detach") else x, np.float64)


def activation_difference(act_module, run_torch, port_fn):
    """Max abs of torch's activation module's output against the port's activation
    `port_fn` applied to the same input (one forward hook): the truth where Flax computes
    the activation inside another module, with no output of its own to capture."""
    import torch

    seen = {}

    def keep(_m, args, out):          # returns None: the module's output stays as it is
        seen.setdefault("io", (args[0].numpy(), out.numpy()))

    hook = act_module.register_forward_hook(keep)
    with torch.no_grad():
        run_torch()
    hook.remove()
    x, out = seen["io"]
    return float(np.abs(np.asarray(port_fn(x), np.float64) - out).max())


def first_differing(tmodel, run_torch, fmodel, params, flax_args):
    """(first differing module path or None, modules compared)."""
    return first_difference(tmodel, run_torch, fmodel, params, flax_args)[:2]


def beyond(a, b):
    """Is a module's output a (Flax) beyond float32 tolerance of b (torch)? Element by element
    and as a whole (||a - b|| > RTOL ||b|| + ATOL sqrt(n)): a correct port's rounding
    carried through a residual add whose terms cancel exceeds ATOL in an element or two, by
    how much depends on the CPU (HF T5's second feed-forward block, 2.1e-6 on an AMD EPYC
    with AVX-512, within tolerance on an Intel Xeon); a port bug is beyond both ways."""
    a = np.asarray(a, np.float64).reshape(np.shape(b))
    b = np.asarray(b, np.float64)
    if not (np.abs(a - b) > ATOL + RTOL * np.abs(b)).any():
        return False
    return bool(np.linalg.norm(a - b) > RTOL * np.linalg.norm(b) + ATOL * np.sqrt(b.size))


def first_difference(tmodel, run_torch, fmodel, params, flax_args):
    """(first differing module path or None, modules compared, its output's max abs
    difference or None)."""
    rows = module_differences(tmodel, run_torch, fmodel, params, flax_args)
    first = next(((name, max_abs) for name, max_abs, differs in rows if differs), (None, None))
    return first[0], len(rows), first[1]


def module_differences(tmodel, run_torch, fmodel, params, flax_args):
    """[(module path, max abs difference, beyond tolerance)] in the order torch's modules
    finish, for each module both sides have under one path. `params`: the Flax parameters,
    or all its variables ({"params", "batch_stats"}: BatchNorm's running statistics)."""
    import jax
    import torch

    outs, order = {}, []

    def hook(name):
        def fn(_m, _i, output):
            if name not in outs:        # a module called twice (T5's dropout): its first call,
                outs[name] = first_array(output)    # as Flax's capture lists it first
                order.append(name)
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in tmodel.named_modules() if n]
    with torch.no_grad():
        run_torch(tmodel)
    for h in handles:
        h.remove()
    variables = params if "params" in params else {"params": params}
    _, inter = fmodel.module.apply(variables, *flax_args,
                                   capture_intermediates=True, mutable=["intermediates"])
    flat = {}
    for path, v in jax.tree_util.tree_flatten_with_path(
            inter["intermediates"], is_leaf=lambda x: isinstance(x, tuple))[0]:
        keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        if keys and keys[-1] == "__call__":
            flat[".".join(str(k) for k in keys[:-1])] = first_array(v)
    rows = []
    for name in order:
        a, b = flat.get(name), outs[name]
        if a is None or a.size != b.size:
            continue
        if a.ndim == 4 and a.shape != b.shape and a.shape == tuple(np.array(b.shape)[[0, 2, 3, 1]]):
            a = a.transpose(0, 3, 1, 2)       # a Flax conv's NHWC output against torch's NCHW
        rows.append((name, float(np.abs(a.reshape(b.shape) - b).max()), beyond(a, b)))
    return rows
