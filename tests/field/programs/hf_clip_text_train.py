"""HF transformers 4.57.6 CLIP text model trained 2 steps in both frameworks, as a user ports
it: the tiny config and converted weights of hf_clip_text.py, the Flax model given
`position_ids` of the batch's shape as CLIP's docs build them, then `optax.adamw` with the HF
Flax examples' decay mask against `torch.optim.AdamW` with HF Trainer's no-decay group (biases
and LayerNorm parameters), on one fixed batch (loss: mean of squares of the last hidden
state; adamw_both.py).

    python hf_clip_text_train.py [--bug none|decay_mask] [--steps N] [--dump F] [--eager]

--bug decay_mask: the Flax side forgets the mask and decays biases and LayerNorm scales.
"""
import numpy as np
import torch

import hf_clip_text
from adamw_both import arguments, train_both


def main():
    args = arguments()
    ids = hf_clip_text.batch()
    tmodel, state = hf_clip_text.torch_model("eager")
    fmodel, params = hf_clip_text.flax_model(state, "none")
    fids = ids.astype(np.int32)
    pos = hf_clip_text.flax_positions(ids, "batch", "none")
    tids = torch.from_numpy(ids)
    train_both(args, params,
               lambda p: fmodel(fids, position_ids=pos, params=p).last_hidden_state,
               tmodel, lambda m: m(input_ids=tids).last_hidden_state)


if __name__ == "__main__":
    main()
