"""perfmagic's CUDA paths on a simulated device (tests/sim_cuda.py): real torch hooks, real recorder.

The device runs queued kernels in order for their modelled time, so these loops are GPU-bound as
on a real GPU: the host returns at once and only CUDA events tell when the work was done.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import perfmagic
from perfmagic.collect.cuda import CudaEventClock
from perfmagic.collect.device_times import DRAIN_AT
from tests.sim_cuda import CaptureError, SimCuda, install

torch = pytest.importorskip("torch")

FORWARD_S, BACKWARD_S, OPTIMIZER_S = 0.015, 0.025, 0.005
"""Kernel times long beside the host's work of a step, even on a loaded machine: the device stays behind
the host, and its stage times are the kernels' own (as on a GPU-bound loop)."""


class DeviceWork(torch.autograd.Function):  # type: ignore[misc]
    """Queues modelled kernels: one in the forward pass, one in the backward pass."""

    @staticmethod
    def forward(ctx: Any, x: Any, sim: SimCuda, forward_s: float, backward_s: float) -> Any:
        sim.launch(forward_s, "forward")
        ctx.sim, ctx.backward_s = sim, backward_s
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple[Any, None, None, None]:
        ctx.sim.launch(ctx.backward_s, "backward")
        return grad, None, None, None


class Net(torch.nn.Module):  # type: ignore[misc]
    def __init__(self, sim: SimCuda, forward_s: float = FORWARD_S, backward_s: float = BACKWARD_S) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)
        self.sim, self.forward_s, self.backward_s = sim, forward_s, backward_s

    def forward(self, x: Any) -> Any:
        return DeviceWork.apply(self.linear(x), self.sim, self.forward_s, self.backward_s)


def device_sgd(sim: SimCuda, params: Any, seconds: float = OPTIMIZER_S) -> Any:
    class DeviceSGD(torch.optim.SGD):  # type: ignore[misc]
        def step(self, closure: Any = None) -> Any:
            sim.launch(seconds, "optimizer")
            return super().step(closure)

    return DeviceSGD(params, lr=0.01)


def train(sim: SimCuda, steps: int, model: Any = None, opt: Any = None) -> None:
    model = model or Net(sim)
    opt = opt or device_sgd(sim, model.parameters())
    x = torch.randn(4, 8)
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> SimCuda:
    return install(monkeypatch, SimCuda())


def stage_means(report: Any) -> dict[str, float]:
    return {name: s["mean_s"] for name, s in report.to_dict()["stages"].items()}


def test_stage_times_are_the_devices_in_a_gpu_bound_loop(sim: SimCuda) -> None:
    with perfmagic.profile(sample=False) as session:
        train(sim, 30)
    assert session.recorder is not None and session.recorder.device_clock is not None
    means = stage_means(session.report)
    truth = {
        k: np.mean([x.end - x.start for x in sim.kernels if x.name == k]) for k in ("forward", "backward")
    }
    # the host queues a step in a fraction of a millisecond: these are the device's times, not the host's
    assert means["forward"] == pytest.approx(truth["forward"], rel=0.15, abs=3e-4)
    assert means["backward"] == pytest.approx(truth["backward"], rel=0.15, abs=3e-4)
    assert means["optimizer"] == pytest.approx(OPTIMIZER_S, rel=0.15, abs=3e-4)
    step = session.report.to_dict()["steps"]["median_s"]
    assert step == pytest.approx(FORWARD_S + BACKWARD_S + OPTIMIZER_S, rel=0.15, abs=5e-4)
    assert sim.device_syncs == 0  # starting the clock and reading it never waits for the whole device


ALLREDUCE_S = 0.02


def test_ddp_reduction_on_a_nccl_like_stream_is_comm_in_device_time(sim: SimCuda, gloo_group: None) -> None:
    """As on NCCL: the hook's all-reduce runs on a stream of its own and DDP's finalize only makes the
    current stream wait for it, so the host's wait is ~0 and only device event tokens see the reduction."""
    engine = torch.autograd.Variable._execution_engine
    reduced_until: list[float] = []

    def nccl_like(state: object, bucket: Any) -> Any:
        start = sim.streams[0].busy_until  # after the backward kernels that made the gradients
        reduced_until.append(max(time.perf_counter(), start) + ALLREDUCE_S)

        def stream_waits() -> None:  # what finalize's work.wait() does on NCCL: a wait queued on the stream
            stream = sim.streams[0]
            stream.busy_until = max(stream.busy_until, reduced_until[-1])

        engine.queue_callback(stream_waits)
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    nccl_like.__annotations__ = {"bucket": torch.distributed.GradBucket}  # DDP checks it (not as a string)
    model = torch.nn.parallel.DistributedDataParallel(Net(sim))
    model.register_comm_hook(None, nccl_like)
    with perfmagic.profile(sample=False) as session:
        train(sim, 30, model, device_sgd(sim, model.parameters()))
    assert len(reduced_until) >= 30
    means = stage_means(session.report)
    # the device's time in the reduction, not the host's near-zero wait; backward keeps only its compute
    assert means["comm"] == pytest.approx(ALLREDUCE_S, rel=0.15, abs=3e-4)
    assert means["backward"] == pytest.approx(BACKWARD_S, rel=0.15, abs=3e-4)
    step = session.report.to_dict()["steps"]["median_s"]
    assert step == pytest.approx(FORWARD_S + BACKWARD_S + ALLREDUCE_S + OPTIMIZER_S, rel=0.15, abs=5e-4)


