"""``gpu_check.py``'s phases 3 and 5: a real CUDA training loop under ``perfmagic.profile()``, its energy
against power × time, and the sampler's cost with real NVML."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from gpu_check_record import Check, fmt, pct

COST_S = 5.0
# Stages the CUDA loop must show with the device clock on.
EXPECTED_STAGES = ("data", "h2d", "forward", "backward", "optimizer")


def train(torch: Any, device: str, seconds: float) -> tuple[Any, bool]:
    """A small conv net on synthetic images under perfmagic.profile(); (session, device clock on)."""
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import perfmagic

    cuda = device == "cuda"
    side = 64 if cuda else 16  # the CPU smoke only needs a few steps
    data = TensorDataset(torch.randn(2048, 3, side, side), torch.randint(0, 10, (2048,)))
    loader = DataLoader(
        data,
        batch_size=128,
        shuffle=True,
        num_workers=2,
        pin_memory=cuda,
        persistent_workers=True,
        timeout=60,  # a stuck worker raises instead of hanging the check
    )
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    if cuda:
        torch.cuda.synchronize()  # CUDA initialized before the profile: the device clock needs it
    clock_on = False
    end = time.monotonic() + seconds
    with perfmagic.profile() as session:
        clock_on = session.recorder is not None and session.recorder.device_clock is not None
        while time.monotonic() < end:
            for x, y in loader:
                # the h2d stage: copies from pinned memory, asynchronous
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = loss_fn(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if time.monotonic() >= end:
                    break
    return session, clock_on


def training(check: Check, torch: Any, device: str, seconds: float) -> Any:
    session, clock_on = train(torch, device, seconds)
    report = session.report
    check.write_file("gpu-check-report.txt", str(report) + "\n")
    check.write_file("gpu-check-report.json", report.to_json() + "\n")
    d = report.to_dict()
    steps = d.get("steps") or {}
    stages = d.get("stages") or {}
    print(
        f"steps: {steps.get('count')}  median {fmt(steps.get('median_s'))} s  "
        f"bottleneck: {d.get('bottleneck')}  device clock: {'on' if clock_on else 'OFF'}"
    )
    for name, s in stages.items():
        print(f"  {name:<12} {100 * s['fraction']:5.1f}%  median {1000 * s['median_s']:.2f} ms")
    print("advice:")
    for card in d.get("advice") or []:
        print(f"  [{card['severity']}] {card['id']}: {card['title']}")
    devices = d.get("devices") or []
    for g in devices:
        scalars = {k: v for k, v in g.items() if k.endswith(("_mean", "_w", "_j", "_c", "_mhz", "_p95"))}
        print(
            f"GPU {g['index']} during training: "
            + ", ".join(f"{k}={fmt(v)}" for k, v in scalars.items() if v is not None)
        )
        print(f"GPU {g['index']} N/A: " + (", ".join(k for k, v in scalars.items() if v is None) or "-"))
    warnings = d.get("warnings") or []
    print(f"warnings ({len(warnings)}):")
    for w in warnings[:8]:
        print(f"  - {w[:160]}")
    expected = EXPECTED_STAGES if device == "cuda" else tuple(s for s in EXPECTED_STAGES if s != "h2d")
    missing = [s for s in expected if s not in stages]
    gpu_metrics = any(
        g.get("util_mean") is not None or g.get("mem_used_peak_bytes") is not None for g in devices
    )
    problems = []
    if device == "cuda":
        problems += [] if clock_on else ["device clock off"]
        problems += [] if gpu_metrics else ["no GPU metrics"]
    problems += [f"no {s} stage" for s in missing]
    problems += [] if steps.get("count") else ["no steps"]
    h2d = stages.get("h2d", {}).get("fraction")
    check.record(
        "training",
        not problems,
        f"{steps.get('count')} steps, bottleneck {d.get('bottleneck')}, h2d {pct(h2d)}, "
        f"{len(d.get('advice') or [])} advice card(s)"
        + (f"; PROBLEMS: {', '.join(problems)}" if problems else ""),
    )
    return session


def check_energy(check: Check, session: Any) -> None:
    """The report's joules per step (NVML's counter) against power samples × time over the same steady
    steps: within 5% on a steady loop."""
    import numpy as np

    d = session.report.to_dict()
    energy, analysis = d.get("energy"), session.report.analysis
    if not energy or analysis is None or analysis.steady is None:
        check.record("energy", False, "no energy section (no GPU power samples or no steady steps)")
        return
    print(
        f"energy: {energy['joules']:.1f} J over {energy['seconds']:.1f} s on GPU {energy['gpus']} "
        f"from {energy['source']}; {fmt(energy['joules_per_step'])} J/step, {energy['watts_mean']:.0f} W"
    )
    start, end = analysis.steady.start, analysis.steady.end
    integral = 0.0
    for i in energy["gpus"]:
        t, w = session.timeline.series(f"gpu{i}.power_w")
        keep = (t >= start) & (t <= end) & np.isfinite(w)
        t, w = t[keep], w[keep]
        integral += float(np.sum((w[1:] + w[:-1]) / 2 * np.diff(t))) * (end - start) / max(t[-1] - t[0], 1e-9)
    per_step = integral / analysis.steady.count
    gap = abs(per_step - energy["joules_per_step"]) / per_step if per_step else float("inf")
    print(f"power × time: {per_step:.2f} J/step ({100 * gap:.1f}% apart)")
    check.record(
        "energy",
        energy["source"] == "counter" and gap <= 0.05,
        f"counter {energy['joules_per_step']:.2f} J/step against power × time {per_step:.2f} "
        f"({100 * gap:.1f}%, source {energy['source']})",
    )


def sampler_cost(check: Check, session: Any) -> None:
    from sampler_cost import measure

    from perfmagic.collect.sources import default_sources

    if session is not None:
        sampler = session.timeline.meta.get("sampler") or {}
        wall = session.report.to_dict().get("wall_s") or 0
        if sampler and wall:
            print(
                f"in the training run: {sampler['ticks']} ticks, {100 * sampler['busy_s'] / wall:.2f}% of the wall"
            )
    cost = measure(default_sources(), seconds=COST_S, hz=10.0)
    for w in cost["warnings"]:
        print(f"  warning: {w}")
    _where_the_sampler_spends(default_sources())
    pct = cost["cpu_pct_of_core"]
    summary = f"host+nvml at 10 Hz: {pct:.2f}% of one core, {cost['ms_per_tick']:.3f} ms/tick, {cost['metrics']} metrics"
    print(summary)
    check.record("sampler cost", pct == pct and pct < 2.0, summary)


def _where_the_sampler_spends(sources: list[Any], ticks: int = 20) -> None:
    """The functions the sources' reads spend most time in, over ``ticks`` reads (cProfile)."""
    import cProfile
    import io
    import pstats

    from perfmagic.collect.sampler import SourceUnavailable
    from perfmagic.timeline import Timeline

    timeline, opened = Timeline(), []
    for source in sources:
        with contextlib.suppress(SourceUnavailable):  # no NVML: the host alone
            source.open(timeline)
            opened.append(source)
    sources = opened
    profiler = cProfile.Profile()
    profiler.enable()
    for k in range(ticks):
        for source in sources:
            source.poll(float(k), timeline)
        time.sleep(0.1)  # rates and GPM samples need time between reads, as at 10 Hz
    profiler.disable()
    for source in sources:
        source.close(timeline)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(8)
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-1800:])
