"""HF transformers' CLIPTextModel (torch) and its FlaxCLIPTextModel port, random weights
converted by transformers' own converter, run forward on the same token ids: a port checked
the way CLIP's documentation calls each model.

    python hf_clip_text.py [--attn eager|sdpa] [--positions batch|none] [--bug none|gelu|pos|eps]

`--positions batch`: the Flax model is given `position_ids` of the batch's shape [2, 8], as
its docstring example builds them (`jnp.broadcast_to(jnp.arange(n), ids.shape)`); torch reads
its own [1, 8] buffer. `--positions none`: Flax builds its own. Port bugs, on the Flax side:
`gelu` (hidden_act "gelu" instead of CLIP's "quick_gelu"), `pos` (positions off by one),
`eps` (LayerNorm epsilon 1e-12 instead of CLIP's 1e-5).
"""
import argparse
import copy

import torch

import numpy as np

VOCAB, HIDDEN, LAYERS, HEADS, INTER, BATCH, LENGTH = 99, 32, 2, 4, 37, 2, 8


def config(attn="eager", **kw):
    from transformers import CLIPTextConfig
    cfg = CLIPTextConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, intermediate_size=INTER,
                         max_position_embeddings=16, projection_dim=16, **kw)
    cfg._attn_implementation = attn
    return cfg


def batch():
    rng = np.random.default_rng(1)
    return rng.integers(1, VOCAB - 1, (BATCH, LENGTH)).astype(np.int64)


def weights(model):
    """The torch model's state dict as numpy, biases and LayerNorm gains made non-trivial."""
    rng = np.random.default_rng(0)
    out = {}
    for k, v in model.state_dict().items():
        x = v.numpy().copy()
        if k.endswith(".bias"):
            x = rng.uniform(-0.1, 0.1, x.shape).astype(x.dtype)
        elif "layer_norm" in k and k.endswith(".weight"):
            x = (1.0 + rng.uniform(-0.2, 0.2, x.shape)).astype(x.dtype)
        out[k] = x
    return out


def torch_model(attn):
    from transformers import CLIPTextModel
    torch.manual_seed(0)
    model = CLIPTextModel(config(attn)).eval()
    state = weights(model)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    return model, state


def flax_model(state, bug):
    from transformers import FlaxCLIPTextModel
    from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax
    kw = {"hidden_act": "gelu"} if bug == "gelu" else {"layer_norm_eps": 1e-12} if bug == "eps" \
        else {}
    model = FlaxCLIPTextModel(config(**kw), seed=0, _do_init=False)
    shim = type("Shapes", (), {"params": model.params_shape_tree,
                               "base_model_prefix": model.base_model_prefix})()
    state = {k: v for k, v in state.items() if not k.endswith("position_ids")}
    return model, convert_pytorch_state_dict_to_flax(copy.deepcopy(state), shim)


def flax_positions(ids, positions, bug):
    """The position_ids the Flax call is given (None: the model builds its own)."""
    if positions == "none" and bug != "pos":
        return None
    pos = np.arange(ids.shape[1]) + (1 if bug == "pos" else 0)
    return np.broadcast_to(pos, ids.shape).astype(np.int32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", choices=("eager", "sdpa"), default="eager")
    ap.add_argument("--positions", choices=("batch", "none"), default="batch")
    ap.add_argument("--bug", choices=("none", "gelu", "pos", "eps"), default="none")
    args = ap.parse_args()
    ids = batch()
    model, state = torch_model(args.attn)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids))
    h = out.last_hidden_state.numpy()
    print(f"torch last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")
    fmodel, params = flax_model(state, args.bug)
    pos = flax_positions(ids, args.positions, args.bug)
    fout = fmodel(ids.astype(np.int32), position_ids=pos, params=params)
    h = np.asarray(fout.last_hidden_state)
    print(f"flax last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")


if __name__ == "__main__":
    main()
