"""A small Flax NNX regression trained with nnx.Optimizer(Adam) under nnx.jit, plus an
evaluation under jax.jit with a static flag, as a user writes one."""

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


rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((64, 8)), jnp.float32)
y = jnp.asarray(rng.standard_normal((64, 1)), jnp.float32)
model = MLP(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
for _ in range(5):
    loss = train_step(model, optimizer, x, y)
graphdef, state = nnx.split(model)
pred = predict(graphdef, state, x)
print("loss", repr(float(loss)), "mse", repr(float(error(pred, y, squared=True))),
      "mae", repr(float(error(pred, y, squared=False))))
