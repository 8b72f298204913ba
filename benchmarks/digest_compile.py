"""Compile and run times of the digest programs' formulations (capture/jax/digest_programs.py)
on whatever backend JAX has: one value of three shapes, and twenty chained values in one
program (digested inside, as a values program does; hashed only; stacked under one vmap).

    python benchmarks/digest_compile.py [variants]

docs/accelerators.md (ninth session) has the TPU v5e's numbers. The last part compiles two
programs with JAX's persistent cache in a child process twice (a TPU held by this process
refuses the child: read those lines on a CPU).
"""
import os, subprocess, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from tracediff.capture.jax import digest_programs as dp


def ct(name, f, *args, runs=5):
    t0 = time.perf_counter(); c = jax.jit(f).lower(*args).compile(); comp = time.perf_counter() - t0
    out = c(*args); jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(runs):
        out = c(*args)
    jax.block_until_ready(out); run = (time.perf_counter() - t0) / runs
    print(f"{name:44s} compile {comp:6.2f} s  run {run*1e3:8.3f} ms", flush=True)
    return out


def chain(x, n):
    ys = []
    for i in range(n):
        x = x * np.float32(1.0001) + np.float32(i)
        ys.append(x)
    return ys


def variants():
    """`python benchmarks/digest_compile.py variants`: which part of a value's digest compiles
    slowly (one 1024x4096 value, and 20 chained values digested inside one program)."""
    U = jnp.uint32
    w2 = lambda x: lax.bitcast_convert_type(x, U)
    pos = lambda w: dp._positions(w.shape, 0x9E3779B1, 0x7F4A7C15)

    def one_mul(x):
        x = x * np.uint32(0x85EBCA6B)
        return x ^ (x >> 15)

    V = {"raw word sum": lambda x: w2(x).sum(dtype=U),
         "one lane fmix32": lambda x: dp._fmix32(w2(x) + pos(w2(x))).sum(dtype=U),
         "lanes (words64)": lambda x: dp.lanes(x),
         "two lanes one multiply": lambda x: jnp.stack([
             one_mul(w2(x) + pos(w2(x))).sum(dtype=U),
             one_mul((w2(x) ^ np.uint32(7)) + pos(w2(x))).sum(dtype=U)]),
         "4 plain stats": lambda x: jnp.stack([x.sum(), (x * x).sum(), x.min(), x.max()]),
         "masked digest": lambda x: dp._digest(x, True, True)[0]}
    print(jax.devices()[0].device_kind, flush=True)
    x = jax.random.normal(jax.random.PRNGKey(0), (1024, 4096), jnp.float32)
    ct("20 chained, returned", lambda x: chain(x, 20), x)
    for name, f in V.items():
        ct("one: " + name, f, x)
        ct("20 inside: " + name,
           lambda x: jnp.stack([jnp.atleast_1d(f(y)) for y in chain(x, 20)]).reshape(-1), x)
    ct("20 inside: packed (nested jit)", lambda x: dp.packed(chain(x, 20), True, inside=True), x)


if sys.argv[1:] == ["variants"]:
    variants()
    sys.exit()

if sys.argv[1:] == ["cache"]:
    jax.config.update("jax_compilation_cache_dir", "/tmp/jcc")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    x = jnp.ones((4096, 4096), jnp.float32)
    ct("cached? packed quick+cond", lambda x: dp.packed([x], True), x)
    ct("cached? 20 chained inside", lambda x: dp.packed(chain(x, 20), True, inside=True), x)
    sys.exit()

print(jax.devices()[0].device_kind)
for shape in [(4096, 4096), (1024, 4096), (256, 256)]:
    x = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32)
    print("shape", shape)
    ct("packed quick+cond (eager program)", lambda x: dp.packed([x], True), x)
    ct("packed inside (masked)", lambda x: dp.packed([x], True, inside=True), x)
    ct("digest quick, together", lambda x: dp._digest(x, False, True)[0], x)
    ct("digest quick, separate", lambda x: dp._digest(x, False, False)[0], x)
    ct("digest masked, together", lambda x: dp._digest(x, True, True)[0], x)
    ct("lanes only", lambda x: dp.lanes(x), x)
    ct("4 plain stats", lambda x: jnp.stack([x.sum(), (x * x).sum(), x.min(), x.max()]), x)
    ct("digest quick, 1-D", lambda x: dp._digest(x.reshape(-1), False, True)[0], x)
    ct("digest quick, (rows,128)", lambda x: dp._digest(x.reshape(-1, 128), False, True)[0], x)
    ct("digest quick, (rows,1024)", lambda x: dp._digest(x.reshape(-1, 1024), False, True)[0], x)
x = jax.random.normal(jax.random.PRNGKey(0), (1024, 4096), jnp.float32)
ct("20 chained, returned", lambda x: chain(x, 20), x)
ct("20 chained, inside masked (as now)", lambda x: dp.packed(chain(x, 20), True, inside=True), x)
ct("20 chained, inside quick together", lambda x: jnp.stack([dp._digest(y, False, True)[0] for y in chain(x, 20)]), x)
ct("20 chained, stacked vmap masked", lambda x: jax.vmap(lambda y: dp._digest(y, True, True)[0])(jnp.stack(chain(x, 20))), x)
ct("20 chained, hash only", lambda x: dp.packed(chain(x, 20), False), x)
for k in (1, 2):
    s = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, "cache"], capture_output=True, text=True)
    print(f"cache run {k}: {time.perf_counter() - s:.1f} s\n{r.stdout}{r.stderr[-500:] if r.returncode else ''}", flush=True)
