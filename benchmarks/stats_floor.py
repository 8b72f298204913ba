"""The floor under any recorder that looks at every value: what one pass over the bytes a
training step writes costs, next to the step itself.

A recorder at the stats level must read each op's output at least once (for its hash
and statistics). On a bandwidth-bound step — the torch MLP of benchmarks/overhead.py,
whose Adam update writes parameter-sized buffers several times a step — that one read
is a fixed share of the step, whatever the recorder's code. This script measures, in one
process and one run:

- the plain step (loop CPU seconds per step, `--threads` intra-op threads);
- the bytes of every aten op output in a step (a counting dispatch mode, nothing kept);
- one pass over that many bytes: xxh3 (the trace's hash), numpy sum, `aminmax`, dot —
  each alone, on a buffer of that size (the statistics tracediff stores need the sum,
  min/max and L2: three passes; the hash a fourth).

It prints the ratio each would give on its own: (plain + pass) / plain.

`--framework jax`: the jitted Flax MLP + optax Adam step of fixtures/jax_mlp.py (sizes
256,1024,1024,256 by default), whose intermediates are the outputs of every equation of
the step's jaxpr (nested jaxprs included: what the stats level records per call).

    python benchmarks/stats_floor.py [--sizes 1024,4096,4096,1024] [--batch 64] [--steps 5]
    python benchmarks/stats_floor.py --framework jax [--steps 30]
"""

import argparse
import os
import sys
import time

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,4096,4096,1024")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--framework", choices=("torch", "jax"), default="torch")
    args = ap.parse_args()
    sys.path.insert(0, FIXTURES)   # the fixtures' build()
    plain, nbytes, ops = (_jax_step if args.framework == "jax" else _torch_step)(args)
    _passes(args, plain, nbytes, ops)


def _jax_step(args):
    """(plain step CPU seconds, bytes of every equation's outputs in a step, equations)."""
    import jax
    import numpy as np
    from jax_mlp import build
    from tracediff.capture.jax.internals import sub_jaxprs

    sizes = tuple(int(s) for s in (args.sizes if args.sizes != "1024,4096,4096,1024"
                                   else "256,1024,1024,256").replace("-", ",").split(","))
    step, params, state = build(sizes, args.batch)
    jaxpr = jax.make_jaxpr(step)(params, state).jaxpr
    nbytes = eqns = 0

    def walk(jp):
        nonlocal nbytes, eqns
        for eqn in jp.eqns:
            eqns += 1
            for v in eqn.outvars:
                aval = v.aval
                if hasattr(aval, "shape"):
                    nbytes += int(np.prod(aval.shape)) * aval.dtype.itemsize
            for sub in sub_jaxprs(eqn):
                walk(getattr(sub, "jaxpr", sub))

    walk(jaxpr)
    jstep = jax.jit(step)
    params, state, _ = jstep(params, state)
    jax.block_until_ready(params)
    t0 = time.process_time()
    for _ in range(args.steps):
        params, state, _ = jstep(params, state)
    jax.block_until_ready(params)
    print(f"Flax MLP {sizes}, batch {args.batch}, jit + optax adam")
    return (time.process_time() - t0) / args.steps, nbytes, eqns


def _torch_step(args):
    """(plain step CPU seconds, bytes of every aten op output in a step, outputs)."""
    import torch
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch_mlp import build

    torch.set_num_threads(args.threads)
    model, opt, x, y = build(args.sizes, args.batch)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.nbytes = self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (list, tuple)) else [out]
            if out is None:   # in-place foreach ops write their first argument
                outs = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
            for o in outs:
                if isinstance(o, torch.Tensor):
                    self.nbytes += o.numel() * o.element_size()
                    self.ops += 1
            return out

    step()   # Adam's state exists from here on
    counter = Count()
    with counter:
        step()
    t0 = time.process_time()
    for _ in range(args.steps):
        step()
    plain = (time.process_time() - t0) / args.steps
    print(f"MLP {args.sizes}, batch {args.batch}, {args.threads} thread(s)")
    return plain, counter.nbytes, counter.ops


def _passes(args, plain, nbytes, ops):
    import numpy as np
    import torch
    import xxhash

    buf = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    tbuf = torch.from_numpy(buf)

    def per_pass(fn, repeat=3):
        best = 1e9
        for _ in range(repeat):
            t = time.process_time()
            fn()
            best = min(best, time.process_time() - t)
        return best

    passes = {
        "xxh3_64 (the hash)": lambda: xxhash.xxh3_64_intdigest(memoryview(buf)),
        "numpy sum": lambda: buf.sum(),
        "torch aminmax": lambda: torch.aminmax(tbuf),
        "torch dot (L2)": lambda: torch.dot(tbuf, tbuf),
    }
    print(f"load average: {os.getloadavg()}")
    print(f"plain step: {plain * 1000:.1f} ms CPU; a step writes {nbytes / 1e9:.3f} GB "
          f"in {ops} op outputs")
    print("| one pass over a step's output bytes | ms | (plain + pass) / plain |")
    print("|---|---:|---:|")
    total = 0.0
    for name, fn in passes.items():
        t = per_pass(fn)
        total += t
        print(f"| {name} | {t * 1000:.1f} | {(plain + t) / plain:.2f}x |")
    print(f"| all four (what the stats level needs today) | {total * 1000:.1f} | "
          f"{(plain + total) / plain:.2f}x |")


if __name__ == "__main__":
    main()
