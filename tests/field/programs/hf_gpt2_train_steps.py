"""A user's GPT-2 (transformers' GPT2LMHeadModel, a small config, random init from a seed)
trained 3 AdamW steps on random tokens, as a user writes one. Prints the losses.

The options are what a user adds to test what made two runs differ (counterfactual runs):

  --save-init FILE     write the initial parameters (torch.save) after initialisation
  --init-from FILE     start from these initial parameters instead of the initialiser's
  --save-final FILE    write the parameters after the last step
"""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--save-init")
    ap.add_argument("--init-from")
    ap.add_argument("--save-final")
    args = ap.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        attn_implementation="eager")
    model = GPT2LMHeadModel(config)
    if args.init_from:
        model.load_state_dict(torch.load(args.init_from))
    if args.save_init:
        torch.save(model.state_dict(), args.save_init)
    model.train()
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    for step in range(args.steps):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.8f}")
    if args.save_final:
        torch.save(model.state_dict(), args.save_final)


if __name__ == "__main__":
    main()
