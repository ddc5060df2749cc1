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
6. the hot path's cost on this machine's CPU, quieter than the dev VM: ``overhead.py``'s 2 ms CPU step
   under the default windowed profile and under its 1% control, each chunk between unprofiled ones
   (rounds for 35 s, its own process);
7. ``pytest -m gpu`` on the GPU test files (output tail only).

Phases 3 and 5 are in ``gpu_check_training.py``, phase 4 in ``gpu_check_cuda.py``; ``gpu_check_record.py``
keeps the verdicts and tees the output.

The summary fits on one screen; with ``$OUT`` set it is also written to ``$OUT/gpu-check.txt``,
with the full report (``gpu-check-report.txt``/``.json``) and the pytest log next to it.
A watchdog ends the run after ``--deadline`` seconds (default 300) whatever happens.
Exit status: 0 all checks passed, 1 some failed, 2 no usable CUDA GPU (nothing to check).

Works without installing perfmagic (the repository root goes on ``sys.path``): it needs torch,
numpy, psutil, nvidia-ml-py, nvtx, and for phase 5 pytest and pytest-jupyter.
``--cpu-smoke`` runs phase 3 on the CPU for 2 s and phase 6 for two short rounds, to test this
script where there is no GPU.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gpu_check_cuda import cuda_paths
from gpu_check_record import Check, Tee, fmt
from gpu_check_training import check_energy, sampler_cost, training

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

GPU_TEST_FILES = ("tests/e2e/test_gpu.py", "tests/e2e/test_stages_torch.py")
TRAIN_S = 15.0
PYTEST_TIMEOUT_S = 150
OVERHEAD_BUDGET_S = 35  # of rounds, after the imports and warm-up: under OVERHEAD_TIMEOUT_S on a slow CPU
CONTROL = "control +1%"  # overhead.py's check of itself (not imported: it imports torch)
OVERHEAD_TIMEOUT_S = 60
OVERHEAD_TARGET = 0.01
SMI_TIMEOUT_S = 20


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
            print(f"GPU {i} available: " + ", ".join(f"{k}={fmt(r[k])}" for k in ok))
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


# -- phase 6 ---------------------------------------------------------------------------------


def hot_path_cost(check: Check, judged: bool = True) -> None:
    """``overhead.py``'s windowed mode on the CPU, in a process of its own (no CUDA context, no threads
    of the checks before), rounds for ``OVERHEAD_BUDGET_S``, each printed as it ends. Not ``judged`` (a
    smoke run: two short rounds): the figure is recorded as n/a, whatever it is."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "overhead.json"
        cmd = [
            sys.executable,
            str(ROOT / "benchmarks" / "overhead.py"),
            *("--modes", f"perfmagic windowed,{CONTROL}", "--json", str(result)),
            *(
                ("--rounds", "1000", "--seconds", str(OVERHEAD_BUDGET_S))
                if judged
                else ("--rounds", "2", "--steps", "20", "--skip", "10")
            ),
        ]
        check.child = proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_with_root_on_path(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            timer = threading.Timer(OVERHEAD_TIMEOUT_S, proc.kill)
            timer.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                print("  " + line.rstrip(), flush=True)
            proc.wait()
            timer.cancel()
        finally:
            check.child = None
        if proc.returncode != 0 or not result.exists():
            check.record(
                "hot path",
                False,
                f"overhead.py ended with exit {proc.returncode} (killed after {OVERHEAD_TIMEOUT_S} s?)",
            )
            return
        figures = json.loads(result.read_text())
    mode, control = figures["modes"]["perfmagic windowed"], figures["modes"][CONTROL]
    check.record(
        "hot path",
        mode["overhead"] <= OVERHEAD_TARGET if judged else None,
        f"windowed profile {100 * mode['overhead']:+.2f}% ± {100 * mode['error']:.2f} on a "
        f"{1e3 * figures['unprofiled_step_s']:.2f} ms CPU step, windows of 5 in {figures['period']} (waits {100 * mode['wait']:+.2f}%; the method read "
        f"its 1% control as {100 * control['overhead']:+.2f}% ± {100 * control['error']:.2f}, its spins took "
        f"{100 * control['spun']:+.2f}%; target <= 1%)",
    )


# -- phase 7 ---------------------------------------------------------------------------------


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
    check.child = proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_with_root_on_path(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
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


def _with_root_on_path() -> dict[str, str]:
    """The environment for a child that imports perfmagic from the repository (no install needed)."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


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
            with check.section("hot path (CPU smoke)"):
                hot_path_cost(check, judged=False)
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
        with check.section("hot path: the default profile's cost on this machine's CPU"):
            hot_path_cost(check)
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
