"""Real torch loops on CPU: perfmagic's stage figures against the loop's own perf_counter timings."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from torch.utils.data import DataLoader
from torchloops import (
    UNTRACKED_S,
    SleepyDataset,
    SleepyNet,
    SleepySGD,
    SlowPickle,
    SlowStream,
    Stopwatch,
    assert_other_matches,
    assert_stage_matches,
    assert_steps_match,
    step_total_s,
    train,
)

import perfmagic
from perfmagic import Report
from tests.sim_cuda import SimCuda, install

T = TypeVar("T")
STEPS = 15


def profiled(tmp_path: Path, fn: Callable[[], T]) -> tuple[Report, T]:
    with perfmagic.profile(sources=[], outdir=tmp_path / "perfmagic") as session:
        result = fn()
    return session.report, result


def counters(report: Report) -> dict[str, Any]:
    assert report.analysis is not None
    return report.analysis.config.counters


def test_data_stage(tmp_path: Path) -> None:
    report, t = profiled(tmp_path, lambda: train(STEPS, data_s=0.015))
    assert_steps_match(report, t)
    assert_stage_matches(report, "data", t.data.total_s)
    assert_other_matches(report, t)
    assert report.bottleneck == "data"


def test_forward_stage_is_the_outermost_module_call(tmp_path: Path) -> None:
    report, t = profiled(tmp_path, lambda: train(STEPS, forward_s=0.015))
    assert_steps_match(report, t)
    assert_stage_matches(report, "forward", t.forward.total_s)
    assert_other_matches(report, t)
    # SleepyNet holds a Sequential of Linears: one forward for it and one for the loss module
    assert counters(report)["forwards"] == 2 * STEPS


def test_backward_stage(tmp_path: Path) -> None:
    report, t = profiled(tmp_path, lambda: train(STEPS, backward_s=0.015))
    assert_steps_match(report, t)
    assert_stage_matches(report, "backward", t.backward.total_s)
    assert_other_matches(report, t)


def test_optimizer_stage_and_one_step_per_outermost_optimizer_step(tmp_path: Path) -> None:
    # SleepySGD.step calls SGD.step: both are timed, yet it is one training step
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # make sure SGD.step itself is hooked
    report, t = profiled(tmp_path, lambda: train(STEPS, optimizer_s=0.015))
    assert_steps_match(report, t)
    assert_stage_matches(report, "optimizer", t.optimizer.total_s)
    assert_other_matches(report, t)
    assert counters(report)["optimizer_steps"] == STEPS


class _SlowList(list[Any]):
    """A parameter list that takes ``delay_s`` to walk: zero_grad work the test can predict."""

    delay_s = 0.01

    def __iter__(self) -> Iterator[Any]:
        time.sleep(self.delay_s)
        return super().__iter__()


class _SlowParams(torch.nn.Linear):
    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        time.sleep(_SlowList.delay_s)
        yield from super().parameters(recurse)


def test_zero_grad_is_optimizer(tmp_path: Path) -> None:
    model = _SlowParams(4, 1)
    opt = torch.optim.SGD(list(model.parameters()), lr=0.1)
    opt.param_groups[0]["params"] = _SlowList(opt.param_groups[0]["params"])
    watch = Stopwatch()

    def loop() -> None:
        for _ in range(STEPS):
            model(torch.ones(4)).sum().backward()
            with watch():
                opt.zero_grad()
                model.zero_grad()
            time.sleep(UNTRACKED_S)
            perfmagic.step()

    report, _ = profiled(tmp_path, loop)
    assert report.steps["count"] == STEPS
    assert_stage_matches(report, "optimizer", watch.total_s)


def test_checkpoint_stage(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    state = {"weights": torch.randn(1_000_000), "slow": SlowPickle(0.01)}
    report, t = profiled(tmp_path, lambda: train(STEPS, extra=lambda i: torch.save(state, path)))
    assert_steps_match(report, t)
    assert_stage_matches(report, "checkpoint", t.extra.total_s)
    assert_other_matches(report, t)
    assert report.analysis is not None
    saves = report.analysis.config.checkpoints
    assert len(saves) == STEPS
    assert all(s["fn"] == "torch.save" and s["bytes"] >= 4_000_000 for s in saves)


def test_logging_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:  # a metric writer is hooked only when its module was imported before profiling
        import tensorboardX

        writer: Any = tensorboardX.SummaryWriter(str(tmp_path / "tb"))
    except ImportError:
        writer = None
    monkeypatch.setattr(sys, "stdout", SlowStream())
    monkeypatch.setattr(sys, "stderr", SlowStream())
    handler = logging.StreamHandler(SlowStream())  # type: ignore[arg-type]
    logger = logging.getLogger("perfmagic.tests.train")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)

    # Each logging call is timed on its own: the Python between them (formatting the text, calling
    # the next one) is no logging, for perfmagic nor for this truth, and on a busy machine a
    # preemption there would otherwise count as logging here and as `other` in the report.
    watch = Stopwatch()

    def log(i: int) -> None:
        text = f"step {i}"
        with watch():
            print(text)  # two writes: text and newline
        with watch():
            logger.info("step %d", i)
        with watch():
            sys.stderr.write(text + "\n")
        if writer is not None:
            with watch():
                writer.add_scalar("loss", float(i), i)

    try:
        report, t = profiled(tmp_path, lambda: train(STEPS, extra=log))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        if writer is not None:
            writer.close()
    assert_steps_match(report, t)
    assert_stage_matches(report, "logging", watch.total_s)
    assert_other_matches(report, t, also_untracked_s=t.extra.total_s - watch.total_s)


def test_comm_stage(tmp_path: Path, gloo_group: None) -> None:
    dist = torch.distributed
    grads = torch.ones(1000)
    gathered: list[Any] = [None]

    def communicate(i: int) -> None:
        dist.all_reduce(grads)
        dist.barrier()
        dist.all_gather_object(gathered, SlowPickle(0.01))  # pickling is part of the collective

    report, t = profiled(tmp_path, lambda: train(STEPS, extra=communicate))
    assert_steps_match(report, t)
    assert_stage_matches(report, "comm", t.extra.total_s)
    assert_other_matches(report, t)


def test_user_stage(tmp_path: Path) -> None:
    def augment(i: int) -> None:
        with perfmagic.stage("augment"):
            time.sleep(0.015)

    report, t = profiled(tmp_path, lambda: train(STEPS, extra=augment))
    assert_steps_match(report, t)
    assert_stage_matches(report, "augment", t.extra.total_s)
    assert_other_matches(report, t)


def test_cpu_to_cpu_copies_are_not_h2d(tmp_path: Path) -> None:
    x = torch.randn(2_000_000)

    def convert(i: int) -> None:
        x.to("cpu")
        x.to(torch.device("cpu"))
        x.to(device="cpu", dtype=torch.float64)
        x.to(torch.float64)
        x.cpu()
        time.sleep(0.01)  # so the conversions' share is known: it must land in "other" with this

    report, t = profiled(tmp_path, lambda: train(STEPS, extra=convert))
    assert report.stages.get("h2d", {}).get("total_s", 0.0) == 0.0
    assert counters(report)["h2d_copies"] == 0
    assert counters(report)["syncs"] == 0
    assert_other_matches(report, t, also_untracked_s=t.extra.total_s)


# -- nesting -------------------------------------------------------------


class _SlowTransform(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.015)
        return torch.relu(x)


def test_module_transform_inside_the_dataset_is_data(tmp_path: Path) -> None:
    dataset = SleepyDataset(STEPS, transform=_SlowTransform())  # an nn.Module called by __getitem__
    report, t = profiled(tmp_path, lambda: train(STEPS, dataset=dataset))
    assert_steps_match(report, t)
    assert_stage_matches(report, "data", t.data.total_s)
    assert_stage_matches(report, "forward", t.forward.total_s, min_share=0.0)
    assert counters(report)["forwards"] == 2 * STEPS  # the transform is no forward pass


def test_print_inside_forward_is_logging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", SlowStream(0.005))
    prints = Stopwatch()

    def chatty() -> None:
        with prints():
            print("forward!")  # two slow writes: 10 ms

    report, t = profiled(tmp_path, lambda: train(STEPS, model=SleepyNet(0.01, hook=chatty)))
    assert_steps_match(report, t)
    assert_stage_matches(report, "logging", prints.total_s)
    assert_stage_matches(report, "forward", t.forward.total_s - prints.total_s)


# -- steps without an optimizer ------------------------------------------


def test_dataloader_batches_are_steps_across_epochs(tmp_path: Path) -> None:
    model = SleepyNet(forward_s=0.01)
    loader = DataLoader(SleepyDataset(6, 0.005), batch_size=1)

    def infer() -> int:
        seen = 0
        with torch.no_grad():
            for _epoch in range(2):
                for x, _ in loader:
                    model(x)
                    seen += 1
                time.sleep(0.05)  # validation between epochs: no step
        return seen

    report, seen = profiled(tmp_path, infer)
    assert seen == 12
    assert report.steps["count"] == 12
    assert report.analysis is not None
    assert report.analysis.breakdown.boundary == "batch"
    assert report.steps["p90_s"] < 0.04  # the pause between epochs is in no step


def test_break_out_of_a_dataloader_loop_keeps_the_last_step(tmp_path: Path) -> None:
    model = SleepyNet(forward_s=0.01)
    loader = DataLoader(SleepyDataset(20), batch_size=1)
    forward = Stopwatch()

    def infer() -> None:
        with torch.no_grad():
            for i, (x, _) in enumerate(loader):
                with forward():
                    model(x)
                if i == 4:
                    break

    report, _ = profiled(tmp_path, infer)
    assert report.steps["count"] == 5
    # the fifth step, cut short by the break, still holds its forward: the loop's own timer says how much
    assert_stage_matches(report, "forward", forward.total_s, min_share=0.5)


# -- CUDA ------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@cuda
def test_h2d_stage_on_cuda(tmp_path: Path) -> None:
    x = torch.randn(32_000_000)  # 128 MB of pageable memory
    torch.zeros(1, device="cuda")  # CUDA initialized: the device clock starts with the session
    sync = torch.cuda.synchronize  # the unpatched one: the loop's own measurement stays out of "logging"
    watch = Stopwatch()

    def loop() -> None:
        for _ in range(STEPS):
            with watch():
                x.to("cuda")
                sync()
            time.sleep(UNTRACKED_S)
            perfmagic.step()

    report, _ = profiled(tmp_path, loop)
    assert report.steps["count"] == STEPS
    assert_stage_matches(report, "h2d", watch.total_s)
    assert counters(report)["h2d_bytes"] == STEPS * x.numel() * 4


@pytest.mark.gpu
@cuda
def test_cuda_event_clock_extends_stages_to_device_time(tmp_path: Path) -> None:
    class Matmuls(torch.nn.Module):
        """Queues ~tens of ms of GPU work and returns at once."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4096, 4096, device="cuda") / 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(20):
                x = x @ self.w
            return x

    model = Matmuls()
    x = torch.randn(4096, 4096, device="cuda")
    sync = torch.cuda.synchronize
    with torch.no_grad():
        model(x)
    sync()
    forward = Stopwatch()

    def loop() -> None:
        with torch.no_grad():
            for _ in range(STEPS):
                with forward():
                    model(x)
                    sync()  # the loop's own figure: until the GPU is done
                time.sleep(UNTRACKED_S)
                perfmagic.step()

    report, _ = profiled(tmp_path, loop)
    assert report.steps["count"] == STEPS
    assert_stage_matches(report, "forward", forward.total_s)


