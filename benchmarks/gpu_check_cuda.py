"""``gpu_check.py``'s phase 4: the CUDA paths, one check each (stage times against CUDA events, pending
marks, graphs, compiled models, autocast and the allocator, the memory breakdown, a second GPU, tuning's
GPU knobs, DDP over NCCL)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpu_check_record import Check

if TYPE_CHECKING:
    from perfmagic.contract.tuning import KnobResult


def _mlp(torch: Any, width: int, device: str) -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()).to(device)


def check_stage_truth(check: Check, torch: Any) -> None:
    """Stage times against CUDA events this check puts around each stage itself."""
    import perfmagic

    model = _mlp(torch, 4096, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(4096, 4096, device="cuda")
    truth: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    marks = []
    for _ in range(3):  # warm-up: cuBLAS handles, allocator
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize()
    with perfmagic.profile(sample=False) as session:
        for _ in range(30):
            e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            opt.zero_grad()
            e[0].record()
            loss = model(x).square().mean()
            e[1].record()
            loss.backward()
            e[2].record()
            opt.step()
            e[3].record()
            marks.append(e)
    torch.cuda.synchronize()
    for e in marks[1:]:  # the report leaves the first step out as warm-up
        for k, name in enumerate(truth):
            truth[name].append(e[k].elapsed_time(e[k + 1]) / 1000.0)
    stages = session.report.to_dict()["stages"]
    rows, ok = [], True
    for name, times in truth.items():
        want = sum(times) / len(times)
        got = stages[name]["mean_s"] if name in stages else 0.0
        ok &= abs(got - want) <= 0.1 * want + 2e-4
        rows.append(f"{name} {1000 * got:.2f} ms vs events {1000 * want:.2f} ms")
    check.record("stage truth", ok, "; ".join(rows))


def check_pending_marks(check: Check, torch: Any) -> None:
    """10k GPU-bound steps: the device marks waiting to be read stay bounded."""
    import perfmagic
    from perfmagic.collect.device_times import DRAIN_AT

    model = _mlp(torch, 1024, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 1024, device="cuda")
    most = 0
    t0 = time.perf_counter()
    with perfmagic.profile(sample=False) as session:
        assert session.recorder is not None
        for _ in range(10_000):
            opt.zero_grad()
            model(x).mean().backward()
            opt.step()
            most = max(most, session.recorder.pending_device_spans)
    wall = time.perf_counter() - t0
    steps = session.report.to_dict()["steps"]
    median = steps["median_s"] or 0.0
    check.record(
        "pending marks",
        most < DRAIN_AT + 64 and steps["count"] == 10_000,
        f"at most {most} pending over 10k steps ({wall:.1f} s, median step {1000 * median:.3f} ms)",
    )


def check_model_to_cuda_in_window(check: Check, torch: Any) -> None:
    """``model.to("cuda")`` inside the window is set-up: no pageable-copy advice from it."""
    import perfmagic

    with perfmagic.profile(sample=False) as session:
        model = _mlp(torch, 2048, "cpu").to("cuda")  # 4 parameter tensors, pageable
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        batch = torch.randn(512, 2048).pin_memory()
        for _ in range(20):
            x = batch.to("cuda", non_blocking=True)
            opt.zero_grad()
            model(x).mean().backward()
            opt.step()
    d = session.report.to_dict()
    counters = session.timeline.marks("torch_stats")[-1].data
    ids = [c["id"] for c in d["advice"]]
    check.record(
        "model.to(cuda)",
        "pin_memory" not in ids and counters["h2d_copies"] == 20,
        f"h2d copies counted {counters['h2d_copies']} (20 batches), pinned bytes "
        f"{counters['h2d_pinned_bytes']}/{counters['h2d_bytes']}; cards {ids}",
    )


def check_cuda_graph(check: Check, torch: Any) -> None:
    """A training step captured as a CUDA graph and replayed inside the window."""
    import perfmagic

    model = _mlp(torch, 1024, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(256, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with perfmagic.profile(sample=False) as session:
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                model(x).mean().backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            model(x).mean().backward()
            opt.step()
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
    warnings = [w for w in session.report.warnings if "device" in w or "CUDA" in w]
    check.record(
        "cuda graph", not warnings, f"captured and replayed 20 times; warnings: {warnings or 'none'}"
    )


def check_compile_before_profiling(check: Check, torch: Any) -> None:
    """A model compiled before the window is not recompiled by profiling it, cell after cell."""
    from torch._dynamo.utils import counters

    import perfmagic

    torch._dynamo.reset()
    counters.clear()
    model = torch.compile(
        _mlp(torch, 1024, "cuda"), backend="aot_eager"
    )  # dynamo's guards, no minute of inductor
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(256, 1024, device="cuda")

    def step() -> None:
        opt.zero_grad()
        model(x).mean().backward()
        opt.step()

    step()
    graphs = dict(counters["stats"])
    for _ in range(3):
        with perfmagic.profile(sample=False):
            for _ in range(5):
                step()
    recompiles = sum(counters["recompiles"].values())
    breaks = sum(counters["graph_break"].values())
    check.record(
        "compile",
        dict(counters["stats"]) == graphs and not recompiles and not breaks,
        f"graphs {graphs} -> {dict(counters['stats'])}; recompiles {recompiles}; graph breaks {breaks}",
    )


def check_amp_and_allocator(check: Check, torch: Any) -> None:
    """bf16 autocast is seen, and the caching allocator's figures reach the report."""
    import perfmagic

    model = _mlp(torch, 2048, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(1024, 2048, device="cuda")
    with perfmagic.profile(interval=0.05) as session:
        for _ in range(30):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().mean()
            loss.backward()
            opt.step()
    dtypes = session.timeline.marks("torch_stats")[-1].data["autocast_dtypes"]
    allocator = next(
        (d.get("allocator") for d in session.report.to_dict()["devices"] if d.get("allocator")), None
    )
    check.record(
        "amp+allocator",
        dtypes.get("cuda:bfloat16") == 30 and bool(allocator and allocator["allocated_peak_bytes"] > 0),
        f"autocast {dtypes}; allocator {allocator}",
    )


def check_second_gpu(check: Check, torch: Any) -> None:
    """With two GPUs: a model on cuda:1 is timed there (the current device stays 0)."""
    import perfmagic

    if torch.cuda.device_count() < 2:
        check.record("second gpu", None, "one GPU here")
        return
    model = _mlp(torch, 4096, "cuda:1")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(4096, 4096, device="cuda:1")
    with perfmagic.profile(sample=False) as session:
        for _ in range(20):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    clock = session.recorder.device_clock if session.recorder else None
    devices = getattr(clock, "devices", ())
    stages = session.report.to_dict()["stages"]
    forward = stages["forward"]["mean_s"] if "forward" in stages else 0.0
    check.record("second gpu", 1 in devices, f"clock on devices {devices}; forward {1000 * forward:.2f} ms")


def check_tuning_gpu_knobs(check: Check, torch: Any) -> None:
    """Tuning on a CUDA model fed by a DataLoader of host tensors: worker counts, pin_memory,
    autocast (bf16, fp16), TF32 and the doubled batch are timed on copies, and the user's model,
    TF32 flags and CUDA random state are as before."""
    from torch.utils.data import DataLoader, TensorDataset

    import perfmagic

    model = _mlp(torch, 4096, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    x = torch.randn(2048, 4096, device="cuda")
    loader = DataLoader(TensorDataset(torch.randn(64 * 256, 4096)), batch_size=256)
    weights = [p.detach().clone() for p in model.parameters()]
    flags, rng = torch.backends.cuda.matmul.allow_tf32, torch.cuda.get_rng_state()
    results = perfmagic.tune(loader=loader, model=model, optimizer=opt, batch=x, budget_s=30)
    knobs = {r["knob"]: r for r in results}
    same = all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))
    restored = torch.backends.cuda.matmul.allow_tf32 == flags and torch.equal(torch.cuda.get_rng_state(), rng)

    def best(r: KnobResult) -> str:
        found, speedup = r["best"], r["speedup"]
        return f" (best {found['value']}, {speedup:.2f}x)" if found and speedup else ""

    summary = "; ".join(
        f"{k}: " + ", ".join(f"{t['value']} {1000 * t['seconds']:.3g} ms" for t in r["tried"]) + best(r)
        for k, r in knobs.items()
    )
    wanted = {"num_workers", "pin_memory", "autocast", "batch_size"} | ({"tf32"} if not flags else set())
    check.record("tuning gpu knobs", wanted <= knobs.keys() and same and restored, summary)
    if "batch_size" in knobs:
        _check_doubled_batch_peaks(check, torch, model, opt, x, knobs["batch_size"])
    torch.cuda.empty_cache()


