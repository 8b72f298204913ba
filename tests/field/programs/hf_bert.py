"""HF transformers' BertModel (torch) and its FlaxBertModel port, random weights converted by
transformers' own converter, run forward on the same padded batch: a port as users check one.

    python hf_bert.py [--side both|torch|flax] [--attn eager|sdpa]
                      [--bug none|eps|gelu|qk|scale|pos|padpos]
                      [--weights FILE.npz]

`--side torch --weights W` saves the weights it ran with; `--side flax --weights W` loads
them (two scripts). Port bugs, each on one side: `eps` (Flax LayerNorm epsilon 1e-5
instead of BERT's 1e-12), `gelu` (Flax `gelu_new`, the tanh approximation, instead of
`gelu`), `qk` (the query and key parameters of Flax's layer 1 swapped in the conversion),
`scale` (torch layer 1 runs its own self-attention without the 1/sqrt(head size) scale),
`pos` (Flax given position ids shifted by 2, RoBERTa's offset after its padding index, where
BERT's start at 0; torch reads its own `position_ids` buffer), `padpos` (torch given
positions as RoBERTa computes them from the ids, after the padding index: `cumsum(ids != 0)
* (ids != 0) + 1`, torch ops; Flax, a port that forgot the offset, its own 0, 1, 2, ...).
"""
import argparse
import copy

import torch

import numpy as np

VOCAB, HIDDEN, LAYERS, HEADS, INTER, BATCH, LENGTH = 99, 64, 2, 4, 128, 2, 8


def config(attn="eager", **kw):
    from transformers import BertConfig
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                     num_attention_heads=HEADS, intermediate_size=INTER, max_position_embeddings=32,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kw)
    cfg._attn_implementation = attn
    return cfg


def batch():
    """Token ids and the attention mask: the second sequence is padded (3 pad tokens)."""
    rng = np.random.default_rng(1)
    ids = rng.integers(1, VOCAB, (BATCH, LENGTH)).astype(np.int64)
    mask = np.ones((BATCH, LENGTH), np.int64)
    ids[1, -3:], mask[1, -3:] = 0, 0
    return ids, mask


def weights(model):
    """The torch model's state dict as numpy, with non-trivial biases and LayerNorm gains
    (random init leaves them 0 and 1, which hides bugs)."""
    rng = np.random.default_rng(0)
    out = {}
    for k, v in model.state_dict().items():
        x = v.numpy().copy()
        if k.endswith(".bias"):
            x = rng.uniform(-0.1, 0.1, x.shape).astype(x.dtype)
        elif "LayerNorm.weight" in k:
            x = (1.0 + rng.uniform(-0.2, 0.2, x.shape)).astype(x.dtype)
        out[k] = x
    return out


class UnscaledSelfAttention(torch.nn.Module):
    """A port's own self-attention that forgets the 1/sqrt(head size) scale."""

    def __init__(self, orig, attn):
        super().__init__()
        self.query, self.key, self.value = orig.query, orig.key, orig.value
        self.heads, self.size, self.attn = orig.num_attention_heads, orig.attention_head_size, attn

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        b, n, _ = hidden_states.shape
        split = lambda t: t.view(b, n, self.heads, self.size).transpose(1, 2)  # noqa: E731
        q, k, v = (split(f(hidden_states)) for f in (self.query, self.key, self.value))
        if self.attn == "sdpa":
            ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask,
                                                                   scale=1.0)
        else:
            scores = q @ k.transpose(-1, -2)
            if attention_mask is not None:
                scores = scores + attention_mask
            ctx = torch.softmax(scores, dim=-1) @ v
        return ctx.transpose(1, 2).reshape(b, n, self.heads * self.size), None


def torch_model(attn, bug, state=None):
    """(BertModel in eval mode, its weights as numpy)."""
    from transformers import BertModel
    torch.manual_seed(0)
    model = BertModel(config(attn), add_pooling_layer=False).eval()
    state = weights(model) if state is None else state
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    if bug == "scale":
        layer = model.encoder.layer[1].attention
        layer.self = UnscaledSelfAttention(layer.self, attn)
    return model, state


def flax_model(state, bug):
    """(FlaxBertModel, params converted from the torch weights by transformers)."""
    from transformers import FlaxBertModel
    from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax
    kw = {"layer_norm_eps": 1e-5} if bug == "eps" else {"hidden_act": "gelu_new"} if bug == "gelu" \
        else {}
    model = FlaxBertModel(config(**kw), seed=0, _do_init=False, add_pooling_layer=False)
    shim = type("Shapes", (), {"params": model.params_shape_tree,
                               "base_model_prefix": model.base_model_prefix})()
    params = convert_pytorch_state_dict_to_flax(copy.deepcopy(state), shim)
    if bug == "qk":
        attn = params["encoder"]["layer"]["1"]["attention"]["self"]
        attn["query"], attn["key"] = attn["key"], attn["query"]
    return model, params


POSITION_OFFSET = 2           # `--bug pos`: RoBERTa's positions start after its padding index


def positions(ids, bug="none"):
    """The Flax side's position ids."""
    start = POSITION_OFFSET if bug == "pos" else 0
    return np.broadcast_to(np.arange(ids.shape[1]) + start, ids.shape).astype(np.int32)


def torch_positions(ids):
    """`--bug padpos`: RoBERTa's `create_position_ids_from_input_ids` (padding index 0 here,
    BERT's pad token), in torch."""
    keep = ids.ne(0).int()
    return (torch.cumsum(keep, dim=1).type_as(keep) * keep).long() + 1


def flax_args(ids, mask, bug="none"):
    """FlaxBertModule's positional arguments (for the test's capture_intermediates)."""
    return (ids.astype(np.int32), mask.astype(np.int32), np.zeros_like(ids, np.int32),
            positions(ids, bug), None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=("both", "torch", "flax"), default="both")
    ap.add_argument("--attn", choices=("eager", "sdpa"), default="eager")
    ap.add_argument("--bug", choices=("none", "eps", "gelu", "qk", "scale", "pos", "padpos"),
                    default="none")
    ap.add_argument("--weights")
    args = ap.parse_args()
    ids, mask = batch()
    state = None
    if args.side in ("both", "torch"):
        model, state = torch_model(args.attn, args.bug)
        with torch.no_grad():
            kw = {"position_ids": torch_positions(torch.from_numpy(ids))} \
                if args.bug == "padpos" else {}
            out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                        **kw)
        h = out.last_hidden_state.numpy()
        print(f"torch last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")
        if args.weights and args.side == "torch":
            np.savez(args.weights, **state)
    if args.side in ("both", "flax"):
        if state is None:
            with np.load(args.weights) as f:
                state = {k: f[k] for k in f.files}
        model, params = flax_model(state, args.bug)
        kw = {"position_ids": positions(ids, args.bug)} if args.bug == "pos" else {}
        out = model(ids.astype(np.int32), attention_mask=mask.astype(np.int32), params=params,
                    **kw)
        h = np.asarray(out.last_hidden_state)
        print(f"flax last_hidden_state checksum: {float(np.sum(h, dtype=np.float64)):.6f}")


if __name__ == "__main__":
    main()