@pytest.mark.gpu
@cuda
def test_the_grad_scalers_inf_check_is_optimizer_time(tmp_path: Path) -> None:
    """``scaler.step`` reads found_inf with ``item()``: a sync, but the optimizer's, not logging."""
    model = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(32, 64, device="cuda")

    def loop() -> None:
        for _ in range(STEPS):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

    report, _ = profiled(tmp_path, loop)
    assert report.steps["count"] == STEPS
    assert counters(report)["syncs"] == 0
    assert "logging" not in report.stages


def test_an_optimizer_step_that_raises_does_not_break_step_detection() -> None:
    """A caught exception in ``step`` (an OOM on Adam's first step, say) must not stop counting steps."""
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.Adam(model.parameters())
    step_before = torch.optim.Adam.step
    failures = iter([True])

    def fail_once(opt: object, args: object, kwargs: object) -> None:
        if next(failures, False):
            raise MemoryError("simulated out of memory")

    handle = optimizer.register_step_pre_hook(fail_once)
    try:
        with perfmagic.profile(sample=False) as session:
            for _ in range(6):
                optimizer.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                with contextlib.suppress(MemoryError):
                    optimizer.step()
    finally:
        handle.remove()
    assert session.report.steps["count"] == 5  # the step that raised did not happen
    assert session.recorder is not None and session.recorder.current_stage is None
    assert torch.optim.Adam.step is step_before


