"""A tiny GPT-2 (transformers, random weights) trained a few steps with AdamW: the kind of
script whose trace is too big to attach (benchmarks/trace_size.py)."""
import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64)
model = GPT2LMHeadModel(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, config.vocab_size, (4, 32))
for _ in range(args.steps):
    loss = model(tokens, labels=tokens).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
print(repr(loss.item()))
