"""One-shot check on a GPU machine (``make gpu-check``): everything that needs a real GPU.

Phases, most informative first, each bounded and each reported even when another fails:

1. environment: Python, torch (and whether it is a CUDA build), ``nvidia-smi -L``;
2. NVML probe: every device, which metrics NVML gives and which are N/A, GPM (Hopper and newer),
   the driver's utilization samples, the GPU processes;
3. a real CUDA training loop (small conv net, synthetic data, pinned memory, non-blocking copies,
   ~15 s) under ``perfmagic.profile()``: device clock on?, stage breakdown with ``h2d``, advice;
4. the CUDA paths, one check each: stage times against CUDA events the check records itself, pending
   device marks bounded over 10k steps, ``model.to("cuda")`` in the window is no batch copy, a step
   captured as a CUDA graph, a model compiled before profiling not recompiled, bf16 autocast and the
   caching allocator's figures, a model on a second GPU (where there are two);
5. the sampler's cost with real NVML at 10 Hz (5 s);
6. ``pytest -m gpu`` on the GPU test files (output tail only).

The summary fits on one screen; with ``$OUT`` set it is also written to ``$OUT/gpu-check.txt``,
with the full report (``gpu-check-report.txt``/``.json``) and the pytest log next to it.
A watchdog ends the run after ``--deadline`` seconds (default 300) whatever happens.
Exit status: 0 all checks passed, 1 some failed, 2 no usable CUDA GPU (nothing to check).

Works without installing perfmagic (the repository root goes on ``sys.path``): it needs torch,
numpy, psutil, nvidia-ml-py, nvtx, and for phase 5 pytest and pytest-jupyter.
``--cpu-smoke`` runs phase 3 on the CPU for 2 s, to test this script where there is no GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

GPU_TEST_FILES = ("tests/e2e/test_gpu.py", "tests/e2e/test_stages_torch.py")
TRAIN_S = 15.0
COST_S = 5.0
PYTEST_TIMEOUT_S = 150
SMI_TIMEOUT_S = 20
# Stages the CUDA loop must show with the device clock on.
EXPECTED_STAGES = ("data", "h2d", "forward", "backward", "optimizer")


class Tee:
    """stdout that also goes, line by line, to a file (so a watchdog kill keeps what was said)."""

    def __init__(self, console: TextIO, path: Path | None) -> None:
        self.console = console
        self.file = path.open("w", encoding="utf-8") if path is not None else None

    def write(self, text: str) -> int:
        self.console.write(text)
        if self.file is not None:
            self.file.write(text)
        return len(text)

    def flush(self) -> None:
        self.console.flush()
        if self.file is not None:
            self.file.flush()


class Check:
    """The run's verdicts and the current phase (for the watchdog)."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.phase = "start"
        self.results: dict[str, tuple[bool | None, str]] = {}  # name -> (ok, one-line summary)
        self.child: subprocess.Popen[str] | None = None  # killed with us by the watchdog
        self.started = time.monotonic()

    def record(self, name: str, ok: bool | None, summary: str) -> None:
        self.results[name] = (ok, summary)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        self.phase = name
        t0 = time.monotonic()
        print(f"\n== {name}", flush=True)
        try:
            yield
        except Exception as e:  # one phase failing must not cost the others
            print(f"{name}: FAILED: {type(e).__name__}: {e}")
            tb = traceback.format_exc().rstrip().splitlines()
            print("  " + "\n  ".join(tb[-6:]))
            if name not in self.results:
                self.record(name, False, f"crashed: {type(e).__name__}: {e}")
        finally:
            print(f"({name}: {time.monotonic() - t0:.1f} s)", flush=True)

    def write_file(self, name: str, text: str) -> None:
        if self.out is not None:
            with contextlib.suppress(OSError):
                (self.out / name).write_text(text, encoding="utf-8")

    def verdict(self) -> int:
        print("\n== verdict")
        for name, (ok, summary) in self.results.items():
            mark = "ok  " if ok else ("n/a " if ok is None else "FAIL")
            print(f"[{mark}] {name:<14} {summary}")
        failed = [n for n, (ok, _) in self.results.items() if ok is False]
        print(
            f"gpu-check: {'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} "
            f"({time.monotonic() - self.started:.0f} s)",
            flush=True,
        )
        return 1 if failed else 0


def start_watchdog(check: Check, deadline_s: float) -> None:
    """Give up after ``deadline_s``: say where it hung, then exit (never hold the machine)."""

    def fire() -> None:
        print(f"\ngpu-check: WATCHDOG: still in phase {check.phase!r} after {deadline_s:.0f} s; giving up")
        for name, (ok, summary) in check.results.items():
            print(f"  {name}: {'ok' if ok else 'n/a' if ok is None else 'FAIL'}: {summary}")
        sys.stdout.flush()
        if check.child is not None:
            check.child.kill()
        faulthandler.dump_traceback(file=sys.__stderr__ or sys.stderr, all_threads=True)
        os._exit(3)

    timer = threading.Timer(deadline_s, fire)
    timer.daemon = True
    timer.start()
    # Backstop for a hang that holds the GIL (a stuck driver call): faulthandler's own thread.
    faulthandler.dump_traceback_later(deadline_s + 15, exit=True)