# -- loop shapes people write ------------------------------------------------


def test_gradient_accumulation_steps_are_optimizer_steps(tmp_path: Path) -> None:
    model, loss_fn = SleepyNet(forward_s=0.004), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SleepyDataset(4 * 6), batch_size=1)
    forward = Stopwatch()

    def loop() -> None:
        for i, (x, y) in enumerate(loader):  # 4 micro-batches per optimizer step
            with forward():
                loss = loss_fn(model(x), y) / 4
            loss.backward()
            if i % 4 == 3:
                opt.step()
                opt.zero_grad()

    report, _ = profiled(tmp_path, loop)
    assert report.steps["count"] == 6
    assert counters(report)["forwards"] == 2 * 24
    assert_stage_matches(report, "forward", forward.total_s)


def test_a_step_the_grad_scaler_skips_still_ends_a_step(tmp_path: Path) -> None:
    if getattr(torch.amp, "GradScaler", None) is None:
        pytest.skip("torch.amp.GradScaler needs torch >= 2.3")
    model, loss_fn = SleepyNet(), torch.nn.MSELoss()
    opt = SleepySGD(model.parameters())  # a step inside a step, under the scaler's step
    scaler = torch.amp.GradScaler("cpu")

    def loop() -> None:
        for i, (x, y) in enumerate(DataLoader(SleepyDataset(8), batch_size=1)):
            loss = loss_fn(model(x), y) * (float("inf") if i == 3 else 1.0)  # overflow: step skipped
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

    report, _ = profiled(tmp_path, loop)
    assert report.steps["count"] == 8
    assert counters(report)["optimizer_steps"] == 7
    assert torch.amp.GradScaler.step.__name__ == "step"  # restored


