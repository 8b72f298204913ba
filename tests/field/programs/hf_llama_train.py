"""HF transformers 4.57.6 Llama trained 2 steps in both frameworks, as a user ports it: the
tiny config and converted weights of hf_llama.py (rotary embeddings, grouped-query attention,
gated SiLU MLP, RMSNorm), then `optax.adamw` with a weight-decay mask in the HF Flax examples'
spirit (no decay on biases and norm scales; Llama has no biases) against `torch.optim.AdamW`
with the matching two parameter groups, on one fixed batch of token ids (loss: mean of squares
of the last hidden state).

    python hf_llama_train.py [--bug none|decay_mask] [--steps N] [--dump F] [--eager]

--bug decay_mask: the Flax side forgets the mask (`optax.adamw(..., mask=None)`), so it decays
the RMSNorm scales that torch's no-decay group leaves alone. --dump F: both sides' parameters
after every step (numpy, each side in its own layout and names) into F.npz. --eager: the Flax
train step not jitted.
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


def _llama():
    """hf_llama.py beside this file: the same tiny config, weights and token ids."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_llama.py")
    spec = importlib.util.spec_from_file_location("hf_llama_program", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _no_decay(path):
    """Biases and norm scales (Llama's RMSNorms: input_layernorm, post_attention_layernorm,
    norm). HF's examples test for "layernorm"/"layer_norm"/"ln" only, which misses the final
    `norm`: here any module named *norm*."""
    return path[-1] == "bias" or "norm" in path[-2].lower()


def decay_mask_fn(params):
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict({p: not _no_decay(p) for p in flat})


def torch_groups(model):
    """torch's no-decay group, HF's Trainer style: biases and norm weights."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if _no_decay(tuple(name.split("."))) else decay).append(p)
    return [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bug", choices=("none", "decay_mask"), default="none")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dump", default=None)
    ap.add_argument("--eager", action="store_true")
    args = ap.parse_args()
    llama = _llama()
    ids = llama.batch()
    tmodel, state = llama.torch_model("eager")
    fmodel, params = llama.flax_model(state, "none")
    params = jax.tree_util.tree_map(jnp.asarray, params)
    fids = jnp.asarray(ids.astype(np.int32))
    dump = {}

    # Flax
    tx = optax.adamw(LR, weight_decay=WD,
                     mask=None if args.bug == "decay_mask" else decay_mask_fn)
    opt_state = tx.init(params)

    def loss_fn(p):
        h = fmodel(fids, params=p).last_hidden_state
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
    tmodel.train()
    for name, v in tmodel.named_parameters():
        dump[f"torch/init/{name}"] = v.detach().numpy().copy()
    opt = torch.optim.AdamW(torch_groups(tmodel), lr=LR, weight_decay=WD)
    tids = torch.from_numpy(ids)
    for step in range(args.steps):
        opt.zero_grad()
        loss = (tmodel(input_ids=tids).last_hidden_state ** 2).mean()
        loss.backward()
        opt.step()
        print(f"torch step {step}: loss {loss.item():.9f}")
        for name, v in tmodel.named_parameters():
            dump[f"torch/{step}/{name}"] = v.detach().numpy().copy()

    if args.dump:
        np.savez(args.dump, **dump)


if __name__ == "__main__":
    main()