def test_pending_device_spans_stay_bounded_with_the_hooks(sim: SimCuda) -> None:
    model, pending = Net(sim, forward_s=1e-4, backward_s=1e-4), []
    opt = device_sgd(sim, model.parameters(), seconds=5e-5)
    x = torch.randn(4, 8)
    with perfmagic.profile(sample=False) as session:
        recorder = session.recorder
        assert recorder is not None
        for _ in range(3000):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            pending.append(recorder.pending_device_spans)
    assert sim.idle_at() > 0 and max(pending) < DRAIN_AT + 16, max(pending)
    assert session.report.to_dict()["steps"]["count"] == 3000


def test_no_event_token_is_taken_or_queried_while_a_cuda_graph_is_captured(sim: SimCuda) -> None:
    model = Net(sim)
    opt = device_sgd(sim, model.parameters())
    x = torch.randn(4, 8)
    with perfmagic.profile(sample=False) as session:
        train(sim, 3, model, opt)
        recorded = sim.events_recorded
        with sim.capture():  # a step captured as a graph: any event query would raise CaptureError
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        assert sim.events_recorded == recorded
        train(sim, 3, model, opt)
    assert not [w for w in session.report.warnings if "device" in w]
    assert session.report.to_dict()["steps"]["count"] == 7


def test_a_capture_error_in_a_query_turns_nothing_off(sim: SimCuda) -> None:
    clock = CudaEventClock(torch, origin=0.0)
    token = clock.event_token()
    with sim.capture():
        assert clock.event_token() is None and clock.done(token) is False
        with pytest.raises(CaptureError):
            sim.Event().query()
    assert clock.done(token) in (True, False)


def test_a_model_on_another_device_is_timed_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cuda:1`` while the current device is 0: event tokens on device 0 alone would see no work at all."""
    sim = install(monkeypatch, SimCuda(devices=2))
    sim.alloc(1 << 20, device=1)  # the model's memory lives on device 1

    class OnDevice1(Net):
        def forward(self, x: Any) -> Any:
            return DeviceWork.apply(self.linear(x), _OnDevice(sim, 1), FORWARD_S, BACKWARD_S)

    with perfmagic.profile(sample=False) as session:
        train(sim, 20, OnDevice1(sim))
    clock = session.recorder.device_clock if session.recorder else None
    assert isinstance(clock, CudaEventClock) and clock.devices == (1,)
    means = stage_means(session.report)
    assert means["forward"] == pytest.approx(FORWARD_S, rel=0.15, abs=3e-4)
    assert means["backward"] == pytest.approx(BACKWARD_S, rel=0.15, abs=3e-4)


def test_a_model_split_over_two_devices_ends_its_stages_when_both_are_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = install(monkeypatch, SimCuda(devices=2))
    sim.alloc(1 << 20, device=0)
    sim.alloc(1 << 20, device=1)

    class Split(Net):
        def forward(self, x: Any) -> Any:
            sim.launch(0.005, "forward", device=0)
            return DeviceWork.apply(self.linear(x), _OnDevice(sim, 1), 0.02, 0.01)

    with perfmagic.profile(sample=False) as session:
        train(sim, 20, Split(sim))
    clock = session.recorder.device_clock if session.recorder else None
    assert isinstance(clock, CudaEventClock) and clock.devices == (0, 1)
    # device 1's 20 ms decide the forward pass, though device 0 (current) finished its part in 5 ms
    assert stage_means(session.report)["forward"] == pytest.approx(0.02, rel=0.2, abs=5e-4)


class _OnDevice:
    """A simulated device's launcher bound to one device."""

    def __init__(self, sim: SimCuda, device: int) -> None:
        self.sim, self.device = sim, device

    def launch(self, seconds: float, name: str = "kernel") -> Any:
        return self.sim.launch(seconds, name, device=self.device)


