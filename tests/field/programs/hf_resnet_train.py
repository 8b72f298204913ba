"""HF transformers 4.57.6 ResNet (bottleneck layers) trained 2 steps in both frameworks, as a
user ports it: the tiny config, converted weights and running statistics of hf_resnet.py,
BatchNorm in inference mode (`--bn eval`, the default: the converted running statistics,
torch `model.eval()`, Flax `train=False`) or in training mode (`--bn train`: torch
`model.train()`, Flax `train=True` with `batch_stats` mutable, each normalising by the
batch's statistics), then `optax.adamw` with
the HF Flax examples' decay mask against `torch.optim.AdamW` with HF Trainer's no-decay group
(biases; BatchNorm scales decay on both sides, as HF's mask and Trainer do), on one fixed
batch (loss: mean of squares of the last hidden state; adamw_both.py).

    python hf_resnet_train.py [--bug none|decay_mask] [--bn eval|train] [--steps N] [--dump F]

In training mode the running statistics each side updates are buffers, not parameters (and
differ by design: torch's running variance is unbiased, Flax's biased); the loss reads the
batch's.
--bug decay_mask: the Flax side forgets the mask and decays the BatchNorm biases.
"""
import torch

import hf_resnet
from adamw_both import arguments, train_both


def main():
    args = arguments(bn=("eval", "train"))
    x = hf_resnet.batch()
    tmodel, state = hf_resnet.torch_model()
    train = args.bn == "train"
    tmodel.train(train)
    fmodel, variables = hf_resnet.flax_model(state, "none")
    stats = variables["batch_stats"]
    tx = torch.from_numpy(x)

    def flax_hidden(p):
        out = fmodel(x, params={"params": p, "batch_stats": stats}, train=train)
        return (out[0] if train else out).last_hidden_state

    train_both(args, variables["params"], flax_hidden,
               tmodel, lambda m: m(pixel_values=tx).last_hidden_state)


if __name__ == "__main__":
    main()
