"""A small Flax NNX regression trained with nnx.Optimizer(Adam) under nnx.jit, plus an
evaluation under jax.jit with a static flag, as a user writes one.

The options are what a user adds to test what made two runs differ (counterfactual runs):

  --save-init FILE     write the initial parameters (np.savez) after initialisation
  --init-from FILE     start from these initial parameters instead of the initialiser's
  --save-final FILE    write the parameters after the last step
"""

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.fc1 = nnx.Linear(8, 32, rngs=rngs)
        self.fc2 = nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x):
        return self.fc2(nnx.relu(self.fc1(x)))


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(m):
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


@functools.partial(jax.jit, static_argnames="squared")
def error(pred, y, squared):
    d = pred - y
    return jnp.mean(d * d) if squared else jnp.mean(jnp.abs(d))


@jax.jit
def predict(graphdef, state, x):
    return nnx.merge(graphdef, state)(x)


def params(model):
    return {f"{layer}.{name}": np.asarray(getattr(getattr(model, layer), name)[...])
            for layer in ("fc1", "fc2") for name in ("kernel", "bias")}


def load(model, path):
    with np.load(path) as saved:
        for key in saved.files:
            layer, name = key.split(".")
            getattr(getattr(model, layer), name)[...] = jnp.asarray(saved[key])


ap = argparse.ArgumentParser()
ap.add_argument("--save-init")
ap.add_argument("--init-from")
ap.add_argument("--save-final")
args = ap.parse_args()
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((64, 8)), jnp.float32)
y = jnp.asarray(rng.standard_normal((64, 1)), jnp.float32)
model = MLP(nnx.Rngs(0))
if args.init_from:
    load(model, args.init_from)
if args.save_init:
    np.savez(args.save_init, **params(model))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
for _ in range(5):
    loss = train_step(model, optimizer, x, y)
graphdef, state = nnx.split(model)
pred = predict(graphdef, state, x)
print("loss", repr(float(loss)), "mse", repr(float(error(pred, y, squared=True))),
      "mae", repr(float(error(pred, y, squared=False))))
if args.save_final:
    np.savez(args.save_final, **params(model))