# -- phase 1 ---------------------------------------------------------------------------------


def environment(check: Check) -> Any:
    """Print the software stack; returns the torch module, or None."""
    print(f"python {sys.version.split()[0]}; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
            print("nvidia-smi -L: " + (done.stdout.strip() or done.stderr.strip()).replace("\n", "\n  "))
        except subprocess.TimeoutExpired:
            print(f"nvidia-smi -L: no answer in {SMI_TIMEOUT_S} s (driver hung?)")
    else:
        print("nvidia-smi: not on PATH")
    try:
        import torch
    except ImportError as e:
        print(f"torch: not installed ({e})")
        check.record("cuda", False, "torch is not installed")
        return None
    cuda_build = torch.version.cuda
    available = torch.cuda.is_available()
    print(f"torch {torch.__version__}, CUDA build: {cuda_build or 'none (CPU-only wheel)'}")
    if available:
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        print(f"CUDA devices: {names}")
        check.record("cuda", True, f"torch {torch.__version__} sees {len(names)}: {', '.join(names)}")
    elif cuda_build is None:
        check.record("cuda", False, f"torch {torch.__version__} is a CPU-only build: install a CUDA wheel")
    else:
        check.record("cuda", False, f"torch (CUDA {cuda_build}) finds no usable CUDA GPU")
    return torch


# -- phase 2 ---------------------------------------------------------------------------------


def nvml_probe(check: Check) -> None:
    """What NVML gives on this machine: devices, available vs N/A metrics, GPM, samples, processes."""
    from perfmagic.collect.nvml import READ_KEYS, Nvml
    from perfmagic.collect.nvml_query import NvmlUnavailable

    try:
        nv = Nvml.open()
    except NvmlUnavailable as e:
        print(f"NVML unavailable: {e}")
        check.record("nvml", False, str(e))
        return
    try:
        n = nv.device_count()
        print(f"driver {nv.driver_version}, CUDA driver {nv.cuda_driver_version}, {n} device(s)")
        infos = [nv.static_info(i) for i in range(n)]
        for info in infos:
            mem = info["mem_total_bytes"]
            print(
                f"GPU {info['index']}: {info['name']}  {mem / 2**30 if mem else float('nan'):.0f} GiB  "
                f"cc {info['compute_capability']}  MIG {'on' if info['mig_enabled'] else 'off'}  "
                f"NUMA node {info['numa_node']}  power limit {info['power_limit_w']} W  bus {info['pci_bus_id']}"
            )
            for m in info["mig_instances"]:
                print(f"  MIG {m['uuid']}: {(m['mem_total_bytes'] or 0) / 2**30:.0f} GiB")
        for i in range(n):
            nv.read(i)  # counters need two readings for a rate
        gpm = [i for i in range(n) if nv.start_gpm(i)]
        time.sleep(1.0)
        since = time.time() - 5.0
        available_counts = []
        for i in range(n):
            r = nv.read(i)
            ok = [k for k in READ_KEYS if r[k] is not None]
            na = [k for k in READ_KEYS if r[k] is None]
            available_counts.append(len(ok))
            print(f"GPU {i} available: " + ", ".join(f"{k}={_fmt(r[k])}" for k in ok))
            print(f"GPU {i} N/A: " + (", ".join(na) or "-"))
            samples = nv.samples(i, "gpu_util", since)
            values = [v for _, v in samples]
            in_range = all(0.0 <= v <= 1.0 for v in values)
            print(
                f"GPU {i} driver util samples (last 5 s): {len(values)}"
                + (f", {min(values):.2f}..{max(values):.2f}" if values else "")
                + ("" if in_range else "  <-- NOT in [0, 1]: sample units differ from percent")
            )
            procs = nv.processes(i)
            print(f"GPU {i} processes: {[(p['pid'], p['used_memory_bytes']) for p in procs]}")
        print(f"GPM: {'on for GPU ' + str(gpm) if gpm else 'not available'}")
        for w in nv.warnings:
            print(f"  warning: {w}")
        names = ", ".join(str(info["name"]) for info in infos)
        check.record(
            "nvml",
            n > 0,
            f"{n} device(s) ({names}); metrics available {available_counts} of {len(READ_KEYS)}; "
            f"GPM {'on' if gpm else 'N/A'}; {len(nv.warnings)} warning(s)",
        )
    finally:
        nv.close()


# -- phase 3 ---------------------------------------------------------------------------------


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
        f"steps: {steps.get('count')}  median {_fmt(steps.get('median_s'))} s  "
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
            + ", ".join(f"{k}={_fmt(v)}" for k, v in scalars.items() if v is not None)
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
        f"{steps.get('count')} steps, bottleneck {d.get('bottleneck')}, h2d {_pct(h2d)}, "
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
        f"from {energy['source']}; {_fmt(energy['joules_per_step'])} J/step, {energy['watts_mean']:.0f} W"
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


# -- phase 3b: the CUDA paths, one check each --------------------------------------------------


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
        got = stages.get(name, {}).get("mean_s") or 0.0
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
    stop = session.report.to_dict()
    check.record(
        "pending marks",
        most < DRAIN_AT + 64 and stop["steps"]["count"] == 10_000,
        f"at most {most} pending over 10k steps ({wall:.1f} s, median step {1000 * stop['steps']['median_s']:.3f} ms)",
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
    forward = session.report.to_dict()["stages"].get("forward", {}).get("mean_s") or 0.0
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
    summary = "; ".join(
        f"{k}: "
        + ", ".join(f"{t['value']} {1000 * t['seconds']:.3g} ms" for t in r["tried"])
        + (f" (best {r['best']['value']}, {r['speedup']:.2f}x)" if r.get("best") else "")
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
    mean = {k: (stages.get(k) or {}).get("mean_s") or 0.0 for k in ("backward", "comm")}
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
    gpu = next(d for d in (memory or {}).get("devices", []) if d["device"].startswith("cuda"))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = 2 * params  # exp_avg and exp_avg_sq; the step counters are on the CPU unless capturable
    acts = gpu["activations_bytes"] - x.numel() * x.element_size()  # the input was there before
    ok = (
        gpu["parameters_bytes"] == params
        and gpu["gradients_bytes"] == params
        and gpu["optimizer_state_bytes"] >= moments
        and abs(acts - rise) <= 0.1 * rise
        and gpu["peak_bytes"] <= stats["allocated_bytes.all.peak"]
        and (gpu["reserved_at_peak_bytes"] or 0) <= stats["reserved_bytes.all.peak"]
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


# -- phase 4 ---------------------------------------------------------------------------------


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


# -- phase 5 ---------------------------------------------------------------------------------


def gpu_tests(check: Check) -> None:
    # --noconftest: the suite's conftest loads the Jupyter server fixtures, which a bare GPU image lacks
    # and the GPU tests do not use
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        *GPU_TEST_FILES,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    check.child = proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=PYTEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        check.write_file("gpu-check-pytest.txt", out)
        print("\n".join(out.splitlines()[-10:]))
        check.record("pytest -m gpu", False, f"timed out after {PYTEST_TIMEOUT_S} s")
        return
    finally:
        check.child = None
    check.write_file("gpu-check-pytest.txt", out)
    lines = out.strip().splitlines()
    print("\n".join(lines[-15:]))
    last = lines[-1].strip("= ") if lines else "no output"
    ok = proc.returncode == 0 and " passed" in last  # all skipped: nothing was tested
    check.record("pytest -m gpu", ok, f"{last} (exit {proc.returncode})")


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _pct(v: Any) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, (int, float)) else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadline", type=float, default=300.0, help="watchdog, seconds")
    parser.add_argument("--cpu-smoke", action="store_true", help="phase 3 on the CPU for 2 s (no GPU needed)")
    args = parser.parse_args(argv)

    out_env = os.environ.get("OUT")
    out = Path(out_env) if out_env else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    tee = Tee(sys.stdout, out / "gpu-check.txt" if out is not None else None)
    sys.stdout = tee  # type: ignore[assignment]
    check = Check(out)
    start_watchdog(check, args.deadline)
    try:
        if args.cpu_smoke:
            import torch

            with check.section("training (CPU smoke)"):
                training(check, torch, "cpu", 2.0)
            return check.verdict()
        with check.section("environment"):
            torch = environment(check)
        with check.section("NVML"):
            nvml_probe(check)
        if torch is None or not torch.cuda.is_available():
            print(f"\ngpu-check: no usable CUDA GPU here ({check.results['cuda'][1]}); nothing else to check")
            check.verdict()
            return 2
        session = None
        with check.section(f"training {TRAIN_S:.0f} s under perfmagic.profile()"):
            session = training(check, torch, "cuda", TRAIN_S)
        with check.section("energy: the counter against power × time"):
            check_energy(check, session)
        cuda_paths(check, torch)
        with check.section("sampler cost"):
            sampler_cost(check, session)
        with check.section("pytest -m gpu"):
            gpu_tests(check)
        return check.verdict()
    finally:
        faulthandler.cancel_dump_traceback_later()
        sys.stdout = tee.console
        if tee.file is not None:
            tee.file.close()


if __name__ == "__main__":
    sys.exit(main())
