"""At `--level calls` the script's jitted functions keep JAX's C++ fast path
(capture/jax/fastjit.py): the calls are recorded around the script's own executable
instead of through JAX's Python dispatch path. The trace must be the one the hook writes,
row by row, and the script must not notice: same printed results, same errors, the
jitted function's attributes, a jitted method, its use as a decorator factory, static
arguments (left to the hook), donation, nested jits, optimizer steps counted for a
--steps window."""

import textwrap

import pytest

from .helpers import first_difference, record, run_plain

jax = pytest.importorskip("jax")
pytest.importorskip("optax")

SCRIPT = textwrap.dedent("""
    import functools, json, pickle, sys
    import jax, jax.numpy as jnp, optax

    opt = optax.adam(1e-2)

    @jax.jit
    def step(params, state, batch, *, scale=1.0):
        print("tracing step")             # as often as plain: .trace() and the call share
                                          # JAX's trace cache
        def loss_fn(p):
            return jnp.sum((p["w"] * batch["x"] + p["b"] - batch["y"]) ** 2) * scale
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    try:
        donating = jax.jit(donate_argnums=0)   # a decorator factory, where this JAX has one
    except TypeError:
        donating = functools.partial(jax.jit, donate_argnums=0)

    @donating
    def bump(x):
        return x + 1.0

    @jax.jit
    def inner(x):
        return jnp.sin(x)

    @jax.jit
    def outer(x):                         # a jit called inside another's trace
        return inner(x) * 2.0

    @functools.partial(jax.jit, static_argnums=1)   # static: left to the hook
    def power(x, n):
        return x ** n

    @jax.tree_util.register_pytree_node_class
    class Scaler:                         # a jitted method of a pytree class
        def __init__(self, s):
            self.s = s

        def tree_flatten(self):
            return (self.s,), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

        @jax.jit
        def apply(self, x):
            return x * self.s

    params = {"w": jnp.arange(4.0), "b": jnp.float32(0.5)}
    state = opt.init(params)
    batch = {"x": jnp.linspace(-1, 1, 4), "y": jnp.ones(4)}
    x = jnp.zeros(3)
    for i in range(6):
        params, state, loss = step(params, state, batch, scale=0.5)
        x = bump(x)
        y = outer(x) + power(x, 2) + power(x, 3) + Scaler(jnp.float32(i)).apply(x)
    lowered = step.lower(params, state, batch).as_text()[:20]   # attributes still there
    try:
        step(params, state)                                  # the script's own error
    except TypeError as exc:
        print("error:", type(exc).__name__)
    try:
        print("pickled:", type(pickle.loads(pickle.dumps(bump))).__name__)
    except Exception as exc:                                 # as JAX pickles it, or not
        print("pickle:", type(exc).__name__)
    print(json.dumps({"loss": float(loss), "w": [float(v) for v in params["w"]],
                      "y": [float(v) for v in y], "name": step.__name__,
                      "lowered": bool(lowered)}))
""")


@pytest.mark.parametrize("window", [(), ("--steps", "2:4")])
def test_calls_on_the_fast_path_write_the_hooks_trace(tmp_path, window):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    plain = run_plain(str(script))
    traces = {}
    for name, flag in (("hook", "0"), ("fast", "1")):
        out = tmp_path / f"{name}.h5"
        proc = record(str(script), out, env={"TRACEDIFF_JAX_FAST_JIT": flag},
                      extra=("--level", "calls", *window))
        assert proc.stdout == plain.stdout, proc.stderr[-2000:]
        traces[name] = out
    assert "error: TypeError" in plain.stdout and "tracing step" in plain.stdout
    assert first_difference(traces["hook"], traces["fast"]) is None

    import json

    import h5py

    with h5py.File(traces["fast"], "r") as f:
        jx = json.loads(f["manifest"][()])["frameworks"]["jax"]
        ops = [o.decode() if isinstance(o, bytes) else o for o in f["strings"][:]]
    assert jx["optimizer_steps"] == 6
    # step, bump, outer and apply ran on the fast path, in the window or not (power: the
    # hook)
    assert jx["calls_on_fast_path"]["calls"] == 24
    assert "jit:step" in ops and "jit:power" in ops
    with h5py.File(traces["hook"], "r") as f:
        assert "calls_on_fast_path" not in json.loads(f["manifest"][()])["frameworks"]["jax"]


def test_after_an_api_recording_the_scripts_jits_take_the_fast_path_again(tmp_path,
                                                                         monkeypatch):
    """A recorded call goes through JAX's Python dispatch (the hook), which leaves the
    jitted function without C++ fast-path data; where the script goes on after
    `tracediff.record` (the API), its jits must get that path back (`jax.clear_caches` at
    uninstall), or every later call pays Python's dispatch. `tracediff record` skips it:
    the process ends with the recording."""
    import tracediff
    from jax._src import pjit

    f = jax.jit(lambda x: x * 2)
    x = jax.numpy.ones(3)
    with tracediff.record(tmp_path / "t.h5", level="stats", frameworks=("jax",)):
        f(x)
        f(x)
    python_path = []
    impl = pjit._pjit_call_impl_python
    monkeypatch.setattr(pjit, "_pjit_call_impl_python",
                        lambda *a, **k: python_path.append(1) or impl(*a, **k))
    f(x)   # the first call after the recording fills the fast path's cache again
    python_path.clear()
    for _ in range(3):
        f(x)
    assert not python_path


TRANSFORMED = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp

    @jax.jit
    def f(w):
        return jnp.sum(jnp.tanh(w @ w))

    grad = jax.jit(jax.grad(f))               # wrappers of a jitted f, jitted again
    both = jax.jit(jax.value_and_grad(f))
    rows = jax.jit(jax.vmap(f))
    w = jnp.arange(64.0, dtype=jnp.float32).reshape(8, 8) / 64
    for _ in range(2):
        loss, g = both(w)
        out = [f(w), grad(w), g, rows(jnp.stack([w, 2 * w]))]
        print(json.dumps([[list(x.shape), float(jnp.sum(x))] for x in out]))
""")


def test_jit_of_a_transformed_jitted_function_runs_its_own_program(tmp_path):
    """`jax.grad(f)` of a jitted f copies f's attributes (`functools.wraps`); the
    `FastJit` of `jit(grad(f))` must still run and record grad(f)'s program, not f's: the
    script prints a plain run's [8, 8] gradients, and the trace is the hook's."""
    script = tmp_path / "transformed.py"
    script.write_text(TRANSFORMED)
    plain = run_plain(str(script))
    assert "[[], " in plain.stdout and "[[8, 8], " in plain.stdout
    traces = {}
    for name, flag in (("hook", "0"), ("fast", "1")):
        out = tmp_path / f"{name}.h5"
        proc = record(str(script), out, env={"TRACEDIFF_JAX_FAST_JIT": flag},
                      extra=("--level", "calls"))
        assert proc.stdout == plain.stdout, proc.stderr[-2000:]
        traces[name] = out
    assert first_difference(traces["hook"], traces["fast"]) is None
