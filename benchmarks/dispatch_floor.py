"""The floor under any Python aten-level recorder: the GRU+Adam loop under a
TorchDispatchMode that only calls the op (nothing recorded), against the plain loop.

    python benchmarks/dispatch_floor.py [--steps 100] [--repeat 3]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "fixtures"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch_gru_adam import train

    torch.set_num_threads(1)

    class Bare(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    train(3)
    best = {}
    for _ in range(args.repeat):
        for name in ("plain", "bare dispatch mode"):
            if name == "plain":
                t = train(args.steps)[2]
            else:
                with Bare():
                    t = train(args.steps)[2]
            best[name] = min(best.get(name, 1e9), t)
    base = best["plain"]
    print(f"load average: {os.getloadavg()}")
    for name, t in best.items():
        print(f"| {name} | {t:.3f} | {t / base:.1f}x |")


if __name__ == "__main__":
    main()
