"""HF transformers' ViTModel (torch) and its FlaxViTModel port, random weights converted by
transformers' own converter, run forward on the same images: a port as users check one.

    python hf_vit.py [--attn eager|sdpa] [--bug none|shift|eps]

Port bugs, on the Flax side: `shift` (the position embeddings shifted by one patch in the
converted parameters), `eps` (LayerNorm epsilon 1e-5 instead of ViT's 1e-12), `hw` (the
patch kernel's height and width swapped in the conversion).
"""
import argparse
import copy

import torch

import numpy as np

HIDDEN, LAYERS, HEADS, INTER, BATCH, IMAGE, PATCH = 32, 2, 4, 37, 2, 16, 4


def config(attn="eager", **kw):
    from transformers import ViTConfig
    cfg = ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                    intermediate_size=INTER, image_size=IMAGE, patch_size=PATCH,
                    num_channels=3, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, **kw)
    cfg._attn_implementation = attn
    return cfg


def batch():
    return np.random.default_rng(1).normal(size=(BATCH, 3, IMAGE, IMAGE)).astype(np.float32)


def weights(model):
    rng = np.random.default_rng(0)
    out = {}
    for k, v in model.state_dict().items():
        x = v.numpy().copy()
        if k.endswith(".bias") or k.endswith("cls_token") or k.endswith("position_embeddings"):
            x = rng.uniform(-0.1, 0.1, x.shape).astype(x.dtype)
        elif "layernorm" in k and k.endswith(".weight"):
            x = (1.0 + rng.uniform(-0.2, 0.2, x.shape)).astype(x.dtype)
        out[k] = x
    return out


def torch_model(attn):
    from transformers import ViTModel
    torch.manual_seed(0)
    model = ViTModel(config(attn), add_pooling_layer=False).eval()
    state = weights(model)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return model, state


def flax_model(state, bug):
    from transformers import FlaxViTModel
    from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax
    kw = {"layer_norm_eps": 1e-5} if bug == "eps" else {}
    model = FlaxViTModel(config(**kw), seed=0, _do_init=False, add_pooling_layer=False)
    shim = type("Shapes", (), {"params": model.params_shape_tree,
                               "base_model_prefix": model.base_model_prefix})()
    params = convert_pytorch_state_dict_to_flax(copy.deepcopy(state), shim)
    if bug == "hw":          # the patch kernel's H and W swapped in the conversion
        proj = params["embeddings"]["patch_embeddings"]["projection"]
        proj["kernel"] = np.ascontiguousarray(np.swapaxes(np.asarray(proj["kernel"]), 0, 1))
    if bug == "shift":
        emb = params["embeddings"]
        pos = np.asarray(emb["position_embeddings"])
        emb["position_embeddings"] = np.concatenate(
            [pos[:, :1], np.roll(pos[:, 1:], 1, axis=1)], axis=1)
    return model, params


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", choices=("eager", "sdpa"), default="eager")
    ap.add_argument("--bug", choices=("none", "shift", "eps", "hw"), default="none")
    args = ap.parse_args()
    x = batch()
    model, state = torch_model(args.attn)
    with torch.no_grad():
        h = model(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
    print(f"torch last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")
    fmodel, params = flax_model(state, args.bug)
    h = np.asarray(fmodel(x, params=params).last_hidden_state)
    print(f"flax last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")


if __name__ == "__main__":
    main()
