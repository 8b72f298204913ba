"""A user's GPT-2 training step (transformers, 2 layers, n_embd 64, random init, AdamW),
in float32, or with `--autocast` under torch.autocast("cpu", dtype=torch.bfloat16).
`--save-final FILE` writes the parameters after the step (torch.save)."""

import argparse
import contextlib

import torch
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--autocast", action="store_true")
p.add_argument("--save-final")
args = p.parse_args()

torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32,
                    attn_implementation="eager")
model = GPT2LMHeadModel(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
ctx = torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast else contextlib.nullcontext()
with ctx:
    out = model(ids, labels=ids)
out.loss.backward()
opt.step()
print("loss", out.loss.item())
if args.save_final:
    torch.save(model.state_dict(), args.save_final)
