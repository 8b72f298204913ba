"""A plain DTensor program (torch.distributed.tensor): a linear layer whose weight is
sharded by rows over 2 ranks (`distribute_tensor(..., [Shard(0)])`), a replicated input,
two Adam steps. `--bad`: rank 1 adds 1e-3 to its local shard of the weight after step 0.

Printed for the test's truth (never read by tracediff): the loss, and after each step the
weight gathered in full (`full_tensor()`), on every rank."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False))
model[0].weight = torch.nn.Parameter(distribute_tensor(model[0].weight.detach(), mesh, [Shard(0)]))
x = distribute_tensor(torch.randn(6, 4), mesh, [Replicate()])
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(2):
    loss = (model(x) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if "--bad" in sys.argv and step == 0 and rank == 1:
        with torch.no_grad():
            model[0].weight.to_local().add_(1e-3)      # the fault
    print(f"rank {rank} step {step} loss {loss.full_tensor().item():.9e}", flush=True)
    full = model[0].weight.full_tensor()
    if rank == 0:
        print(f"step {step} param 0.weight {list(full.shape)} " +
              " ".join(f"{v:.9e}" for v in full.flatten().tolist()), flush=True)
dist.destroy_process_group()
