"""Record ``h200_train.json.gz``: a small real training job's torch.profiler trace on a CUDA GPU.

What it holds, for the GPU-timeline tests: bf16 matrix products under autocast (tensor-core
kernels) beside fp32 elementwise ones; each step's batch copied from pageable memory
(``x``) and from pinned memory (``y``, non-blocking); a ``loss.item()`` (a device-to-host
copy and a stream sync) and a ``torch.cuda.synchronize()`` per step; a burst of tiny
kernels (launch-bound time); CUDA memory events (``profile_memory=True``).

Run on a machine with a CUDA GPU: ``python tests/data/record_h200_trace.py OUT.json.gz``.
"""

from __future__ import annotations

import gzip
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def main(out: Path) -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(
        device
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(torch.randn(512, 1024), torch.randn(512, 1024).pin_memory()) for _ in range(8)]
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "trace.json"
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            schedule=schedule(wait=1, warmup=1, active=5, repeat=1),
            profile_memory=True,
            on_trace_ready=lambda p: p.export_chrome_trace(str(plain)),
        ) as prof:
            for x_host, y_host in batches:
                x = x_host.to(device)  # pageable: a blocking copy
                y = y_host.to(device, non_blocking=True)  # pinned: asynchronous
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = torch.nn.functional.mse_loss(model(x).float(), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                z = y[:1, :8]
                for _ in range(64):  # tiny kernels the host launches slower than the GPU runs them
                    z = z * 1.0001 + 1e-6
                print(f"loss {loss.item():.4f} {float(z.sum()):.3f}")  # syncs
                torch.cuda.synchronize()
                prof.step()
        with plain.open("rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
