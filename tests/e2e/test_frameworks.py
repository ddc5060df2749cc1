"""The loops people actually run: Hugging Face Trainer, Lightning and Accelerate, for real, on the CPU.

Each test compares perfmagic with what the framework itself says or measures in the same run: its
own global step, its own save routine timed by a subclass, the host work ``training_step`` timed
inside itself. Ratios and same-run truths, so that a loaded machine moves both sides alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("transformers")
pytest.importorskip("lightning")
pytest.importorskip("accelerate")

import frameworkloops  # noqa: E402
import torch  # noqa: E402
from frameworkloops import (  # noqa: E402
    LanguageModel,
    TimedModelCheckpoint,
    TimedTrainer,
    TokenDataset,
    TwoOptimizers,
    evaluation_intervals,
    hf_trainer,
    lightning_trainer,
    overlap_s,
    saves_in_steps_s,
    stage_total_s,
    step_intervals,
    tiny_bert,
    token_loader,
)
from report_checks import pasted_module  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import perfmagic  # noqa: E402
from perfmagic import Report  # noqa: E402

CHECKPOINT_TOLERANCE = 0.25  # the bound: the checkpoint stage within 25% of the save's own time


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    """One intra-op thread: on a crowded 2-core machine two threads make every step several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def profiled(tmp_path: Path, job: Any) -> Report:
    with perfmagic.profile(sample=False, outdir=tmp_path / "perfmagic") as session:
        job()
    return session.report


# -- Hugging Face Trainer ------------------------------------------------------------


def test_hf_steps_are_the_global_step_and_evaluation_stays_out(tmp_path: Path) -> None:
    trainer = hf_trainer(
        tmp_path / "out",
        steps=20,
        eval_strategy="steps",
        eval_steps=5,
        eval_dataset=TokenDataset(16, delay_s=0.005),  # a pass costs ~80 ms: several steps' worth
    )
    report = profiled(tmp_path, trainer.train)
    assert report.steps["count"] == trainer.state.global_step == 20
    assert report["trainer"] == "transformers.Trainer"
    evaluation = report["evaluation"]
    assert evaluation["passes"] == len(TimedTrainer.evaluations.calls) == 4
    assert evaluation["every_steps"] == 5
    assert evaluation["total_s"] == pytest.approx(TimedTrainer.evaluations.total_s, rel=0.1)
    assert (
        overlap_s(step_intervals(report), evaluation_intervals(report)) < 1e-4
    )  # no step holds one (clock µs)
    assert "evaluation:" in str(report) and "every 5 steps" in str(report)


def test_hf_checkpoint_stage_is_the_whole_save_routine(tmp_path: Path) -> None:
    trainer = hf_trainer(tmp_path / "out", steps=12, save_strategy="steps", save_steps=2, save_total_limit=2)
    report = profiled(tmp_path, trainer.train)
    assert report.steps["count"] == trainer.state.global_step
    measured = saves_in_steps_s(report, "transformers.Trainer._save_checkpoint", TimedTrainer.saves)
    got = stage_total_s(report, "checkpoint")
    assert measured > 0 and abs(got - measured) <= CHECKPOINT_TOLERANCE * measured, (got, measured)
    assert report.analysis is not None
    saves = report.analysis.config.checkpoints
    assert all(
        s["bytes"] and s["bytes"] > 100_000 and s["files"] >= 3 for s in saves
    )  # weights, optimizer, ...


def test_safetensors_bound_before_profiling_is_seen_and_put_back(tmp_path: Path) -> None:
    """transformers binds ``safe_save_file`` at import, before any profile: that copy is patched too."""
    import safetensors.torch
    import transformers.modeling_utils as modeling

    original = modeling.safe_save_file
    assert original is safetensors.torch.save_file
    model = tiny_bert()
    report = profiled(tmp_path, lambda: model.save_pretrained(tmp_path / "model"))
    assert report.analysis is not None
    (save,) = report.analysis.config.checkpoints
    assert save["fn"] == "safetensors.torch.save_file" and save["bytes"] > 50_000  # ~25k float32 weights
    assert modeling.safe_save_file is original and safetensors.torch.save_file is original


# -- Lightning -------------------------------------------------------------------------