def _check_doubled_batch_peaks(check: Check, torch: Any, model: Any, opt: Any, x: Any, tuned: Any) -> None:
    """Tuning's doubled batch rose above the single one's peak as a plain step of the user's model does
    (the allocator's peak counter around each, after a warm step), within 10%."""

    def peak(batch: Any) -> int:
        for _ in range(2):  # the first step makes the optimizer's state
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            model(batch).float().mean().backward()
            opt.step()
            torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())

    twice = torch.cat([x, x])  # held through both, as tuning's doubled batch is: the inputs cancel
    rise = peak(twice) - peak(x)
    peaks = [t.get("peak_bytes") for t in tuned["tried"]]
    measured = peaks[1] - peaks[0] if len(peaks) == 2 and None not in peaks else None
    check.record(
        "doubled batch peaks",
        measured is not None and abs(measured - rise) <= 0.1 * rise,
        f"tuning's doubled batch rose {measured} B above the single one; a plain step's rise {rise} B",
    )


def check_ddp_nccl(check: Check, torch: Any) -> None:
    """A 1-rank NCCL DDP job: its gradient all-reduce is comm inside backward, timed on the device."""
    import socket

    import perfmagic

    dist = torch.distributed
    if not dist.is_available() or not dist.is_nccl_available():
        check.record("ddp nccl", None, "no NCCL in this torch")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        model = torch.nn.parallel.DistributedDataParallel(_mlp(torch, 4096, "cuda"), device_ids=[0])
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(2048, 4096, device="cuda")
        for _ in range(3):  # warm-up: NCCL communicator, buckets rebuilt after the first step
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        with perfmagic.profile(sample=False) as session:
            for _ in range(30):
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()
    spans = session.timeline.spans
    comm = sum(1 for i in spans.name_id if spans.names[int(i)] == "comm")
    stages = session.report.to_dict()["stages"]
    mean = {k: stages[k]["mean_s"] if k in stages else 0.0 for k in ("backward", "comm")}
    device = [w for w in session.report.warnings if "device" in w]
    check.record(
        "ddp nccl",
        comm == 30 and mean["comm"] > 0 and not device,
        f"{comm} comm spans in 30 steps; comm {1000 * mean['comm']:.3f} ms, backward "
        f"{1000 * mean['backward']:.2f} ms per step; device warnings: {device or 'none'}",
    )