def test_an_evaluation_pass_is_no_training_step(tmp_path: Path) -> None:
    """Validation between epochs and in the middle of one (no_grad forwards) stays out of the steps."""

    def slow_when_evaluating() -> None:
        if not torch.is_grad_enabled():
            time.sleep(0.02)

    model, loss_fn = SleepyNet(hook=slow_when_evaluating), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_loader = DataLoader(SleepyDataset(6), batch_size=1)
    val_loader = DataLoader(SleepyDataset(3), batch_size=1)
    step_s: list[float] = []

    def validate() -> None:
        with torch.no_grad():
            for x, _ in val_loader:
                model(x)

    def loop() -> None:
        for _epoch in range(2):
            batches, i = iter(train_loader), 0
            while True:
                begin = time.perf_counter()  # a step takes its batch too: on a busy machine, not nothing
                try:
                    x, y = next(batches)
                except StopIteration:
                    break
                time.sleep(UNTRACKED_S)
                loss_fn(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                step_s.append(time.perf_counter() - begin)
                if i == 2:
                    validate()  # every few steps, like Lightning's val_check_interval
                i += 1
            validate()

    report, _ = profiled(tmp_path, loop)
    assert report.steps["count"] == 12
    assert report.analysis is not None
    # no step holds an evaluation pass (3 forwards of at least 20 ms): each is the loop's own step, which
    # a busy machine may stretch, and nothing like a pass more
    assert report.analysis.breakdown.durations.max() < max(step_s) + 0.03, (
        report.analysis.breakdown.durations,
        step_s,
    )
    assert abs(step_total_s(report) - sum(step_s)) < 0.1 * sum(step_s)
    evaluation = report["evaluation"]
    assert evaluation["passes"] == 4 and evaluation["every_steps"] == 3  # after steps 3, 6, 9 and 12
    assert evaluation["total_s"] >= 4 * 3 * 0.02
    assert 0 < evaluation["fraction_of_wall"] < 1


def test_two_optimizers_stepping_in_one_iteration_are_one_step(tmp_path: Path) -> None:
    """A GAN's discriminator and generator steps: one training step per batch, and per iteration
    without a DataLoader; an optimizer stepping twice on one batch is still two steps."""
    generator, discriminator = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
    g_opt = torch.optim.SGD(generator.parameters(), lr=0.01)
    d_opt = torch.optim.Adam(discriminator.parameters(), lr=0.01)
    loader = DataLoader(SleepyDataset(10), batch_size=1)

    def iteration(x: torch.Tensor) -> None:
        fake = generator(torch.randn_like(x))
        (discriminator(fake.detach()) - discriminator(x)).mean().backward()
        d_opt.step()
        d_opt.zero_grad()
        (-discriminator(fake)).mean().backward()
        g_opt.step()
        g_opt.zero_grad()

    def with_loader() -> None:
        for x, _ in loader:
            iteration(x)

    def without_loader() -> None:
        for _ in range(10):
            iteration(torch.randn(1, 8))

    def same_optimizer_twice() -> None:
        for x, _ in loader:
            for _ in range(2):  # two updates on each batch
                discriminator(x).mean().backward()
                d_opt.step()
                d_opt.zero_grad()

    for job, steps in ((with_loader, 10), (without_loader, 10), (same_optimizer_twice, 20)):
        report, _ = profiled(tmp_path / job.__name__, job)
        assert report.steps["count"] == steps, job.__name__
        assert counters(report)["optimizer_steps"] == 20


def test_host_work_in_an_optimizer_closure_is_not_optimizer_time(tmp_path: Path) -> None:
    """``optimizer.step(closure)`` (LBFGS, Lightning): the closure's forward and backward are theirs,
    the rest of it is ``other``; only the update itself is ``optimizer``."""
    # each part a fair share of the step (backward ~25%), so a busy machine's stretch of the rest
    # leaves every stage above the test's own floor
    model, loss_fn = SleepyNet(forward_s=0.008, backward_s=0.008), torch.nn.MSELoss()
    opt = SleepySGD(model.parameters(), step_s=0.005)
    loader = DataLoader(SleepyDataset(STEPS), batch_size=1)
    host, forward, backward, update = Stopwatch(), Stopwatch(), Stopwatch(), Stopwatch()

    def loop() -> None:
        for x, y in loader:

            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                opt.zero_grad()
                with forward():
                    loss = loss_fn(model(x), y)
                with host():
                    time.sleep(0.012)  # metrics, logging: the rest of a training_step
                with backward():
                    loss.backward()
                return loss

            with update():
                opt.step(closure)

    report, _ = profiled(tmp_path, loop)
    assert report.steps["count"] == STEPS
    assert_stage_matches(report, "forward", forward.total_s)
    assert_stage_matches(report, "backward", backward.total_s)
    assert_stage_matches(report, "other", host.total_s)
    inside_closure = forward.total_s + host.total_s + backward.total_s
    assert_stage_matches(report, "optimizer", update.total_s - inside_closure, min_share=0.05)


def test_a_model_called_through_its_wrapper_attribute(tmp_path: Path) -> None:
    """``model.module(x)`` (DDP's inner module) is one forward, and the inner model is recorded."""

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = SleepyNet(forward_s=0.015)

    wrapped = Wrapper()
    report, t = profiled(tmp_path, lambda: train(STEPS, model=wrapped.module))
    assert_steps_match(report, t)
    assert_stage_matches(report, "forward", t.forward.total_s)
    assert report.analysis is not None
    assert [m["cls"] for m in report.analysis.config.models] == ["SleepyNet", "MSELoss"]


def test_a_progress_bar_on_stderr_is_logging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm-style: a bar made before profiling keeps the stream it found; one made inside writes through ours."""
    monkeypatch.setattr(sys, "stderr", SlowStream(0.005))
    early_file = sys.stderr  # a bar created before the block
    writes = Stopwatch()

    def bar(i: int) -> None:
        with writes():
            sys.stderr.write(f"\r{i}/{STEPS} |####|")  # a bar created inside the block
            sys.stderr.flush()
        early_file.write("")  # the early bar's stream is the original: no stage, no error

    report, t = profiled(tmp_path, lambda: train(STEPS, extra=bar))
    assert_steps_match(report, t)
    assert_stage_matches(report, "logging", writes.total_s)


def test_a_tqdm_bar_made_before_profiling_is_logging(tmp_path: Path) -> None:
    """The real tqdm: made before the block, it keeps the stream it found, and is still timed."""
    import tqdm

    bar = tqdm.tqdm(total=STEPS, file=SlowStream(0.004), mininterval=0, miniters=1)
    drawing = Stopwatch()

    def advance(i: int) -> None:
        with drawing():
            bar.update(1)

    try:
        report, t = profiled(tmp_path, lambda: train(STEPS, extra=advance))
    finally:
        bar.close()
    assert_steps_match(report, t)
    assert_stage_matches(report, "logging", drawing.total_s)
    assert "display" not in vars(tqdm.std.tqdm) or not hasattr(tqdm.std.tqdm.display, "__wrapped__")


@pytest.mark.slow
def test_a_compiled_model_keeps_one_graph_under_profiling(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters as dynamo_counters

    torch._dynamo.reset()
    dynamo_counters.clear()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop() -> None:
        compiled = torch.compile(model)  # compiled inside the block: dynamo traces the patched __call__
        for _ in range(4):
            compiled(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()

    try:
        report, _ = profiled(tmp_path, loop)
    finally:
        torch._dynamo.reset()
    assert sum(dynamo_counters["graph_break"].values()) == 0
    assert dynamo_counters["stats"]["unique_graphs"] == 1
    assert report.steps["count"] == 4
    assert report.analysis is not None and report.analysis.config.models[0]["compiled"]


# -- odd objects never break the training -------------------------------------


class _NoLength(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        raise NotImplementedError("streamed: length unknown")

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(8)


class _NoParameters(torch.nn.Module):
    """A module whose parameters() raises (an exotic wrapper)."""

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        raise RuntimeError("no parameters here")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _OddFile(io.BytesIO):
    """A file object whose tell() fails (a pipe, a socket wrapper)."""

    def tell(self) -> int:
        raise RuntimeError("not seekable")


def test_odd_objects_never_break_the_training(tmp_path: Path) -> None:
    loader = DataLoader(_NoLength(), sampler=range(4))
    del loader.prefetch_factor  # as in torch < 1.7
    lazy = torch.nn.LazyLinear(1)
    odd = _NoParameters()

    def loop() -> None:
        for x in loader:
            lazy(odd(x)).sum().backward()
            torch.save({"x": 1}, io.BytesIO(b"old" * 10))
            torch.save({"x": 1}, _OddFile())

    report, _ = profiled(tmp_path, loop)
    assert report.steps["count"] == 4
    assert report.analysis is not None
    config = report.analysis.config
    assert config.dataloaders[0].dataset_len is None and config.dataloaders[0].prefetch_factor is None
    # recorded after its first call: materialized (and a Linear by then)
    assert {"cls": "Linear", "parameters": 9} in [
        {k: m[k] for k in ("cls", "parameters")} for m in config.models
    ]
    assert [c["bytes"] is None for c in config.checkpoints] == [False, True] * 4
    assert any("_NoParameters" in w and "no parameters here" in w for w in report.warnings)


def test_a_device_clock_that_fails_to_start_leaves_host_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a machine where starting the CUDA clock fails")
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # torch's lazy imports, outside the window
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CUDA "in use", yet unusable
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    report, t = profiled(tmp_path, lambda: train(STEPS, forward_s=0.015))
    assert_steps_match(report, t)
    assert_stage_matches(report, "forward", t.forward.total_s)
    assert any("no CUDA event clock" in w for w in report.warnings)


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        (("cuda",), {}, False),
        (("cuda",), {"non_blocking": True}, True),
        (("cuda", torch.float16, True), {}, True),  # to(device, dtype, non_blocking)
        ((torch.float16, True, False), {}, True),  # to(dtype, non_blocking, copy)
        (("cuda", None, False, True), {}, False),  # copy=True, not non_blocking
        ((0, True), {}, True),  # cuda(device, non_blocking)
    ],
)
def test_non_blocking_is_read_by_keyword_or_position(
    args: tuple[Any, ...], kwargs: dict[str, Any], expected: bool
) -> None:
    from perfmagic.collect.torch_tensors import non_blocking

    assert non_blocking(args, kwargs) is expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_without_cuda_the_tensor_methods_are_left_alone() -> None:
    """Copies to a CUDA device and syncs with one are all the tensor hooks record: without CUDA, no hook
    goes in (each change of ``Tensor`` slows the steps after it), and ``.to`` still works."""
    before = {name: getattr(torch.Tensor, name) for name in ("to", "cuda", "item", "cpu", "numpy", "tolist")}
    with perfmagic.profile(sample=False):
        assert {name: getattr(torch.Tensor, name) for name in before} == before
        assert torch.ones(2).to(torch.float64).dtype == torch.float64


def test_moving_the_model_is_no_batch_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """model.to("cuda") in the profiled cell used to count every parameter as a pageable blocking copy.
    (A simulated CUDA device: the copy hooks go in only where CUDA is available.)"""
    install(monkeypatch, SimCuda())
    model = torch.nn.Linear(4, 4)
    with perfmagic.profile(outdir=tmp_path, sample=False) as session:
        for tensor in (*model.parameters(), torch.ones(3)):
            with contextlib.suppress(Exception):  # no CUDA on this machine: the copy itself fails
                tensor.to("cuda")
    counters = session.report.analysis.config.counters if session.report.analysis else {}
    assert counters.get("h2d_copies") == 1  # the plain tensor only, not the two parameters
