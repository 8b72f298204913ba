"""HF transformers' T5EncoderModel (torch) and its FlaxT5EncoderModel port, random weights
converted by transformers' own converter, run forward on the same token ids: a port as users
check one. The config is T5 v1.1's kind (gated GELU feed-forward, `gelu_new`), made tiny.

    python hf_t5_encoder.py [--bug none|eps|buckets|act]

T5 has no SDPA attention in 4.57.6 (eager only). Its Flax model calls `jnp.clip(a_max=...)`,
a keyword jax 0.10 removed; the shim below restores it, as a user would. Port bugs, on the
Flax side: `eps` (RMSNorm epsilon 1e-3 instead of 1e-6), `buckets` (relative attention
`max_distance` 8 instead of 16: other position buckets), `act` (`dense_act_fn` "gelu", the
erf form, instead of T5 v1.1's tanh-approximated `gelu_new`).
"""
import argparse
import copy

import torch

import numpy as np

VOCAB, DMODEL, DKV, DFF, LAYERS, HEADS, BATCH, LENGTH = 99, 32, 8, 37, 2, 4, 2, 8
BUCKETS, MAX_DISTANCE = 8, 16


def clip_shim():
    """jax 0.10 dropped `jnp.clip`'s a_min/a_max keywords, which FlaxT5 still uses."""
    import jax.numpy as jnp
    if getattr(jnp.clip, "_t5_shim", False):
        return
    clip = jnp.clip

    def shimmed(x, min=None, max=None, a_min=None, a_max=None, **kw):
        return clip(x, a_min if min is None else min, a_max if max is None else max, **kw)
    shimmed._t5_shim = True
    jnp.clip = shimmed


def config(**kw):
    from transformers import T5Config
    act = kw.pop("dense_act_fn", None)
    cfg = T5Config(vocab_size=VOCAB, d_model=DMODEL, d_kv=DKV, d_ff=DFF, num_layers=LAYERS,
                   num_heads=HEADS, relative_attention_num_buckets=BUCKETS,
                   relative_attention_max_distance=kw.pop("max_distance", MAX_DISTANCE),
                   dropout_rate=0.0, feed_forward_proj="gated-gelu", **kw)
    if act:
        cfg.dense_act_fn = act
    cfg._attn_implementation = "eager"
    return cfg


def batch():
    rng = np.random.default_rng(1)
    return rng.integers(1, VOCAB - 1, (BATCH, LENGTH)).astype(np.int64)


def weights(model):
    """The torch model's state dict as numpy, RMSNorm gains made non-trivial."""
    rng = np.random.default_rng(0)
    out = {}
    for k, v in model.state_dict().items():
        x = v.numpy().copy()
        if "layer_norm" in k and k.endswith(".weight"):
            x = (1.0 + rng.uniform(-0.2, 0.2, x.shape)).astype(x.dtype)
        out[k] = x
    return out


def torch_model(attn="eager"):
    from transformers import T5EncoderModel
    torch.manual_seed(0)
    model = T5EncoderModel(config()).eval()
    state = weights(model)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return model, state


def flax_model(state, bug):
    from transformers import FlaxT5EncoderModel
    from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax
    clip_shim()
    kw = {"eps": {"layer_norm_epsilon": 1e-3}, "buckets": {"max_distance": 8},
          "act": {"dense_act_fn": "gelu"}}.get(bug, {})
    model = FlaxT5EncoderModel(config(**kw), seed=0, _do_init=False)
    shim = type("Shapes", (), {"params": model.params_shape_tree,
                               "base_model_prefix": model.base_model_prefix})()
    return model, convert_pytorch_state_dict_to_flax(copy.deepcopy(state), shim)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bug", choices=("none", "eps", "buckets", "act"), default="none")
    args = ap.parse_args()
    ids = batch()
    model, state = torch_model()
    with torch.no_grad():
        h = model(input_ids=torch.from_numpy(ids)).last_hidden_state.numpy()
    print(f"torch last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")
    fmodel, params = flax_model(state, args.bug)
    h = np.asarray(fmodel(ids.astype(np.int32), params=params).last_hidden_state)
    print(f"flax last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")


if __name__ == "__main__":
    main()
