"""HF transformers 4.57.6 ViT trained 2 steps in both frameworks, as a user ports it: the tiny
config and converted weights of hf_vit.py, then `optax.adamw` with the weight-decay mask HF's
Flax examples build (no decay on biases and LayerNorm scales) against `torch.optim.AdamW` with
the matching two parameter groups, on one fixed batch (loss: mean of squares of the last
hidden state; adamw_both.py).

    python hf_vit_train.py [--bug none|decay_mask] [--steps N] [--dump F] [--eager]

--bug decay_mask: the Flax side forgets the mask (`optax.adamw(..., mask=None)`), so it decays
biases and LayerNorm scales that torch's no-decay group leaves alone. --dump F: both sides'
parameters after every step (numpy, each side in its own layout and names) into F.npz.
--eager: the Flax train step not jitted (value_and_grad's jvp and transpose run op by op).
"""
import torch

import hf_vit
from adamw_both import arguments, train_both


def main():
    args = arguments()
    x = hf_vit.batch()
    tmodel, state = hf_vit.torch_model("eager")
    fmodel, params = hf_vit.flax_model(state, "none")
    tx = torch.from_numpy(x)
    train_both(args, params, lambda p: fmodel(x, params=p).last_hidden_state,
               tmodel, lambda m: m(pixel_values=tx).last_hidden_state)


if __name__ == "__main__":
    main()
