"""A DDP training script on CPU (gloo), launched by torchrun in `perfmagic run` tests."""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(os.environ.get("TRAIN_STEPS", "20"))
for _ in range(steps):
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    if rank == 1:
        time.sleep(0.01)  # rank 1 is the straggler: rank 0 waits for it in the collective
    loss = torch.tensor([1.0])
    dist.all_reduce(loss)
dist.destroy_process_group()
