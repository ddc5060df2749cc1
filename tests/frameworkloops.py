"""Tiny training jobs in the frameworks people use, on the CPU: models built from configs, synthetic data.

Nothing is downloaded (``HF_HUB_OFFLINE``): a tiny BERT from a ``BertConfig``, Lightning's own demo
Transformer, an MLP under Accelerate. Each job can time the framework's own routines (the save
function, the host work in ``training_step``) so that tests compare perfmagic with the truth of the
same run.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos import Transformer
from torch.utils.data import DataLoader, Dataset, TensorDataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from perfmagic import Report

VOCAB = 100
warnings.filterwarnings("ignore", module="lightning")
warnings.filterwarnings("ignore", module="pytorch_lightning")


class Stopwatch:
    """Seconds and start times of the calls it timed."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []  # (perf_counter at start, seconds)

    def time(self, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.calls.append((start, time.perf_counter() - start))

    @property
    def total_s(self) -> float:
        return sum(s for _, s in self.calls)


# -- Hugging Face Trainer --------------------------------------------------------


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertForSequenceClassification(config)


class TokenDataset(Dataset[dict[str, torch.Tensor]]):
    """``n`` sequences of 16 token ids with a label; each sample takes ``delay_s`` to load."""

    def __init__(self, n: int, delay_s: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, 16), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(self.delay_s)
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class TimedTrainer(Trainer):
    """A Trainer that times its own checkpoint routine and evaluations (the truth the tests compare with)."""

    saves = Stopwatch()
    evaluations = Stopwatch()

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        self.saves.time(lambda: super(TimedTrainer, self)._save_checkpoint(model, trial))

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        return self.evaluations.time(lambda: super(TimedTrainer, self).evaluate(*args, **kwargs))


def hf_trainer(
    out: Path, *, steps: int = 20, delay_s: float = 0.0, eval_dataset: Dataset[Any] | None = None, **args: Any
) -> TimedTrainer:
    """A tiny-BERT Trainer on the CPU (``args``: more ``TrainingArguments``)."""
    TimedTrainer.saves, TimedTrainer.evaluations = Stopwatch(), Stopwatch()
    arguments = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=8,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        logging_steps=1000,
        save_strategy=args.pop("save_strategy", "no"),
        **args,
    )
    return TimedTrainer(
        model=tiny_bert(), args=arguments, train_dataset=TokenDataset(64, delay_s), eval_dataset=eval_dataset
    )


# -- Lightning --------------------------------------------------------------------


def token_loader(n: int = 64, batch_size: int = 2) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, VOCAB, (n, 16), generator=g)
    return DataLoader(TensorDataset(data, data), batch_size=batch_size)


class LanguageModel(L.LightningModule):
    """Lightning's demo Transformer; ``training_step`` does ``host_s`` of host work besides the model call."""

    def __init__(self, host_s: float = 0.0, validation_s: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = Transformer(vocab_size=VOCAB, ninp=32, nhead=2, nhid=64, nlayers=2)
        self.host_s = host_s
        self.validation_s = validation_s
        self.host = Stopwatch()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self.model(x, y)
        self.host.time(lambda: time.sleep(self.host_s))  # metrics, logging, a host computation
        return torch.nn.functional.nll_loss(out, y.view(-1))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        time.sleep(self.validation_s)
        self.log("val_loss", torch.nn.functional.nll_loss(self.model(x, y), y.view(-1)))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TwoOptimizers(L.LightningModule):
    """A GAN-shaped step: manual optimization, a discriminator and a generator step per batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
        self.discriminator = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> None:
        (real,) = batch
        d_opt, g_opt = self.optimizers()  # type: ignore[misc]
        fake = self.generator(torch.randn_like(real))
        d_loss = self.discriminator(fake.detach()).mean() - self.discriminator(real).mean()
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()
        g_loss = -self.discriminator(fake).mean()
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()

    def configure_optimizers(self) -> Any:
        return (
            torch.optim.SGD(self.discriminator.parameters(), lr=0.01),
            torch.optim.SGD(self.generator.parameters(), lr=0.01),
        )


class TimedModelCheckpoint(ModelCheckpoint):
    """Lightning's checkpoint callback, timing its own save (the truth the tests compare with)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.saves = Stopwatch()

    def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
        self.saves.time(lambda: super(TimedModelCheckpoint, self)._save_checkpoint(trainer, filepath))


def lightning_trainer(**kwargs: Any) -> L.Trainer:
    """A CPU Lightning Trainer without logger, progress bar or model summary (``kwargs``: more options)."""
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        **kwargs,
    }
    return L.Trainer(**options)


# -- what the tests read of a report -------------------------------------------------


def step_intervals(report: Report) -> list[tuple[float, float]]:
    table = report["step_table"]
    return list(zip(table["start"], table["end"], strict=True))


def evaluation_intervals(report: Report) -> list[tuple[float, float]]:
    assert report.timelines
    return [(m.t, m.t + m.data["seconds"]) for m in report.timelines[0].marks("evaluation")]


def overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds that intervals of ``a`` share with intervals of ``b``."""
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def stage_total_s(report: Report, stage: str) -> float:
    return float(sum(report["step_table"]["stages"].get(stage, ())))


def saves_in_steps_s(report: Report, label: str, measured: Stopwatch) -> float:
    """The measured seconds of the saves that fell inside a training step (a save after the last one
    belongs to no step). perfmagic's checkpoint marks come one per call of the routine, in call order,
    so the k-th mark with ``label`` places the k-th measured call."""
    assert report.analysis is not None
    marks = [c for c in report.analysis.config.checkpoints if c["fn"] == label]
    assert len(marks) == len(measured.calls), (len(marks), len(measured.calls))
    steps = step_intervals(report)
    inside = [
        seconds
        for mark, (_, seconds) in zip(marks, measured.calls, strict=True)
        if any(start <= mark["t"] < end for start, end in steps)
    ]
    # only a save after the last optimizer step may fall outside (a step ends at its optimizer step)
    assert len(inside) >= len(marks) - 1, (len(inside), len(marks))
    return sum(inside)
