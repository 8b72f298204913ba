"""A Flax GRU cell + Dense feeding a matrix exponential, trained with optax Adam under jit, in x64.

The situation of the cross-machine report this project started from: a deterministic
program whose final loss differs in the 9th digit between machines. Usage:
    python jax_gru_expm_adam.py [--steps N]
"""

import argparse

import jax

jax.config.update("jax_enable_x64", True)

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402


class Controller(nn.Module):
    hidden: int = 8
    outputs: int = 2

    @nn.compact
    def __call__(self, x, h):
        h, _ = nn.GRUCell(features=self.hidden)(h, x)
        return nn.Dense(self.outputs)(h), h


def evolution(theta, phi):
    """cos-like average of two unitary exponentials of a Pauli-Y rotation."""
    pauli_y = jnp.array([[0.0, -1.0j], [1.0j, 0.0]])
    generator = theta * pauli_y + phi / 3.0
    return 0.5 * (jax.scipy.linalg.expm(1j * generator) + jax.scipy.linalg.expm(-1j * generator))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    model = Controller()
    inputs = jnp.array([0.3, -2.0 * jnp.pi / 3.0])
    h0 = jnp.zeros((model.hidden,))
    params = model.init(jax.random.PRNGKey(42), inputs, h0)["params"]

    def loss_fn(p):
        out, _ = model.apply({"params": p}, inputs, h0)
        return jnp.real(jnp.trace(evolution(out[0], out[1])))

    optimizer = optax.adam(0.02)
    opt_state = optimizer.init(params)

    @jax.jit
    def train_step(p, state):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    for _ in range(args.steps):
        params, opt_state, loss = train_step(params, opt_state)
    print("final loss:", repr(float(loss_fn(params))))


if __name__ == "__main__":
    main()
