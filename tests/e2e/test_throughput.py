"""Throughput as the frameworks log it: samples and tokens per second of training, from the batches."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import perfmagic


class Images(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 640

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.randn(32), i % 10


class Sentences(Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 640

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 100, (48,))
        return {"input_ids": ids, "attention_mask": torch.ones(48, dtype=torch.long), "labels": ids[:1]}


def train(loader: DataLoader[Any], model: torch.nn.Module, steps: int, eval_loader: Any = None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for k, batch in enumerate(loader):
        x = batch[0].float() if isinstance(batch, list) else batch["input_ids"].float()
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        if eval_loader is not None and k % 10 == 9:
            with torch.no_grad():  # an evaluation pass: its samples are no training samples
                for e in eval_loader:
                    model(e[0].float())
        if k + 1 == steps:
            break


@pytest.mark.parametrize(("dataset", "width", "tokens"), [(Images(), 32, False), (Sentences(), 48, True)])
def test_samples_and_tokens_per_second_follow_the_batches(
    dataset: Dataset[Any], width: int, tokens: bool
) -> None:
    loader = DataLoader(dataset, batch_size=16)
    evaluation = DataLoader(Images(), batch_size=64) if not tokens else None
    with perfmagic.profile(sample=False) as session:
        train(loader, torch.nn.Linear(width, 1), steps=30, eval_loader=evaluation)
    steps = session.report.to_dict()["steps"]
    per_s = steps["count"] / (steps["count"] / steps["per_s"])  # steps per second of steady step time
    assert steps["samples_per_s"] == pytest.approx(16 * per_s, rel=0.02)
    if tokens:
        assert steps["tokens_per_s"] == pytest.approx(16 * 48 * per_s, rel=0.02)
        assert "tokens/s" in str(session.report)
    else:
        assert steps["tokens_per_s"] is None
    assert "samples/s" in str(session.report)


def test_no_loader_no_throughput() -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with perfmagic.profile(sample=False) as session:
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    steps = session.report.to_dict()["steps"]
    assert steps["samples_per_s"] is None and steps["tokens_per_s"] is None
