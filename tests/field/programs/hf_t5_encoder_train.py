"""HF transformers 4.57.6 T5 encoder trained 2 steps in both frameworks, as a user ports it:
the tiny T5 v1.1-style config and converted weights of hf_t5_encoder.py (with its `jnp.clip`
shim), then `optax.adamw` with the HF Flax examples' decay mask (run_t5_mlm_flax.py: no decay
on the RMSNorm weights; T5 has no biases) against `torch.optim.AdamW` with HF Trainer's
no-decay group, on one fixed batch (loss: mean of squares of the last hidden state;
adamw_both.py).

    python hf_t5_encoder_train.py [--bug none|decay_mask] [--steps N] [--dump F] [--eager]

--bug decay_mask: the Flax side forgets the mask and decays the RMSNorm weights.
"""
import numpy as np
import torch

import hf_t5_encoder
from adamw_both import arguments, train_both


def main():
    args = arguments()
    ids = hf_t5_encoder.batch()
    tmodel, state = hf_t5_encoder.torch_model()
    fmodel, params = hf_t5_encoder.flax_model(state, "none")
    fids = ids.astype(np.int32)
    tids = torch.from_numpy(ids)
    train_both(args, params, lambda p: fmodel(fids, params=p).last_hidden_state,
               tmodel, lambda m: m(input_ids=tids).last_hidden_state)


if __name__ == "__main__":
    main()
