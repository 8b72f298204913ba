"""Training a port in both frameworks, as a user checks one (the ViT, CLIP text and T5 encoder
training programs share it): `optax.adamw` with the weight-decay mask of HF's Flax examples
(no decay on biases and on LayerNorm/RMSNorm parameters) against `torch.optim.AdamW` with HF
Trainer's two parameter groups, the same steps on one fixed batch, one process.

Options every training program takes: --bug decay_mask (the Flax side forgets the mask,
`optax.adamw(..., mask=None)`, and decays the biases and norm parameters torch's no-decay
group leaves alone); --bug b2 (the Flax side's `b2=0.95`, torch's betas (0.9, 0.999)); --bug
eps (the Flax side's `eps=1e-6`, torch's 1e-8); --steps N; --dump F (both sides' parameters after every step and the
gradients and Adam's moments of every step, numpy, each side in its own layout and names, into F.npz); --eager
(the Flax train step not jitted: value_and_grad's jvp and transpose run op by op).
"""
import argparse

import numpy as np

import jax
import jax.numpy as jnp
import optax
import torch
from flax import traverse_util

LR, WD = 1e-3, 0.1
NORMS = ("layernorm", "layer_norm")


def decay_mask_fn(params):
    """HF's Flax examples (run_t5_mlm_flax.py, run_image_classification.py): no decay on
    biases and on the parameters of a module named as a norm."""
    flat = traverse_util.flatten_dict(params)
    mask = {p: p[-1] != "bias" and not any(n in p[-2].lower() for n in NORMS) for p in flat}
    return traverse_util.unflatten_dict(mask)


def torch_groups(model):
    """torch's no-decay group, HF Trainer's: biases and norm parameters."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        quiet = name.endswith("bias") or any(n in name.lower() for n in NORMS)
        (no_decay if quiet else decay).append(p)
    return [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]


def arguments(bn=None):
    """The options above; `bn` (choices, the first the default): a `--bn` option too."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bug", choices=("none", "decay_mask", "b2", "eps"), default="none")
    if bn:
        ap.add_argument("--bn", choices=bn, default=bn[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dump", default=None)
    ap.add_argument("--eager", action="store_true")
    return ap.parse_args()


def train_both(args, params, flax_hidden, tmodel, torch_hidden):
    """`args.steps` AdamW steps on each side, the loss the mean of squares of what
    flax_hidden(params) and torch_hidden(tmodel) return (the last hidden state)."""
    params = jax.tree_util.tree_map(jnp.asarray, params)
    dump = {}

    # Flax
    tx = optax.adamw(LR, b2=0.95 if args.bug == "b2" else 0.999,
                     eps=1e-6 if args.bug == "eps" else 1e-8, weight_decay=WD,
                     mask=None if args.bug == "decay_mask" else decay_mask_fn)
    opt_state = tx.init(params)

    def loss_fn(p):
        return jnp.mean(flax_hidden(p) ** 2)

    def train_step(p, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss, grads

    if not args.eager:
        train_step = jax.jit(train_step)

    p = params
    for step in range(args.steps):
        p, opt_state, loss, grads = train_step(p, opt_state)
        print(f"flax step {step}: loss {float(loss):.9f}")
        for path, v in traverse_util.flatten_dict(p).items():
            dump[f"flax/{step}/{'/'.join(path)}"] = np.asarray(v)
        for path, v in traverse_util.flatten_dict(grads).items():
            dump[f"flax_grad/{step}/{'/'.join(path)}"] = np.asarray(v)
        adam = opt_state[0]           # chain(scale_by_adam, decay, scale): Adam's state first
        for moment, tree in (("mu", adam.mu), ("nu", adam.nu)):
            for path, v in traverse_util.flatten_dict(tree).items():
                dump[f"flax_{moment}/{step}/{'/'.join(path)}"] = np.asarray(v)

    # torch
    for name, v in tmodel.named_parameters():
        dump[f"torch/init/{name}"] = v.detach().numpy().copy()
    opt = torch.optim.AdamW(torch_groups(tmodel), lr=LR, weight_decay=WD)
    for step in range(args.steps):
        opt.zero_grad()
        loss = (torch_hidden(tmodel) ** 2).mean()
        loss.backward()
        for name, v in tmodel.named_parameters():
            dump[f"torch_grad/{step}/{name}"] = v.grad.numpy().copy()
        opt.step()
        print(f"torch step {step}: loss {loss.item():.9f}")
        for name, v in tmodel.named_parameters():
            dump[f"torch/{step}/{name}"] = v.detach().numpy().copy()
            for moment, key in (("mu", "exp_avg"), ("nu", "exp_avg_sq")):
                dump[f"torch_{moment}/{step}/{name}"] = opt.state[v][key].numpy().copy()

    if args.dump:
        np.savez(args.dump, **dump)
