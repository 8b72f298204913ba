"""HF transformers 4.57.6 BERT trained for a few steps in both frameworks, as a user ports it:
a random torch `BertModel`, its weights converted into `FlaxBertModel` by transformers' own
converter, then `optax.adamw` against `torch.optim.AdamW` with the same hyper-parameters on
the same batch (loss: mean of squares of the last hidden state over the tokens that are not padding).

    python hf_bert_train.py [--attn sdpa|eager] [--bug none|decay_mask] [--steps N] [--dump F]
                            [--side both|flax|torch] [--grads]

--bug decay_mask: the HF Flax examples' weight-decay mask (no decay on biases and LayerNorm
scales) on the Flax side only. --dump F: the parameters of both sides after every step
(numpy, each side in its own layout and names) into F.npz. --side flax / torch: one
framework's training only (two scripts: record each with --framework jax / torch). --grads:
the dump holds both sides' gradients of every step too (`flax_grad/`, `torch_grad/`).
"""
import argparse
import types

import numpy as np
from transformers import BertConfig, BertModel, FlaxBertModel
from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax

import jax
import jax.numpy as jnp
import optax
import torch
from flax import traverse_util

LR, WD = 1e-3, 0.1


def decay_mask_fn(params):
    """The HF Flax examples' mask (run_mlm_flax.py): no decay on biases and LayerNorm scales."""
    flat = traverse_util.flatten_dict(params)
    mask = {p: p[-1] != "bias" and p[-2:] != ("LayerNorm", "scale") for p in flat}
    return traverse_util.unflatten_dict(mask)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    ap.add_argument("--bug", choices=("none", "decay_mask"), default="none")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dump", default=None)
    ap.add_argument("--side", choices=("both", "flax", "torch"), default="both")
    ap.add_argument("--grads", action="store_true")
    args = ap.parse_args()

    config = BertConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config._attn_implementation = args.attn
    torch.manual_seed(0)
    tmodel = BertModel(config, add_pooling_layer=False)
    with torch.no_grad():     # non-trivial biases and LayerNorm gains (random init: 0 and 1)
        g = torch.Generator().manual_seed(1)
        for name, p in tmodel.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))

    fmodel = FlaxBertModel(config, seed=0, _do_init=False, add_pooling_layer=False)
    shapes = types.SimpleNamespace(params=fmodel.params_shape_tree,
                                   base_model_prefix=fmodel.base_model_prefix)
    params = convert_pytorch_state_dict_to_flax(tmodel.state_dict(), shapes)
    params = jax.tree_util.tree_map(jnp.asarray, params)

    rng = np.random.default_rng(0)
    ids = rng.integers(1, config.vocab_size, (2, 12)).astype(np.int64)
    mask = np.ones((2, 12), np.int64)
    mask[1, 9:] = 0
    ids[1, 9:] = 0
    dump = {}

    # Flax
    tx = optax.adamw(LR, weight_decay=WD,
                     mask=decay_mask_fn if args.bug == "decay_mask" else None)
    opt_state = tx.init(params)

    def loss_fn(p):
        h = fmodel(ids, attention_mask=mask, params=p).last_hidden_state
        return jnp.sum(h ** 2 * mask[:, :, None]) / (mask.sum() * h.shape[-1])

    @jax.jit
    def train_step(p, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss, grads if args.grads else None

    p = params
    for step in range(args.steps if args.side != "torch" else 0):
        p, opt_state, loss, grads = train_step(p, opt_state)
        print(f"flax step {step}: loss {float(loss):.9f}")
        for path, v in traverse_util.flatten_dict(p).items():
            dump[f"flax/{step}/{'/'.join(path)}"] = np.asarray(v)
        for path, v in traverse_util.flatten_dict(grads).items() if grads is not None else ():
            dump[f"flax_grad/{step}/{'/'.join(path)}"] = np.asarray(v)

    # torch
    for name, v in tmodel.named_parameters():
        dump[f"torch/init/{name}"] = v.detach().numpy().copy()
    opt = torch.optim.AdamW(tmodel.parameters(), lr=LR, weight_decay=WD)
    tids, tmask = torch.from_numpy(ids), torch.from_numpy(mask)
    for step in range(args.steps if args.side != "flax" else 0):
        opt.zero_grad()
        h = tmodel(tids, attention_mask=tmask).last_hidden_state
        loss = (h ** 2 * tmask[:, :, None]).sum() / (tmask.sum() * h.shape[-1])
        loss.backward()
        for name, v in tmodel.named_parameters() if args.grads else ():
            dump[f"torch_grad/{step}/{name}"] = v.grad.numpy().copy()
        opt.step()
        print(f"torch step {step}: loss {loss.item():.9f}")
        for name, v in tmodel.named_parameters():
            dump[f"torch/{step}/{name}"] = v.detach().numpy().copy()

    if args.dump:
        np.savez(args.dump, **dump)


if __name__ == "__main__":
    main()
