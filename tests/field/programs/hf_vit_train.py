"""HF transformers 4.57.6 ViT trained 2 steps in both frameworks, as a user ports it: the tiny
config and converted weights of hf_vit.py, then `optax.adamw` with the weight-decay mask HF's
Flax examples build (no decay on biases and LayerNorm scales) against `torch.optim.AdamW` with
the matching two parameter groups, on one fixed batch (loss: mean of squares of the last
hidden state).

    python hf_vit_train.py [--bug none|decay_mask] [--steps N] [--dump F] [--eager]

--bug decay_mask: the Flax side forgets the mask (`optax.adamw(..., mask=None)`), so it decays
biases and LayerNorm scales that torch's no-decay group leaves alone. --dump F: both sides'
parameters after every step (numpy, each side in its own layout and names) into F.npz.
--eager: the Flax train step not jitted (value_and_grad's jvp and transpose run op by op).
"""
import argparse
import importlib.util
import os

import numpy as np

import jax
import jax.numpy as jnp
import optax
import torch
from flax import traverse_util

LR, WD = 1e-3, 0.1


def _vit():
    """hf_vit.py beside this file: the same tiny config, weights and batch."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_vit.py")
    spec = importlib.util.spec_from_file_location("hf_vit_program", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def decay_mask_fn(params):
    """HF's Flax examples (run_image_classification.py): no decay on biases and LayerNorm
    scales."""
    flat = traverse_util.flatten_dict(params)
    norms = ("layernorm", "layer_norm", "ln")
    mask = {p: p[-1] != "bias" and not (p[-1] == "scale" and any(n in "".join(p[-2:]).lower()
                                                                    for n in norms))
            for p in flat}
    return traverse_util.unflatten_dict(mask)


def torch_groups(model):
    """torch's no-decay group, HF's Trainer style: biases and LayerNorm weights."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("bias") or "layernorm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bug", choices=("none", "decay_mask"), default="none")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dump", default=None)
    ap.add_argument("--eager", action="store_true")
    args = ap.parse_args()
    vit = _vit()
    x = vit.batch()
    tmodel, state = vit.torch_model("eager")
    fmodel, params = vit.flax_model(state, "none")
    params = jax.tree_util.tree_map(jnp.asarray, params)
    dump = {}

    # Flax
    tx = optax.adamw(LR, weight_decay=WD,
                     mask=None if args.bug == "decay_mask" else decay_mask_fn)
    opt_state = tx.init(params)

    def loss_fn(p):
        h = fmodel(x, params=p).last_hidden_state
        return jnp.mean(h ** 2)

    def train_step(p, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    if not args.eager:
        train_step = jax.jit(train_step)

    p = params
    for step in range(args.steps):
        p, opt_state, loss = train_step(p, opt_state)
        print(f"flax step {step}: loss {float(loss):.9f}")
        for path, v in traverse_util.flatten_dict(p).items():
            dump[f"flax/{step}/{'/'.join(path)}"] = np.asarray(v)

    # torch
    for name, v in tmodel.named_parameters():
        dump[f"torch/init/{name}"] = v.detach().numpy().copy()
    opt = torch.optim.AdamW(torch_groups(tmodel), lr=LR, weight_decay=WD)
    tx_ = torch.from_numpy(x)
    for step in range(args.steps):
        opt.zero_grad()
        loss = (tmodel(pixel_values=tx_).last_hidden_state ** 2).mean()
        loss.backward()
        opt.step()
        print(f"torch step {step}: loss {loss.item():.9f}")
        for name, v in tmodel.named_parameters():
            dump[f"torch/{step}/{name}"] = v.detach().numpy().copy()

    if args.dump:
        np.savez(args.dump, **dump)


if __name__ == "__main__":
    main()
