"""How long `tracediff info` takes to find where a NaN came from in a long run (issue 68).

A small torch MLP trained with Adam for STEPS steps (default 10,000) whose batch at step
BAD (default 9,000) holds a negative value under a log: NaN from then on, in every
parameter. It is recorded at `--level stats`, then `tracediff info` is timed (the whole
process, and `find_nonfinite` alone in this process, after the trace is open). With
`--jax`, the same with a jitted JAX step (optax Adam). Prints one line per measurement.

    python benchmarks/nonfinite_long.py [--steps 10000] [--bad 9000] [--jax] [--keep DIR]
"""

import argparse
import os
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.child import run_timed  # noqa: E402

TORCH = textwrap.dedent('''
    import sys
    import torch
    steps, bad = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.rand(32, 8) + 0.5, torch.randn(32, 1)
    for step in range(steps):
        batch = x.clone()
        if step == bad:
            batch[5, 3] = -1.0                  # one corrupt sample
        opt.zero_grad()
        loss = ((model(torch.log(batch)) - y) ** 2).mean()
        loss.backward()
        opt.step()
    print(loss.item())
''')
JAX = textwrap.dedent('''
    import sys
    import jax, jax.numpy as jnp, optax
    steps, bad = int(sys.argv[1]), int(sys.argv[2])
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(k1, (8, 16)) * 0.3, "w2": jax.random.normal(k2, (16, 1)) * 0.3}
    x, y = jax.random.uniform(k3, (32, 8)) + 0.5, jnp.ones((32, 1))
    opt = optax.adam(1e-3)
    state = opt.init(params)
    def loss(p, batch):
        return jnp.mean((jnp.tanh(jnp.log(batch) @ p["w1"]) @ p["w2"] - y) ** 2)
    @jax.jit
    def step(p, s, batch):
        value, g = jax.value_and_grad(loss)(p, batch)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, value
    for i in range(steps):
        batch = x.at[5, 3].set(-1.0) if i == bad else x
        params, state, value = step(params, state, batch)
    print(float(value))
''')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--bad", type=int, default=9000)
    ap.add_argument("--jax", action="store_true")
    ap.add_argument("--keep", help="folder to keep the script and trace in")
    args = ap.parse_args()
    folder = args.keep or tempfile.mkdtemp()
    os.makedirs(folder, exist_ok=True)
    script = os.path.join(folder, "long_jax.py" if args.jax else "long_torch.py")
    with open(script, "w") as fh:
        fh.write(JAX if args.jax else TORCH)
    trace = os.path.join(folder, "long.h5")
    env = dict(os.environ)
    argv = [str(args.steps), str(args.bad)]
    _, plain, _ = run_timed([sys.executable, script, *argv], env)
    proc, rec, _ = run_timed([sys.executable, "-m", "tracediff", "record", "--level", "stats",
                              "-o", trace, script, *argv], env)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-2000:])
    info, wall, cpu = run_timed([sys.executable, "-m", "tracediff", "info", trace], env)
    first = next((line for line in info.stdout.splitlines() if "first non-finite" in line), "")

    from tracediff.diff.nonfinite import find_nonfinite
    from tracediff.trace.reader import Trace

    t0 = time.perf_counter()
    with Trace(trace) as t:
        t1 = time.perf_counter()
        nf = find_nonfinite(t)
        t2 = time.perf_counter()
        events, values = len(t), len(t.values)
    print(f"{'jax' if args.jax else 'torch'}: {args.steps} steps, NaN from step {args.bad}: "
          f"plain {plain:.1f} s, record --level stats {rec:.1f} s, trace "
          f"{os.path.getsize(trace) / 1e6:.1f} MB, {events:,} events, {values:,} values")
    print(f"  tracediff info (whole process): {wall:.2f} s wall, {cpu:.2f} s CPU")
    print(f"  open {t1 - t0:.2f} s, find_nonfinite {t2 - t1:.2f} s: {nf.origin.op} step "
          f"{nf.origin.step} ({nf.origin.phase}), {nf.events_nonfinite:,} events non-finite")
    print(f"  info's line: {first.strip()}")


if __name__ == "__main__":
    main()
