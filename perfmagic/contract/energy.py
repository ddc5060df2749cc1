"""The report's ``energy`` section: what the steady steps cost in joules, and in money where priced."""

from __future__ import annotations

from typing import Literal, TypedDict

EnergySource = Literal["counter", "power_integral", "counter_and_power"]
"""Where the joules come from: NVML's total-energy counter (Volta and newer), power samples integrated
over time, or the counter with power × time for the stretches where it stalled or went back."""

GpusBasis = Literal["processes", "framework", "all"]
"""How the GPUs counted were chosen: NVML's process lists (the GPUs the training processes use), the
framework's device (no process list, as in some containers), or every GPU (neither known)."""

StageBasis = Literal["measured", "model"]


class StageEnergy(TypedDict):
    """One stage's energy over the steady steps (``energy.by_stage[stage]``)."""

    joules: float
    watts: float  # its mean power: joules over its seconds
    basis: StageBasis  # measured over the samples it held alone, or the power model's


class Energy(TypedDict):
    """Joules over the steady steps, summed over the GPUs counted (``energy``)."""

    joules: float
    seconds: float  # the stretch they were measured over (the steady steps)
    joules_per_step: float | None
    joules_per_sample: float | None
    joules_per_token: float | None
    watts_mean: float
    gpus: list[int]  # their NVML indices (each node's, in turn, for a job merged from several)
    gpu_count: int
    nodes: int  # the nodes whose samplers were summed (1 but for `perfmagic merge`)
    gpus_basis: GpusBasis
    source: EnergySource
    segments: int  # stretches of the counter between resets (1: it only rose)
    by_stage: dict[str, StageEnergy]  # {} without steps
    by_stage_model: str | None  # the power model for stages too short to measure; None: all measured
    idle_w: float | None  # the GPUs' power while idle, and while busy, from the samples (model)
    busy_w: float | None
    idle_joules: float | None  # the GPUs' energy while they had no kernel to run (estimate)
    power_cap_w: float | None  # an input-bound run's cap that would not lengthen the step (estimate)
    price_per_gpu_hour: float | None  # as given; None: no money figures
    cost_per_hour: float | None
    cost_per_sample: float | None
    cost_per_epoch: float | None
