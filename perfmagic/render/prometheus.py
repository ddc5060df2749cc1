"""A monitor snapshot in Prometheus' text exposition format, under dcgm-exporter's names and labels.

GPU series carry dcgm-exporter's metric names, units and labels (``gpu``, ``UUID``, ``device``,
``modelName``, ``Hostname``, ``pci_bus_id``), so dashboards and alerts built on it read perfmagic's
the same way. Host series are perfmagic's own (``perfmagic_host_*``). A value NVML did not give
(N/A on this GPU) is left out, never written as zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

Json = dict[str, Any]

MiB = 1 << 20
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (name, type, help, value from a snapshot GPU), in dcgm-exporter's units: %, MiB, W, mJ, MHz, C,
# ratios 0-1 for the profiling (DCP) fields, bytes per second for PCIe and NVLink
GPU_METRICS: tuple[tuple[str, str, str, Callable[[Json], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: _scaled(g.get("util_gpu"), 100)),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        lambda g: _scaled(g.get("util_mem"), 100),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        lambda g: _scaled(g.get("mem_used_bytes"), 1 / MiB),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        lambda g: _free_mib(g),
    ),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: g.get("power_w")),
    (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "gauge",
        "Power management limit (in W).",
        lambda g: g.get("power_limit_w"),
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda g: _scaled(g.get("energy_j"), 1000),
    ),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda g: g.get("sm_clock_mhz")),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda g: g.get("mem_clock_mhz")),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: g.get("temperature_c")),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*).",
        lambda g: g.get("throttle_mask"),
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        lambda g: g.get("sm_active"),
    ),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        lambda g: g.get("sm_occupancy"),
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda g: g.get("tensor_active"),
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        lambda g: g.get("dram_bw_util"),
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
        "payloads - in bytes per second.",
        lambda g: g.get("pcie_tx_bytes_per_s"),
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data "
        "payloads - in bytes per second.",
        lambda g: g.get("pcie_rx_bytes_per_s"),
    ),
    (
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
        lambda g: g.get("nvlink_tx_bytes_per_s"),
    ),
    (
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
        lambda g: g.get("nvlink_rx_bytes_per_s"),
    ),
)

HOST_METRICS: tuple[tuple[str, str, str], ...] = (
    ("perfmagic_host_cpu_util", "cpu_util", "Busy share of all CPUs since the last read (0-1)."),
    ("perfmagic_host_cpu_count", "cpu_count", "Logical CPUs."),
    ("perfmagic_host_load1", "load_avg_1m", "Load average over one minute."),
    (
        "perfmagic_host_mem_used_bytes",
        "mem_used_bytes",
        "Memory held by applications (total less available).",
    ),
    ("perfmagic_host_mem_total_bytes", "mem_total_bytes", "Physical memory."),
)


def exposition(
    gpus: Iterable[Json],
    host: Json | None,
    hostname: str,
    nvml_up: bool,
    sessions: Iterable[Json] = (),
    processes: Iterable[Json] = (),
) -> str:
    """The text format (version 0.0.4) of one snapshot's GPUs and host, and of the profiling sessions
    running on the machine (:func:`perfmagic.registry.running_sessions`); lost GPUs are left out.

    ``perfmagic_nvml_up`` says whether GPUs could be read at all: a scrape without GPU series is
    then a machine without NVML, not a machine without GPUs. ``processes`` (each GPU's, as
    :func:`perfmagic.server.snapshot.read_processes` lists them) tie a session to the GPUs it runs on.
    """
    live = [g for g in gpus if not g.get("lost")]
    host_label = f'Hostname="{_escaped(hostname)}"'
    lines = _family(
        "perfmagic_nvml_up",
        "gauge",
        "Whether NVML could be read (1) or not (0).",
        [(host_label, int(nvml_up))],
    )
    for name, kind, text, value_of in GPU_METRICS:
        lines += _family(name, kind, text, [(_gpu_labels(g, hostname), value_of(g)) for g in live])
    for name, key, text in HOST_METRICS:
        lines += _family(name, "gauge", text, [(host_label, (host or {}).get(key))])
    lines += _training(list(sessions), hostname, _watts_by_pid(live, processes))
    return "\n".join(lines) + "\n"


def _watts_by_pid(gpus: list[Json], processes: Iterable[Json]) -> dict[int, float]:
    """Each process's GPUs' power drawn now, summed (a GPU shared by two processes counts for both)."""
    power = {g["index"]: w for g in gpus if (w := _finite(g.get("power_w"))) is not None}
    out: dict[int, float] = {}
    for p in processes:
        watts = power.get(p.get("gpu_index", -1))
        if watts is not None:
            out[int(p["pid"])] = out.get(int(p["pid"]), 0.0) + watts
    return out


def _family(name: str, kind: str, text: str, samples: list[tuple[str, Any]]) -> list[str]:
    """One metric's HELP, TYPE and a line per (labels, value) with a finite value; nothing without any."""
    lines = [
        f"{name}{{{labels}}} {_number(v)}" for labels, value in samples if (v := _finite(value)) is not None
    ]
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *lines] if lines else []