def test_a_failing_event_record_turns_the_clock_off_and_leaves_the_users_error(sim: SimCuda) -> None:
    model = Net(sim)
    with pytest.raises(ValueError, match="the user's"), perfmagic.profile(sample=False) as session:
        train(sim, 3, model)
        sim.fail_records = True
        model(torch.randn(4, 8))
        raise ValueError("the user's own error")
    assert any("device clock failed" in w for w in session.report.warnings)


def test_the_clock_never_starts_before_the_profiled_code_initializes_cuda(sim: SimCuda) -> None:
    sim.initialized = False
    with perfmagic.profile(sample=False) as session:
        train(sim, 2)
        assert session.recorder is not None and session.recorder.device_clock is None
        sim.initialized = True  # the code's first CUDA call
        train(sim, 2)
        assert session.recorder.device_clock is not None


def test_the_allocators_peak_and_retries_reach_the_report_and_the_memory_card(sim: SimCuda) -> None:
    sim.alloc(3 << 30)  # the model, before the window: its peak is not the window's
    with perfmagic.profile(interval=0.02) as session:
        for step in range(30):
            sim.alloc(2 << 30, retry=step == 10)  # activations; once the allocator had to free and retry
            train(sim, 1)
            sim.free(2 << 30)
    devices = session.report.to_dict()["devices"]
    allocator = next(d for d in devices if d["index"] == 0)["allocator"]
    assert allocator == {
        "allocated_peak_bytes": 5 << 30,
        "reserved_peak_bytes": 5 << 30,
        "alloc_retries": 1,
        "ooms": 0,
    }
    card = next(c for c in session.report.to_dict()["advice"] if c["id"] == "gpu_memory_pressure")
    assert card["metrics"]["alloc_retries"] == 1 and "retry" in card["evidence"]
    assert "num_alloc_retries" in card["fix"] and card["severity"] == "medium"


def test_the_allocator_reads_nothing_before_cuda_is_initialized(sim: SimCuda) -> None:
    sim.initialized = False
    with perfmagic.profile(interval=0.02) as session:
        train(sim, 5)
    assert not [m for m in session.timeline.metrics if "torch_" in m]
    assert "cuda_allocator" not in session.timeline.meta


def test_an_event_token_is_timed_when_the_device_reaches_it(sim: SimCuda) -> None:
    origin = time.perf_counter()
    clock = CudaEventClock(torch, origin=origin)
    queued = time.perf_counter() - origin
    sim.launch(0.05)
    token = clock.event_token()
    assert clock.done(token) is False  # 50 ms of work were queued before it
    (t,) = clock.resolve([token])  # waits for that event only
    assert t == pytest.approx(queued + 0.05, abs=5e-3)
    assert clock.done(token) is True and sim.device_syncs == 0


def test_dataloader_workers_forked_while_device_event_tokens_are_held_live_on(sim: SimCuda) -> None:
    """A worker forked inside the data stage (its start event token held, the last step's boundary held back)
    must free none of the parent's events: on a GPU that aborts the worker."""
    from torch.utils.data import DataLoader, TensorDataset

    model = Net(sim)
    opt = device_sgd(sim, model.parameters())
    loader = DataLoader(
        TensorDataset(torch.randn(32, 8)), batch_size=4, num_workers=2, multiprocessing_context="fork"
    )
    with perfmagic.profile(sample=False) as session:
        for _ in range(2):  # each epoch forks its workers anew, the device behind the host
            for (x,) in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    assert session.report.to_dict()["steps"]["count"] == 16


def test_a_finished_sessions_garbage_frees_no_event_in_a_forked_child(sim: SimCuda) -> None:
    """A finished session lives on in reference cycles until the collector finds it; a child forked
    before then (the next loop's DataLoader worker) collects it: it must hold none of the parent's events."""
    import gc
    import multiprocessing

    with perfmagic.profile(sample=False) as session:
        train(sim, 3)
    assert session.recorder is not None and session.recorder.device_clock is not None
    enabled = gc.isenabled()
    gc.collect()  # the session, still referenced, goes to the oldest generation, as a long run's would
    gc.disable()  # no collection here between the session's end and the fork: the child's finds it
    try:
        del session
        child = multiprocessing.get_context("fork").Process(target=gc.collect)
        child.start()
        child.join(timeout=60)
    finally:
        if enabled:
            gc.enable()
    assert child.exitcode == 0  # 134: the child freed one of the parent's events
