"""What the rules share: the steady-state view of a run, the observed set-up, cards and fix code.

Savings are seconds per steady-state step (the steps after the first, which
carries the warm-up). ``speedup = step / (step - saving)``. Each card states the
model behind its saving in ``metrics["saving_model"]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmagic.advise.card import Card, Severity
from perfmagic.analyze import Analysis, sampled_timeline
from perfmagic.analyze.steps import StepBreakdown
from perfmagic.schema import COMPUTE_STAGES
from perfmagic.timeline import Timeline
from perfmagic.units import KiB, MiB, fmt_bytes, fmt_fraction, fmt_seconds

__all__ = [
    "COMPUTE_STAGES",
    "KiB",
    "MiB",
    "Steady",
    "dataloader_code",
    "fmt_bytes",
    "fmt_fraction",
    "fmt_seconds",
    "gpu_index",
    "gpu_utils",
    "loader",
    "make_card",
    "model",
    "nice_interval",
    "primary_timeline",
    "profiles_whole_process",
    "severity_for",
    "steady",
    "steady_of",
    "usable_cpus",
    "window_mean",
    "worker_cap",
]


HIGH_SAVING = 0.25
"""A card is ``high`` when fixing it saves at least this share of the step…"""
MEDIUM_SAVING = 0.10
"""…``medium`` from this share, ``low`` below."""


@dataclass(frozen=True)
class Steady:
    """The steps after warm-up (the first step is dropped when there are three or more)."""

    first: int  # index of the first steady step in the breakdown
    durations: np.ndarray
    seconds: np.ndarray  # (steps, stages)
    stages: list[str]
    start: float  # the steady window, on the primary timeline's clock
    end: float

    @property
    def count(self) -> int:
        return len(self.durations)

    @property
    def step_s(self) -> float:
        """Mean steady step time: stage means add up to it."""
        return float(self.durations.mean())

    @property
    def median_s(self) -> float:
        return float(np.median(self.durations))

    def stage_s(self, *names: str) -> float:
        """Mean seconds per step spent in the given stages."""
        return sum(float(self.seconds[:, self.stages.index(n)].mean()) for n in names if n in self.stages)

    def share(self, *names: str) -> float:
        return self.stage_s(*names) / self.step_s if self.step_s > 0 else 0.0


def steady(a: Analysis) -> Steady | None:
    """The steady-state steps of the primary process; ``None`` without steps."""
    return steady_of(a.breakdown)


def steady_of(b: StepBreakdown) -> Steady | None:
    """The steady-state steps of one process's breakdown; ``None`` without steps."""
    if not b.count:
        return None
    first = 1 if b.count >= 3 else 0
    return Steady(
        first=first,
        durations=b.durations[first:],
        seconds=b.seconds[first:],
        stages=list(b.stages),
        start=float(b.start[first]),
        end=float(b.end[-1]),
    )


def severity_for(saving_s: float, step_s: float) -> Severity:
    share = saving_s / step_s if step_s > 0 else 0.0
    if share >= HIGH_SAVING:
        return "high"
    if share >= MEDIUM_SAVING:
        return "medium"
    return "low"


def make_card(
    id: str,
    title: str,
    evidence: str,
    fix: str,
    metrics: dict[str, Any],
    *,
    saving_s: float | None,
    step_s: float | None,
    model: str | None,
    severity: Severity | None = None,
) -> Card:
    """A card whose severity (unless given) and speedup follow from its saving."""
    speedup = None
    if saving_s is not None and step_s and step_s > saving_s:
        speedup = step_s / (step_s - saving_s)
    if severity is None:
        severity = severity_for(saving_s or 0.0, step_s or 0.0)
    full = dict(metrics)
    if step_s is not None:
        full["step_s"] = step_s
    if model is not None:
        full["saving_model"] = model
    return Card(id, severity, title, evidence, fix, full, saving_s, speedup)


# -- the observed set-up ------------------------------------------------------


def loader(a: Analysis) -> dict[str, Any] | None:
    """The DataLoader the training iterated, as the hooks recorded it (the largest one seen)."""
    loaders = a.config.dataloaders
    if not loaders:
        return None
    return max(loaders, key=lambda d: d.get("dataset_len") or 0)


def model(a: Analysis) -> dict[str, Any] | None:
    """The outermost model the hooks saw first."""
    return a.config.models[0] if a.config.models else None