def check_memory_breakdown(check: Check, torch: Any) -> None:
    """The report's ``memory`` against the allocator: parameters, gradients and AdamW's state exact;
    activations less the forward's input within 10% of ``memory_allocated()``'s rise from the forward's
    start to the backward's; the peak within the allocator's own peak counters."""
    import perfmagic

    model = _mlp(torch, 2048, "cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(2):  # the check's own truth, after AdamW's state exists
        opt.zero_grad()
        before = torch.cuda.memory_allocated()
        loss = model(x).mean()
        rise = torch.cuda.memory_allocated() - before
        loss.backward()
        opt.step()
    print(f"allocated rise from forward start to backward start: {rise / 2**20:.1f} MiB", flush=True)
    with perfmagic.profile(interval=0.05) as session:
        for _ in range(5):
            opt.zero_grad()
            model(x).mean().backward()
            opt.step()
    stats = torch.cuda.memory_stats()
    memory = session.report.to_dict()["memory"]
    gpu = next(d for d in (memory["devices"] if memory else []) if d["device"].startswith("cuda"))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = 2 * params  # exp_avg and exp_avg_sq; the step counters are on the CPU unless capturable
    acts = gpu["activations_bytes"] - x.numel() * x.element_size()  # the input was there before
    peak = gpu["peak_bytes"]
    # the report's fragmentation is the reserved bytes at the peak less the peak
    reserved = None if peak is None else peak + (gpu["fragmentation_bytes"] or 0)
    ok = (
        gpu["parameters_bytes"] == params
        and gpu["gradients_bytes"] == params
        and gpu["optimizer_state_bytes"] >= moments
        and abs(acts - rise) <= 0.1 * rise
        and peak is not None
        and peak <= stats["allocated_bytes.all.peak"]
        and reserved is not None
        and reserved <= stats["reserved_bytes.all.peak"]
    )
    check.record(
        "memory breakdown",
        ok,
        f"params {params} -> {gpu['parameters_bytes']}, grads {gpu['gradients_bytes']}, state "
        f"{gpu['optimizer_state_bytes']} (moments {moments}); activations less input {acts} vs rise {rise}; "
        f"peak {gpu['peak_bytes']} in {gpu['peak_stage']} (allocator peak {stats['allocated_bytes.all.peak']}), "
        f"fragmentation {gpu['fragmentation_bytes']}",
    )


CUDA_PATH_CHECKS = (
    check_stage_truth,
    check_pending_marks,
    check_model_to_cuda_in_window,
    check_cuda_graph,
    check_compile_before_profiling,
    check_amp_and_allocator,
    check_memory_breakdown,
    check_second_gpu,
    check_tuning_gpu_knobs,
    check_ddp_nccl,
)


def cuda_paths(check: Check, torch: Any) -> None:
    for run in CUDA_PATH_CHECKS:
        with check.section(run.__name__.removeprefix("check_").replace("_", " ")):
            run(check, torch)
