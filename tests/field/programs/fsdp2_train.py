"""FSDP2 (`torch.distributed.fsdp.fully_shard`) as its tutorial writes it: a small MLP,
each Linear and the root sharded over the ranks, two Adam steps. `--bad`: rank 1 adds
1e-3 to its local shard of the last layer's weight after step 0.

Printed for the test's truth (never read by tracediff): every rank's loss, and after each
step every parameter gathered in full (`full_tensor()`)."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
fault = (sys.argv[sys.argv.index("--bad") + 1] if sys.argv.index("--bad") + 1 < len(sys.argv)
         else "add") if "--bad" in sys.argv else None
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1 + rank))
y = torch.randn(6, 4, generator=torch.Generator().manual_seed(100 + rank))
for step in range(2):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if fault == "add" and step == 0 and rank == 1:
        with torch.no_grad():
            model[2].weight.to_local().add_(1e-3)      # the fault
    if fault == "mul" and step == 0 and rank == 1:
        with torch.no_grad():
            model[2].weight.to_local().mul_(1.001)     # the mul fault
        print(f"fault rank {rank} param 2.weight step {step} op mul_", flush=True)
    print(f"rank {rank} step {step} loss {loss.item():.9e}", flush=True)
    for name, p in model.named_parameters():
        full = p.full_tensor()
        if rank == 0:
            print(f"step {step} param {name} {list(full.shape)} " +
                  " ".join(f"{v:.9e}" for v in full.flatten().tolist()), flush=True)
dist.destroy_process_group()
