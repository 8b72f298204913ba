"""DDP with gloo on two ranks: rank 1's batch holds a negative value, its log makes NaN in
the forward, and the gradient all-reduce hands NaN to rank 0. Each rank prints whether its
own loss is finite before the all-reduce (the truth)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.rand(8, 4) + 0.5, torch.randn(8, 1)
if rank == 1:
    x[3, 2] = -1.0                      # a bad sample on rank 1
for step in range(2):
    opt.zero_grad()
    loss = ((model(torch.log(x)) - y) ** 2).mean()
    print(f"rank {rank} step {step} loss finite {bool(torch.isfinite(loss))}", flush=True)
    loss.backward()
    opt.step()
dist.destroy_process_group()