def gpu_index(a: Analysis) -> int:
    """The GPU the model lives on (``cuda:1`` → 1; plain ``cuda`` or unknown → 0)."""
    md = model(a)
    device = str(md.get("device") or "") if md else ""
    return int(device.split(":")[1]) if device.startswith("cuda:") else 0


def usable_cpus(a: Analysis) -> int | None:
    """CPUs this process may run on: its affinity, else the machine's count."""
    affinity = a.host.get("affinity")
    if affinity:
        return len(affinity)
    count = a.host.get("cpu_count")
    if count:
        return int(count)
    ld = loader(a)
    return int(ld["cpu_count"]) if ld and ld.get("cpu_count") else None


def worker_cap(a: Analysis) -> int | None:
    """DataLoader workers this machine affords each rank: its CPUs less one for the training loop."""
    cpus = usable_cpus(a)
    if cpus is None:
        return None
    ranks = max(1, sum(1 for r in a.ranks if r.steps.count))
    return max(0, cpus // ranks - 1)


def nice_interval(steps: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is at least ``steps``."""
    k = 1
    while k < steps:
        k = k * 5 // 2 if str(k).startswith("2") else k * 2
    return k


def dataloader_code(ld: dict[str, Any], **changes: Any) -> str:
    """The user's DataLoader call with ``changes`` applied, each change commented with the old value."""
    observed: dict[str, Any] = {
        "batch_size": ld.get("batch_size"),
        "num_workers": ld.get("num_workers") or 0,
        "pin_memory": bool(ld.get("pin_memory")),
        "persistent_workers": bool(ld.get("persistent_workers")),
        "prefetch_factor": ld.get("prefetch_factor"),
        "drop_last": bool(ld.get("drop_last")),
    }
    new = {**observed, **changes}
    if not new["num_workers"]:  # DataLoader rejects these without workers
        new["persistent_workers"] = new["prefetch_factor"] = None
    lines = ["loader = DataLoader(", "    dataset,"]
    for key, value in new.items():
        changed = key in changes and value != observed.get(key)
        if value is None or (value is False and not changed and key not in ("pin_memory",)):
            continue
        note = f"  # was {observed.get(key)!r}" if changed else ""
        lines.append(f"    {key}={value!r},{note}")
    lines += ["    # ...your other arguments (shuffle, sampler, collate_fn) unchanged", ")"]
    return "\n".join(lines)


# -- timelines ----------------------------------------------------------------


def primary_timeline(a: Analysis) -> Timeline | None:
    """The timeline whose steps the analysis reports."""
    pid = next((r.pid for r in a.ranks if r.breakdown is a.breakdown), None)
    for tl in a.timelines:
        if pid is not None and tl.meta.get("pid") == pid:
            return tl
    return a.timelines[0] if len(a.timelines) == 1 else None


def profiles_whole_process(a: Analysis) -> bool:
    """Whether the window starts with the interpreter (``perfmagic run``): start-up then includes
    starting Python and importing the libraries, not only the training's own set-up."""
    primary = primary_timeline(a)
    timelines = [primary] if primary is not None else a.timelines
    return any(tl.meta.get("source") == "run" for tl in timelines)


def gpu_utils(a: Analysis, s: Steady | None) -> list[tuple[dict[str, Any], float]]:
    """Each GPU with utilization samples, with its mean utilization over the steady steps."""
    return [(d, u) for d in a.devices if (u := window_mean(a, f"gpu{d.get('index')}.util", s)) is not None]


def window_mean(a: Analysis, metric: str, s: Steady | None) -> float | None:
    """Mean of a sampled metric over the steady steps (the whole window when too few samples fall there)."""
    tl = sampled_timeline(a.timelines)
    t, v = tl.series(metric)
    ok = np.isfinite(v)
    t, v = t[ok], v[ok]
    if not len(v):
        return None
    if s is not None:
        primary = primary_timeline(a)
        offset = 0.0
        if primary is not None and primary is not tl:
            offset = float(primary.meta.get("epoch", 0.0)) - float(tl.meta.get("epoch", 0.0))
        inside = (t >= s.start + offset) & (t <= s.end + offset)
        if inside.sum() >= 2:
            v = v[inside]
    return float(v.mean())
