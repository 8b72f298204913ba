"""The truth for a program that ends with NaN, taken without tracediff: `python
tests/nonfinite_truth.py OUT.json SCRIPT [ARGS...]` runs SCRIPT and writes to OUT.json the
first op that made a NaN or Inf from finite inputs: {"op", "phase", "step", "made"}.

torch: a TorchDispatchMode checks every aten op's inputs before it runs and its outputs
after (forward, backward, the optimizer's ops); the phase is the autograd engine's (a node
is running: backward) or the optimizer's (between its step hooks); the step counts
optimizer steps done. JAX: `jax_debug_nans` and `jax_debug_infs` stop the program at the
first primitive whose result is non-finite (a jit call re-run op by op) and name it; the
step is the number of lines the program printed before (one per step).
"""
import io
import json
import re
import runpy
import sys


def torch_truth(script, argv):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    state = {"step": 0, "optimizer": False, "first": None}

    def pre(*_):
        state["optimizer"] = True

    def post(*_):
        state["optimizer"] = False
        state["step"] += 1

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)

    def counts(xs):
        nan = inf = 0
        for x in xs:
            if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
                nan += int(torch.isnan(x).sum())
                inf += int(torch.isinf(x).sum())
        return nan, inf

    class Truth(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            before = counts(tree_flatten((args, kwargs))[0]) if state["first"] is None else None
            out = func(*args, **kwargs)
            if before == (0, 0):
                nan, inf = counts(tree_flatten(out)[0])
                if nan or inf:
                    phase = "optimizer" if state["optimizer"] else (
                        "backward" if torch._C._current_autograd_node() is not None else "forward")
                    state["first"] = {"op": func.name(), "phase": phase, "step": state["step"],
                                      "made": "NaN" if nan else "Inf"}
            return out

    with Truth():
        _run(script, argv)
    return state["first"]


def jax_truth(script, argv):
    import jax

    jax.config.update("jax_debug_nans", True)
    jax.config.update("jax_debug_infs", True)
    out = io.StringIO()
    real = sys.stdout
    sys.stdout = out
    try:
        _run(script, argv)
    except FloatingPointError as exc:
        m = re.search(r"invalid value \((nan|inf)\) encountered in (\w+)", str(exc))
        return {"op": m.group(2), "made": m.group(1).replace("nan", "NaN").replace("inf", "Inf"),
                "step": sum(1 for line in out.getvalue().splitlines() if re.match(r"\d+ ", line))}
    finally:
        sys.stdout = real
    return None


def _run(script, argv):
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    out_path, script, *argv = sys.argv[1:]
    source = open(script).read()
    truth = torch_truth(script, argv) if "import torch" in source else jax_truth(script, argv)
    with open(out_path, "w") as fh:
        json.dump(truth, fh)
