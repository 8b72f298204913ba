"""HF transformers' GPT2Model (torch) and its FlaxGPT2Model port, random weights converted by
transformers' own converter, run forward on the same padded batch.

    python hf_gpt2.py [--attn eager|sdpa] [--bug none|gelu]

`gelu`: the Flax side runs `gelu` where GPT-2 uses `gelu_new` (the tanh approximation).
"""
import argparse
import copy

import torch

import numpy as np

BATCH, LENGTH = 2, 8


def config(attn="eager", **kw):
    from transformers import GPT2Config
    cfg = GPT2Config(vocab_size=99, n_embd=64, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, **kw)
    cfg._attn_implementation = attn
    return cfg


def batch():
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 99, (BATCH, LENGTH)).astype(np.int64)
    mask = np.ones((BATCH, LENGTH), np.int64)
    mask[1, -3:] = 0
    return ids, mask


def torch_model(attn, bug, state=None):
    from transformers import GPT2Model
    torch.manual_seed(0)
    model = GPT2Model(config(attn)).eval()
    if state is None:
        rng = np.random.default_rng(0)
        state = {}
        for k, v in model.state_dict().items():
            x = v.numpy().copy()
            if k.endswith(".bias") and x.dtype == np.float32:
                x = rng.uniform(-0.1, 0.1, x.shape).astype(x.dtype)
            elif "ln_" in k and k.endswith(".weight"):
                x = (1.0 + rng.uniform(-0.2, 0.2, x.shape)).astype(x.dtype)
            state[k] = x
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return model, state


def flax_model(state, bug):
    from transformers import FlaxGPT2Model
    from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax
    model = FlaxGPT2Model(config(**({"activation_function": "gelu"} if bug == "gelu" else {})),
                          seed=0, _do_init=False)
    shim = type("Shapes", (), {"params": model.params_shape_tree,
                               "base_model_prefix": model.base_model_prefix})()
    return model, convert_pytorch_state_dict_to_flax(copy.deepcopy(state), shim)


def flax_args(ids, mask):
    """FlaxGPT2Module's positional arguments (for the test's capture_intermediates)."""
    return (ids.astype(np.int32), mask.astype(np.int32),
            np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", choices=("eager", "sdpa"), default="eager")
    ap.add_argument("--bug", choices=("none", "gelu"), default="none")
    args = ap.parse_args()
    ids, mask = batch()
    model, state = torch_model(args.attn, args.bug)
    with torch.no_grad():
        h = model(input_ids=torch.from_numpy(ids),
                  attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    print(f"torch last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")
    fmodel, params = flax_model(state, args.bug)
    out = fmodel(ids.astype(np.int32), attention_mask=mask.astype(np.int32), params=params)
    print(f"flax last_hidden_state checksum: "
          f"{float(np.sum(np.asarray(out.last_hidden_state), dtype=np.float64)):.6f}")


if __name__ == "__main__":
    main()