def _training(sessions: list[Json], hostname: str, watts: dict[int, float]) -> list[str]:
    """Each profiled process's steps, pace, seconds per stage, bottleneck, current stage and joules per
    sample, labelled with its rank and node."""
    labelled = [(s, _session_labels(s, hostname)) for s in sessions]
    return [
        *_family(
            "perfmagic_training_joules_per_sample",
            "gauge",
            "Joules per training sample now: the power of the GPUs a profiled process runs on over "
            "the samples it takes per second (ten seconds).",
            [
                (la, watts[int(s["pid"])] / rate)
                for s, la in labelled
                if int(s["pid"]) in watts and (rate := s.get("samples_per_s"))
            ],
        ),
        *_family(
            "perfmagic_training_steps_total",
            "counter",
            "Training steps a profiled process has ended.",
            [(la, s["steps"]) for s, la in labelled],
        ),
        *_family(
            "perfmagic_training_steps_per_second",
            "gauge",
            "Steps a profiled process ended per second, over ten seconds.",
            [(la, s.get("steps_per_s")) for s, la in labelled],
        ),
        *_family(
            "perfmagic_training_stage_seconds_total",
            "counter",
            "Seconds the ended steps of a profiled process spent in each stage (shares over a window: "
            "rate of one stage over the rate of all).",
            [
                (f'{la},stage="{_escaped(stage)}"', seconds)
                for s, la in labelled
                for stage, seconds in sorted((s.get("stage_seconds") or {}).items())
            ],
        ),
        *_family(
            "perfmagic_training_bottleneck",
            "gauge",
            "The stage the last ten seconds' steps spent most time in (1).",
            [
                (f'{la},stage="{_escaped(str(s["bottleneck"]))}"', 1)
                for s, la in labelled
                if s.get("bottleneck")
            ],
        ),
        *_family(
            "perfmagic_training_stage",
            "gauge",
            "The stage a profiled process is in now (1 for that stage).",
            [(f'{la},stage="{_escaped(str(s.get("stage") or "other"))}"', 1) for s, la in labelled],
        ),
    ]


def _session_labels(session: Json, hostname: str) -> str:
    labels = {"Hostname": hostname, "pid": str(session["pid"]), "program": str(session.get("program") or "")}
    for key in ("rank", "local_rank", "node_rank", "world_size"):
        if session.get(key) is not None:
            labels[key] = str(session[key])
    return ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())


def _gpu_labels(gpu: Json, hostname: str) -> str:
    labels = {
        "gpu": str(gpu.get("index")),
        "UUID": str(gpu.get("uuid") or ""),
        "device": f"nvidia{gpu.get('index')}",
        "modelName": str(gpu.get("name") or ""),
        "Hostname": hostname,
        "pci_bus_id": str(gpu.get("pci_bus_id") or ""),
    }
    return ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def _free_mib(gpu: Json) -> float | None:
    used, total = gpu.get("mem_used_bytes"), gpu.get("mem_total_bytes")
    return None if used is None or total is None else (total - used) / MiB


def _finite(value: Any) -> float | None:
    """The value as a float where it is a finite number; None where NVML gave none (N/A)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)