def test_lightning_validation_and_sanity_check_inflate_no_step(tmp_path: Path) -> None:
    model = LanguageModel(validation_s=0.02)  # 3 batches: 60 ms, several steps' worth
    trainer = lightning_trainer(
        max_steps=30, val_check_interval=10, limit_val_batches=3, num_sanity_val_steps=2
    )
    report = profiled(tmp_path, lambda: trainer.fit(model, token_loader(), token_loader()))
    assert report.steps["count"] == trainer.global_step == 30
    assert report["trainer"] == "lightning.Trainer"
    evaluation = report["evaluation"]
    assert evaluation["passes"] == 4  # the sanity check, then after steps 10, 20 and 30
    assert evaluation["every_steps"] == 10
    assert evaluation["total_s"] >= 4 * 0.04
    assert overlap_s(step_intervals(report), evaluation_intervals(report)) < 1e-4
    durations = [end - start for start, end in step_intervals(report)]
    # the steps right after a validation are like the others (they used to hold it: 2-3x); a pass is
    # measured in the same run, so a loaded machine slows both sides alike
    after = [durations[k] for k in (10, 20)]
    typical = sorted(durations)[len(durations) // 2]
    shortest_pass = min(end - start for start, end in evaluation_intervals(report))
    assert max(after) < typical + 0.5 * shortest_pass, (after, typical, shortest_pass)


def test_host_work_in_training_step_is_not_optimizer_time(tmp_path: Path) -> None:
    """Lightning runs ``training_step`` inside ``optimizer.step(closure)``: only the step itself is optimizer."""
    model = LanguageModel(host_s=0.05)
    trainer = lightning_trainer(max_steps=10)
    report = profiled(tmp_path, lambda: trainer.fit(model, token_loader()))
    assert report.steps["count"] == trainer.global_step == 10
    host = model.host.total_s
    optimizer, other = stage_total_s(report, "optimizer"), stage_total_s(report, "other")
    assert optimizer < 0.5 * host, (optimizer, host)  # it was all of it: the host work and the update
    assert other >= 0.9 * host, (other, host)
    assert stage_total_s(report, "forward") > 0 and stage_total_s(report, "backward") > 0


def test_lightning_checkpoint_stage_is_the_whole_save(tmp_path: Path) -> None:
    checkpoint = TimedModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer = lightning_trainer(
        max_steps=12,
        enable_checkpointing=True,
        callbacks=[checkpoint],
        val_check_interval=4,  # the saves after steps 4 and 8 come right before a validation pass
        limit_val_batches=2,
        num_sanity_val_steps=0,
    )
    report = profiled(tmp_path, lambda: trainer.fit(LanguageModel(), token_loader(), token_loader()))
    assert report.steps["count"] == trainer.global_step == 12
    assert report["evaluation"]["passes"] == 3
    measured = saves_in_steps_s(report, "ModelCheckpoint", checkpoint.saves)
    got = stage_total_s(report, "checkpoint")
    assert measured > 0 and abs(got - measured) <= CHECKPOINT_TOLERANCE * measured, (got, measured)


def test_two_optimizers_per_batch_count_one_step(tmp_path: Path) -> None:
    real = torch.randn(40, 8)
    trainer = lightning_trainer(max_epochs=1)
    report = profiled(
        tmp_path, lambda: trainer.fit(TwoOptimizers(), DataLoader(TensorDataset(real), batch_size=4))
    )
    batches = trainer.fit_loop.epoch_loop.batch_progress.total.completed
    assert batches == 10
    # Lightning's global_step counts every optimizer's steps ("includes multiple optimizers"): 2 per batch
    assert trainer.global_step == 2 * batches
    assert report.steps["count"] == batches


# -- Accelerate -------------------------------------------------------------------------


def test_accelerate_steps_are_optimizer_steps_with_gradient_accumulation(tmp_path: Path) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    stepped = [0]

    def train() -> None:
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                stepped[0] += int(accelerator.sync_gradients)
                optimizer.zero_grad()

    report = profiled(tmp_path, train)
    assert stepped[0] == 8
    assert report.steps["count"] == stepped[0]
    assert report["trainer"] == "accelerate"


# -- every patch goes back ---------------------------------------------------------------


def test_framework_patches_are_removed_when_profiling_ends(tmp_path: Path) -> None:
    from accelerate import Accelerator
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
    from transformers import Trainer

    def methods() -> dict[str, Any]:
        return {
            "Trainer._save_checkpoint": Trainer._save_checkpoint,
            "Trainer.train": Trainer.train,
            "Trainer.evaluate": Trainer.evaluate,
            "ModelCheckpoint._save_checkpoint": ModelCheckpoint._save_checkpoint,
            "_EvaluationLoop.run": _EvaluationLoop.run,
            "Accelerator.backward": Accelerator.backward,
        }

    before = methods()
    for failing in (False, True):
        with (
            pytest.raises(RuntimeError) if failing else contextlib.nullcontext(),
            perfmagic.profile(sample=False, outdir=tmp_path / str(failing)),
        ):
            assert Trainer._save_checkpoint is not before["Trainer._save_checkpoint"]
            if failing:
                raise RuntimeError("the cell failed")
        assert methods() == before


def test_a_framework_imported_while_profiling_is_hooked_then_put_back(tmp_path: Path) -> None:
    """A cell that starts with ``from transformers import Trainer``: hooked at its import."""
    script = (
        "import perfmagic, sys\n"
        "with perfmagic.profile(sample=False):\n"
        "    from transformers import Trainer\n"
        "    hooked = hasattr(Trainer._save_checkpoint, '__wrapped__')\n"
        "print(hooked, hasattr(Trainer._save_checkpoint, '__wrapped__'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split()[-2:] == ["True", "False"], out.stdout + out.stderr


def test_starting_a_profile_with_the_frameworks_imported_is_quick() -> None:
    """Importing the frameworks before profiling costs the session's start little (the rebinding scan)."""
    begin = time.perf_counter()
    with perfmagic.profile(sample=False):
        started = time.perf_counter() - begin
    assert started < 1.0


# -- fixes in the user's framework, each built with the installed version ------------------


def _run_fix(code: str, **names: Any) -> dict[str, Any]:
    """Execute a card's fix as the user would paste it; returns what it defined."""
    namespace: dict[str, Any] = dict(names)
    exec(compile(code, "<fix>", "exec"), namespace)
    return namespace


def test_slow_data_under_the_hf_trainer_gets_training_arguments(tmp_path: Path) -> None:
    trainer = hf_trainer(tmp_path / "out", steps=16, delay_s=0.004)  # 8 samples a batch: ~32 ms of loading
    report = profiled(tmp_path, trainer.train)
    cards = {c["id"]: c for c in report.advice}
    assert "dataloader_workers" in cards, str(report)
    card = cards["dataloader_workers"]
    assert "TrainingArguments(" in card["fix"] and "DataLoader(" not in card["fix"], card["fix"]
    # the user's own TrainingArguments(...) statement, in hf_trainer, pasted over and run for a step
    assert card["replaces"]["file"] == frameworkloops.__file__, card
    fixed = pasted_module(card).hf_trainer(tmp_path / "fixed", steps=1)
    users = [hf_trainer(tmp_path / "fixed", steps=1) for _ in range(2)]
    settings = [f.name for f in dataclasses.fields(fixed.args) if f.init]
    same = [k for k in settings if getattr(users[0].args, k) == getattr(users[1].args, k)]  # not a clock's
    changed = {k for k in same if getattr(fixed.args, k) != getattr(users[0].args, k)}
    assert changed == {"dataloader_num_workers", "dataloader_persistent_workers"}, changed
    assert fixed.args.dataloader_num_workers == card["metrics"]["recommended_workers"] > 0
    assert fixed.train().global_step == 1


def test_frequent_lightning_checkpoints_get_model_checkpoint_every_n_train_steps(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    checkpoint_line = sys._getframe().f_lineno - 1
    trainer = lightning_trainer(max_steps=12, enable_checkpointing=True, callbacks=[checkpoint])
    report = profiled(tmp_path, lambda: trainer.fit(LanguageModel(), token_loader()))
    cards = [c for c in report.advice if c["id"] == "checkpoint_frequency"]
    assert cards, str(report)
    card = cards[0]
    # the user's ModelCheckpoint(...) statement, above: their arguments, the interval changed
    site = card["replaces"]
    assert (site["file"], site["line"], site["end_line"]) == (__file__, checkpoint_line, checkpoint_line), (
        site
    )
    built = _run_fix(card["fix"], ModelCheckpoint=ModelCheckpoint, tmp_path=tmp_path)
    every = card["metrics"]["recommended_interval_steps"]
    assert every > 1 and built["checkpoint"]._every_n_train_steps == every
    assert str(built["checkpoint"].dirpath) == str(tmp_path / "ckpt") and built["checkpoint"].save_top_k == -1


@pytest.mark.parametrize("framework", ["transformers.Trainer", "lightning.Trainer", "accelerate"])
def test_mixed_precision_and_compile_fixes_build_in_each_framework(framework: str) -> None:
    """The GPU levers, written for each framework, build with the installed version (here, on a CPU)."""
    import lightning as L
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from analysis_builder import CUDA_TORCH, HOST_SAMPLES, MODEL, build, gpu_static
    from transformers import Trainer, TrainingArguments

    from perfmagic.advise import gpu, pace

    # use_cpu: the objects are built on this CPU machine; a GPU user's arguments would not have it
    settings = (
        {"training_args": {"output_dir": "out", "max_steps": 20, "use_cpu": True}}
        if framework == "transformers.Trainer"
        else {}
    )
    a = build(
        samples={**HOST_SAMPLES, "gpu0.util": 0.9, "gpu0.mem_used_bytes": 1e9},
        torch=CUDA_TORCH,
        model={**MODEL, "device": "cuda:0"},
        devices=[gpu_static(cc="9.0")],
        trainer={"trainer": framework, "settings": settings},
    )
    assert a.trainer == framework
    amp = gpu.amp(a)
    healthy = pace.compute_bound(a)
    assert amp is not None and healthy is not None
    names = {"TrainingArguments": TrainingArguments, "Trainer": L.Trainer, "Accelerator": Accelerator}
    if framework == "transformers.Trainer":
        names |= {"Trainer": Trainer, "model": tiny_bert()}
        assert _run_fix(amp.fix, **names)["args"].bf16
        compiled = "\n".join(
            line for line in healthy.fix.splitlines() if "torch_compile" in line or "args" in line
        )
        assert "torch_compile=True" in compiled
    elif framework == "lightning.Trainer":
        assert _run_fix(amp.fix, **names)["trainer"].precision == "bf16-mixed"
        assert "torch.compile(model)" in healthy.fix
    else:
        AcceleratorState._reset_state(reset_partial_state=True)
        try:
            assert _run_fix(amp.fix, **names)["accelerator"].mixed_precision == "bf16"
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)
    assert "torch.autocast" not in amp.fix
