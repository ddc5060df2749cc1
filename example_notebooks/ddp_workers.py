"""The training function of ``multi_rank.ipynb``'s ranks: a small DDP job on the CPU over gloo.

``torch.multiprocessing.spawn`` pickles the function by name, so it lives in a module the
workers can import, not in the notebook.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

BATCH = 16


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic samples; ``wait`` seconds per batch stand for slow storage."""

    def __init__(self, wait: float) -> None:
        self.wait = wait

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.wait:
            time.sleep(self.wait / BATCH)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randn(1, generator=g)


def train(rank: int, world_size: int, slow_rank: int | None, steps: int = 30) -> None:
    """One rank: ``steps`` DDP steps; the rank ``slow_rank`` waits 40 ms per batch for its data."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    model = torch.nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(0.04 if rank == slow_rank else 0.0), batch_size=BATCH)
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    # every rank done before any tears gloo down (torch 2.13: one that leaves first can abort the others)
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()
