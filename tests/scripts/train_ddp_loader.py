"""A DDP job on CPU (gloo) fed by a DataLoader, for `perfmagic run` tests of DDP's communication.

Environment: ``SLOW_RANK`` (default: none; ``all``: every rank) waits ``SLOW_S`` (default 0.04) per
batch in its dataset, as a rank on slow storage would; ``TRAIN_STEPS`` (default 30); ``USER_HOOK=1`` registers the user's own
comm hook (the default all-reduce, counted) before training; ``FSDP=1`` wraps the model in FSDP instead.
Each rank writes what it saw to ``$RESULT_DIR/rank<N>.json`` when that is set, its own median batch
fetch (``data_s``) among it: what a busy machine made of the waits, measured in the same run.
"""

import json
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

# the example notebook's dataset: synthetic samples behind a wait per batch
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "example_notebooks"))
from ddp_workers import BATCH, Samples

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
slow = os.environ.get("SLOW_RANK")
wait = float(os.environ.get("SLOW_S", "0.04")) if slow in ("all", str(rank)) else 0.0
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
hook_calls = 0
if os.environ.get("FSDP") == "1":
    from torch.distributed.fsdp import FullyShardedDataParallel

    model: torch.nn.Module = FullyShardedDataParallel(net, device_id=torch.device("cpu"))
else:
    model = torch.nn.parallel.DistributedDataParallel(net)
    if os.environ.get("USER_HOOK") == "1":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counted(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            global hook_calls
            hook_calls += 1
            return allreduce_hook(state, bucket)  # type: ignore[arg-type]

        model.register_comm_hook(None, counted)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Samples(wait), batch_size=BATCH)
steps = int(os.environ.get("TRAIN_STEPS", "30"))
fetch_s: list[float] = []


def timed(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches, each fetch's seconds in ``fetch_s``."""
    it = iter(batches)
    while True:
        begin = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        fetch_s.append(time.perf_counter() - begin)
        yield batch


for step, (x, y) in enumerate(timed(loader)):
    if step == steps:
        break
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
# both ranks done before either tears gloo down (torch 2.13: a rank that leaves first can abort the other)
dist.barrier()
if os.environ.get("RESULT_DIR"):
    with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.json"), "w") as f:
        seen = {"rank": rank, "hook_calls": hook_calls, "node_rank": os.environ.get("GROUP_RANK")}
        json.dump({**seen, "data_s": statistics.median(fetch_s[1:])}, f)
del model, optimizer
dist.destroy_process_group()
