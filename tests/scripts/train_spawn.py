"""DDP ranks started by torch.multiprocessing.spawn (gloo, CPU), for `perfmagic run` tests."""

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank: int, world_size: int) -> None:
    # a peer that died (its port taken between the pick and the bind) fails this one within a minute,
    # not gloo's default half hour, which would leave the test's processes behind
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        optimizer.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
    # both ranks done before either tears gloo down: one that leaves first can make the other's teardown
    # abort ("terminate called without an active exception", torch 2.13) or join a thread forever
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mp.spawn(train, args=(2,), nprocs=2)
