"""One-shot check on a GPU machine (``make gpu-check``): everything that needs a real GPU.

1. ``pytest -m gpu``;
2. a real CUDA training loop (a small conv net on synthetic data, ~20 s) under
   ``perfmagic.profile()``;
3. the sampler's cost with real NVML (``benchmarks/sampler_cost.py``, 10 s);

then a summary: devices seen, which metrics NVML gave and which were N/A, sampler
cost, stage breakdown. Bounded: a watchdog ends it after 280 s whatever happens.
Exit status 0 only if the tests passed and the training run produced GPU metrics.
"""

from __future__ import annotations

import faulthandler
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 280
TRAIN_S = 20.0


def run_gpu_tests() -> bool:
    print("== pytest -m gpu", flush=True)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-m",
                "gpu",
                "-q",
                "-p",
                "no:cacheprovider",
                str(ROOT / "tests"),
            ],
            cwd=ROOT,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        print("pytest -m gpu: timed out after 120 s")
        return False
    return done.returncode == 0


def train(seconds: float) -> Any:
    """A small conv net on synthetic images, under perfmagic.profile(); returns the report."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import perfmagic

    data = TensorDataset(torch.randn(4096, 3, 64, 64), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=128, shuffle=True, num_workers=2, pin_memory=True)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    ).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    end = time.monotonic() + seconds
    with perfmagic.profile() as session:
        while time.monotonic() < end:
            for x, y in loader:
                x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
                loss = loss_fn(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if time.monotonic() >= end:
                    break
    return session


def summarize(session: Any, cost: dict[str, Any] | None) -> bool:
    report = session.report.to_dict()
    devices = report.get("devices") or []
    print("\n== devices seen")
    for d in devices:
        print(f"GPU {d['index']}: {d['name']}  ({(d['mem_total_bytes'] or 0) / 2**30:.0f} GiB)")
    if not devices:
        print("none:", report["warnings"])
    print("\n== metrics available vs N/A (during training)")
    for d in devices:
        scalars = {
            k: v for k, v in d.items() if k.endswith(("_mean", "_w", "_j", "_c", "_bytes", "_mhz", "_p95"))
        }
        print(
            f"GPU {d['index']} available: "
            + ", ".join(f"{k}={_fmt(v)}" for k, v in scalars.items() if v is not None)
        )
        print(f"GPU {d['index']} N/A: " + (", ".join(k for k, v in scalars.items() if v is None) or "-"))
        print(f"GPU {d['index']} driver samples: {d['driver_samples']}; throttle: {d['throttle_fraction']}")
        print(f"GPU {d['index']} processes: {d['processes']}")
    print("\n== sampler cost")
    sampler = session.timeline.meta.get("sampler") or {}
    wall = report.get("wall_s") or 0
    if sampler and wall:
        print(
            f"in the training run: {sampler['ticks']} ticks, {100 * sampler['busy_s'] / wall:.2f}% of the wall in polls"
        )
    if cost is not None:
        print(
            f"host+nvml at 10 Hz: {cost['cpu_pct_of_core']:.2f}% of one core ({cost['ms_per_tick']:.3f} ms/tick)"
        )
    print("\n== stage breakdown")
    steps = report.get("steps") or {}
    print(
        f"steps: {steps.get('count')}  median {_fmt(steps.get('median_s'))} s  bottleneck: {report.get('bottleneck')}"
    )
    for name, s in (report.get("stages") or {}).items():
        print(f"  {name:<12} {100 * s['fraction']:5.1f}%  median {1000 * s['median_s']:.2f} ms")
    print("\n== warnings")
    for w in report.get("warnings") or []:
        print(" -", w)
    return bool(devices) and devices[0]["util_mean"] is not None


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def main() -> int:
    faulthandler.dump_traceback_later(DEADLINE_S, exit=True)  # never hang the machine
    started = time.monotonic()
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU here; nothing to check")
        return 1
    tests_ok = run_gpu_tests()
    print(f"\n== training {TRAIN_S:.0f} s under perfmagic.profile()", flush=True)
    session = train(TRAIN_S)
    cost = None
    try:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from sampler_cost import measure

        from perfmagic.collect.host import HostSource
        from perfmagic.collect.nvml import NvmlSource

        cost = measure([NvmlSource(), HostSource()], seconds=10.0, hz=10.0)
    except Exception as e:  # the summary matters more than this number
        print(f"sampler cost: failed ({e!r})")
    metrics_ok = summarize(session, cost)
    print(
        f"\ngpu-check: tests {'passed' if tests_ok else 'FAILED'}, GPU metrics {'ok' if metrics_ok else 'MISSING'}"
    )
    print(f"took {time.monotonic() - started:.0f} s")
    return 0 if tests_ok and metrics_ok else 1


if __name__ == "__main__":
    sys.exit(main())
