"""HF transformers' ResNetModel (torch, NCHW) and its FlaxResNetModel port (NHWC, BatchNorm
statistics in `batch_stats`), random weights and running statistics converted by
transformers' own converter, run forward in inference mode on the same images: a port as
users check one. Bottleneck layers (ResNet-50's): the converter names the basic layers'
convolutions "0" where FlaxResNetBasicLayerCollection expects "layer_0".

    python hf_resnet.py [--bug none|std|gelu|flip|affine|stride]

Port bugs, on the Flax side: `std` (BatchNorm's running variance converted as a standard
deviation, in every BatchNorm), `gelu` (hidden_act "gelu" instead of ResNet's "relu"),
`flip` (stage 1's 3x3 kernel flipped in H and W, as if torch's conv were a true
convolution), `affine` (stage 0's first BatchNorm with its scale and bias exchanged). On
the torch side: `stride` (the embedder's convolution with stride 3, not 2: every feature map
after it has another shape, [2, 12, 7, 7] against Flax's [2, 10, 10, 12]; the pooled output
keeps its shape).
"""
import argparse
import copy

import torch

import numpy as np

EMBED, HIDDEN, DEPTHS, BATCH, IMAGE = 12, [16, 32], [1, 1], 2, 20
STAGE0_BN = ("encoder", "stages", "0", "layers", "0", "layer", "0", "normalization")
STAGE1_CONV = ("encoder", "stages", "1", "layers", "0", "layer", "1", "convolution")


def config(**kw):
    from transformers import ResNetConfig
    return ResNetConfig(num_channels=3, embedding_size=EMBED, hidden_sizes=HIDDEN,
                        depths=DEPTHS, layer_type="bottleneck", **kw)


def batch():
    return np.random.default_rng(1).normal(size=(BATCH, 3, IMAGE, IMAGE)).astype(np.float32)


def weights(model):
    """The torch model's state dict as numpy, BatchNorm's affine and running statistics made
    non-trivial (a fresh model's are 1, 0, 0, 1)."""
    rng = np.random.default_rng(0)
    out = {}
    for k, v in model.state_dict().items():
        x = v.numpy().copy()
        if k.endswith(("normalization.bias", "running_mean")):
            x = rng.uniform(-0.2, 0.2, x.shape).astype(x.dtype)
        elif k.endswith(("normalization.weight", "running_var")):
            x = rng.uniform(0.5, 1.5, x.shape).astype(x.dtype)
        out[k] = x
    return out


def torch_model(bug="none"):
    from transformers import ResNetModel
    torch.manual_seed(0)
    model = ResNetModel(config()).eval()
    state = weights(model)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    if bug == "stride":      # the embedder's conv with another stride (torch reads it per call)
        model.embedder.embedder.convolution.stride = (3, 3)
    return model, state


def _at(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def flax_model(state, bug):
    """The Flax model and its variables {"params", "batch_stats"}."""
    from transformers import FlaxResNetModel
    from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax
    model = FlaxResNetModel(config(**({"hidden_act": "gelu"} if bug == "gelu" else {})),
                            seed=0, _do_init=False)
    shim = type("Shapes", (), {"params": model.params_shape_tree,
                               "base_model_prefix": model.base_model_prefix})()
    state = copy.deepcopy(state)
    if bug == "std":         # the running variance converted as a standard deviation
        state = {k: (np.sqrt(v) if k.endswith("running_var") else v) for k, v in state.items()}
    variables = convert_pytorch_state_dict_to_flax(state, shim)
    if bug == "flip":        # the kernel flipped: a convolution, not torch's cross-correlation
        conv = _at(variables["params"], STAGE1_CONV)
        conv["kernel"] = np.ascontiguousarray(np.asarray(conv["kernel"])[::-1, ::-1])
    if bug == "affine":      # BatchNorm's scale and bias exchanged
        bn = _at(variables["params"], STAGE0_BN)
        bn["scale"], bn["bias"] = bn["bias"], bn["scale"]
    return model, variables


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bug", choices=("none", "std", "gelu", "flip", "affine", "stride"),
                    default="none")
    args = ap.parse_args()
    x = batch()
    model, state = torch_model(args.bug)
    with torch.no_grad():
        h = model(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
    print(f"torch last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")
    fmodel, variables = flax_model(state, args.bug)
    h = np.asarray(fmodel(x, params=variables).last_hidden_state)
    print(f"flax last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")


if __name__ == "__main__":
    main()
