"""HF transformers' LlamaModel (torch) and its FlaxLlamaModel port, random weights converted
by transformers' own converter, run forward on the same token ids: a port as users check
one. What BERT, GPT-2, ViT, CLIP and T5 do not have: rotary position embeddings (Flax
indexes a sin/cos table built in numpy, torch computes cos and sin per call), grouped-query
attention (2 key/value heads for 4 query heads), a gated SiLU MLP, RMSNorm.

    python hf_llama.py [--attn eager|sdpa] [--bug none|gelu|eps|oproj|rope]

Port bugs, on the Flax side: `gelu` (hidden_act "gelu" instead of Llama's "silu"), `eps`
(RMSNorm epsilon 1e-2 instead of 1e-6), `oproj` (layer 1's attention output kernel
transposed after the conversion). `rope`: the config's `rope_theta` is 500000, which torch
honours and FlaxLlama ignores (its rotary table hard-codes base 10000): the rotary tables
differ (a port bug as a user meets it: the Flax class, not the user's code).
"""
import argparse
import copy

import torch

import numpy as np

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, BATCH, LENGTH = 99, 32, 2, 4, 2, 37, 2, 8


def config(attn="eager", **kw):
    from transformers import LlamaConfig
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                      intermediate_size=INTER, max_position_embeddings=16,
                      **{"rms_norm_eps": 1e-6, **kw})
    cfg._attn_implementation = attn
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
        if "norm" in k and k.endswith(".weight"):
            x = (1.0 + rng.uniform(-0.2, 0.2, x.shape)).astype(x.dtype)
        elif "embed_tokens" in k:
            x = rng.normal(0, 1.0, x.shape).astype(x.dtype)
        out[k] = x
    return out


def torch_model(attn, bug="none"):
    from transformers import LlamaModel
    torch.manual_seed(0)
    model = LlamaModel(config(attn, **({"rope_theta": 500000.0} if bug == "rope" else {})))
    model = model.eval()
    state = weights(model)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    return model, state


def flax_model(state, bug):
    from transformers import FlaxLlamaModel
    from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax
    kw = {"hidden_act": "gelu"} if bug == "gelu" else {"rms_norm_eps": 1e-2} if bug == "eps" \
        else {}
    model = FlaxLlamaModel(config(**kw), seed=0, _do_init=False)
    shim = type("Shapes", (), {"params": model.params_shape_tree,
                               "base_model_prefix": model.base_model_prefix})()
    state = {k: v for k, v in state.items() if "rotary" not in k}
    params = convert_pytorch_state_dict_to_flax(copy.deepcopy(state), shim)
    if bug == "oproj":       # the attention output kernel transposed once more
        o = params["layers"]["1"]["self_attn"]["o_proj"]
        o["kernel"] = np.ascontiguousarray(np.asarray(o["kernel"]).T)
    return model, params


def flax_args(ids):
    """The Flax module's inputs: ids, attention mask, positions."""
    pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32)
    return ids.astype(np.int32), np.ones_like(ids, np.int32), pos


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", choices=("eager", "sdpa"), default="eager")
    ap.add_argument("--bug", choices=("none", "gelu", "eps", "oproj", "rope"), default="none")
    args = ap.parse_args()
    ids = batch()
    model, state = torch_model(args.attn, args.bug)
    with torch.no_grad():
        h = model(input_ids=torch.from_numpy(ids)).last_hidden_state.numpy()
    print(f"torch last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")
    fmodel, params = flax_model(state, args.bug)
    h = np.asarray(fmodel(ids.astype(np.int32), params=params).last_hidden_state)
    print(f"flax last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")


if __name__ == "__main__":
    main()
