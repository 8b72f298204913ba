"""Device time of tracediff's digest programs, per byte, on whatever backend JAX has here.

At `--level calls` a JAX recording on an accelerator runs, after each jitted call, one
program over the call's outputs that computes their words64 hashes and statistics
(capture/jax/digest_programs.py); on the 4096-wide MLP of issue 37 that is ~800 MB a step
(parameters and both Adam moments). This prints, for arrays of that shape on the
device, the time of one such program beside a plain read of the same bytes (a sum):

    read (sum)                  the memory floor (also summed over rows first, and over
                                (8, 128) tiles first: the reduction order's cost)
    words64                     the two hash lanes alone (level full)
    words64 + stats, one pass   what `calls` and `stats` compute on an accelerator: one
                                variadic reduction a value (digest_programs.packed)
    words64 + stats, apart      the same with each float reduction alone (XLA:CPU's)
    masked, one pass / apart    the statistics of a values program (`inside`)

and beside each program with statistics the largest error of a value's mean (over its RMS)
and of its L2 (relative) against float64 sums on the host: locate's bounds allow ~1e-6 *
log2 n and ~eps * sqrt n (diff/compare/levels.py).

    python benchmarks/digest_speed.py [--arrays 12] [--side 4096] [--repeat 10]

Minimum of `--repeat` runs after a compiling one, each waited for.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tracediff.capture.jax import digest_programs, digest_results  # noqa: E402


def timed(fn, xs, repeat):
    fn(xs).block_until_ready()
    best = None
    for _ in range(repeat):
        t = time.perf_counter()
        fn(xs).block_until_ready()
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return best


def _by_tiles(x):
    """A sum whose first stage adds whole (8, 128) tiles (a TPU's float32 tile) elementwise."""
    if x.ndim != 2 or x.shape[0] % 8 or x.shape[1] % 128:
        return x.sum()
    r, c = x.shape
    return x.reshape(r // 8, 8, c // 128, 128).sum(axis=(0, 2)).sum()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arrays", type=int, default=12, help="side x side float32 arrays")
    parser.add_argument("--side", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    keys = jax.random.split(jax.random.PRNGKey(0), args.arrays)
    xs = [jax.random.normal(k, (args.side, args.side), jnp.float32) for k in keys]
    xs += [jax.random.normal(k, (args.side,), jnp.float32) for k in keys]   # the biases
    nbytes = sum(x.nbytes for x in xs)
    print(f"backend={jax.default_backend()} kind={jax.devices()[0].device_kind} "
          f"values={len(xs)} bytes={nbytes / 1e6:.0f} MB")
    host = [np.asarray(x, np.float64) for x in xs]
    want = np.array([[h.mean(), np.sqrt((h * h).sum())] for h in host])
    rms = want[:, 1] / np.sqrt([h.size for h in host])
    programs = [("read (sum)", lambda xs: jnp.stack([x.sum() for x in xs])),
                ("read (sum over rows first)",
                 lambda xs: jnp.stack([x.sum(axis=0).sum() for x in xs])),
                ("read (sum over (8, 128) tiles)", lambda xs: jnp.stack([_by_tiles(x) for x in xs])),
                ("words64", lambda xs: digest_programs.packed(xs, False))]
    for together in (True, False):
        how = "one pass" if together else "apart"
        programs += [(f"words64 + stats, {how}",
                      lambda xs, t=together: digest_programs.packed(xs, True, together=t)),
                     (f"masked, {how}",
                      lambda xs, t=together: digest_programs.packed(xs, True, inside=True,
                                                               together=t))]
    print("| program | time | speed | error: mean / RMS, L2 |")
    print("|---|---|---|---|")
    for name, fn in programs:
        fn = jax.jit(fn)
        dt = timed(fn, xs, args.repeat)
        err = ""
        if "stats" in name or "masked" in name:
            _, _, st, _ = digest_results.unpack_all(np.asarray(fn(xs)), True)
            off = np.abs(st[:, 2:4] - want)
            err = f"{(off[:, 0] / rms).max():.1e}, {(off[:, 1] / want[:, 1]).max():.1e}"
        print(f"| {name} | {dt * 1e3:.3f} ms | {nbytes / dt / 1e9:.1f} GB/s | {err} |",
              flush=True)


if __name__ == "__main__":
    main()
