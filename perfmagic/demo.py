"""``perfmagic demo``: a small training job that is input-bound on purpose.

Each sample is "decoded and augmented" on the CPU in the main process
(``num_workers=0``), the classic reason a GPU waits: the report should say so,
and say how many workers to use.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def build_job(samples: int, batch_size: int = 32) -> tuple[Any, Any, Any]:
    """Model, optimizer and DataLoader of the demo job."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    class SyntheticImages(Dataset[tuple[Any, Any]]):
        """64x64 RGB images made and augmented on the fly, like a JPEG pipeline."""

        def __len__(self) -> int:
            return samples

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            rng = np.random.default_rng(i)
            image = rng.random((3, 128, 128), dtype=np.float32)
            for _ in range(10):  # the costly augmentation: blur, jitter, crop
                image = (image + np.roll(image, 1, axis=1) + np.roll(image, 1, axis=2)) / 3.0
                image = image * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)
            crop = image[:, 32:96, 32:96]
            return torch.from_numpy(np.ascontiguousarray(crop)), int(i % 10)

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(SyntheticImages(), batch_size=batch_size, shuffle=True, num_workers=0)
    return model, optimizer, loader


def train(model: Any, optimizer: Any, loader: Any) -> None:
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    for images, labels in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()


def main(steps: int = 100, json_path: str | None = None) -> int:
    try:
        import torch
    except ImportError:
        print("perfmagic demo needs PyTorch: pip install torch", file=sys.stderr)
        return 1
    import perfmagic

    torch.manual_seed(0)
    # The model is tiny: one intra-op thread keeps its compute steady on a busy machine,
    # so the demo shows the data bottleneck it is about.
    torch.set_num_threads(1)
    model, optimizer, loader = build_job(samples=steps * 32)
    print(f"perfmagic demo: training a small CNN for {steps} steps on synthetic images...", flush=True)
    began = time.perf_counter()
    with perfmagic.profile() as session:
        train(model, optimizer, loader)
    print(f"done in {time.perf_counter() - began:.1f} s\n", flush=True)
    print(session.report)
    if json_path:
        session.report.to_json(json_path)
    return 0
