"""HF transformers 4.57.6: a tiny random BERT in torch (`BertModel`) and its Flax port
(`FlaxBertModel`), weights converted by transformers' own converter, as a user writes it.

    python hf_capture_bert.py OUT_DIR [--side both|flax|torch] [--attn eager|sdpa] [--swap-qk]

Writes OUT_DIR/flax.npy and OUT_DIR/torch.npy (last_hidden_state of each side run); the
torch side alone also writes OUT_DIR/weights.npz, which the Flax side alone reads.
`--swap-qk`: a port bug, the Flax side gets layer 1's query and key parameters swapped.
"""
import argparse
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--side", choices=("both", "flax", "torch"), default="both")
    ap.add_argument("--attn", choices=("eager", "sdpa"), default="eager")
    ap.add_argument("--swap-qk", action="store_true")
    args = ap.parse_args()

    from transformers import BertConfig

    cfg = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=32)
    cfg._attn_implementation = args.attn
    ids = np.array([[5, 7, 9, 11, 13, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9, 10]], np.int64)
    mask = (ids != 0).astype(np.int64)
    weights = os.path.join(args.out, "weights.npz")

    if args.side in ("both", "torch"):
        import torch
        from transformers import BertModel

        torch.manual_seed(0)
        pt = BertModel(cfg).eval()
        with torch.no_grad():          # non-trivial biases and LayerNorm gains
            for name, p in pt.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.1)
                elif "LayerNorm.weight" in name:
                    p.normal_(1, 0.1)
                else:
                    p.normal_(0, 0.05)
            out = pt(torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
        np.save(os.path.join(args.out, "torch.npy"), out.numpy())
        state = pt.state_dict()
        if args.side == "torch":      # for the Flax script
            np.savez(weights, **{k: v.numpy() for k, v in state.items()})
    else:
        state = dict(np.load(weights))

    if args.side in ("both", "flax"):
        from transformers import FlaxBertModel
        from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax

        fx = FlaxBertModel(cfg, seed=0, _do_init=False)

        class Shapes:                # what the converter reads of a Flax model
            base_model_prefix = fx.base_model_prefix
            params = fx.params_shape_tree

        params = convert_pytorch_state_dict_to_flax(state, Shapes)
        params = params.get("params", params)
        if args.swap_qk:
            att = params["encoder"]["layer"]["1"]["attention"]["self"]
            att["query"], att["key"] = att["key"], att["query"]
        out = fx(ids, attention_mask=mask, params=params).last_hidden_state
        np.save(os.path.join(args.out, "flax.npy"), np.asarray(out))


if __name__ == "__main__":
    main()
