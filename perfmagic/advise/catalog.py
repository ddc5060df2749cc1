"""The rule catalog: every advice id, in a stable order; cards come out most valuable first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from perfmagic.advise import (
    data,
    distributed,
    gpu,
    gpu_checks,
    host,
    host_memory,
    loop,
    memory,
    pace,
    startup,
    storage,
)
from perfmagic.advise.card import SERIOUS, SEVERITIES, Card
from perfmagic.advise.energy import with_energy_savings
from perfmagic.advise.plan import Plan, plan_of
from perfmagic.analyze import Analysis

Rule = Callable[[Analysis], "Card | None"]

MINOR_SAVING = 0.02
"""A fix that would save less than this share of a step is not worth a card: the rule is listed instead."""

RULES: list[Rule] = [
    data.input_bound,
    data.dataloader_workers,
    data.pin_memory,
    data.preprocess_in_loop,
    storage.io_bound,
    storage.small_files,
    host.cpu_contention,
    host.host_memory_pressure,
    gpu.gpu_memory_pressure,
    memory.activation_memory,
    memory.optimizer_memory,
    memory.weight_memory,
    memory.allocator_fragmentation,
    host_memory.dataloader_copy_on_read,
    host_memory.pinned_memory_held,
    host_memory.swap_growth,
    host_memory.host_embedding,
    gpu.low_gpu_util,
    gpu.launch_bound,
    gpu_checks.gpu_gaps,
    gpu_checks.sync_copies,
    gpu.jit_compile,
    gpu.amp,
    gpu.tf32,
    loop.sync_logging,
    loop.checkpoint_frequency,
    distributed.comm_bound,
    distributed.rank_straggler,
    distributed.gpu_imbalance,
    distributed.data_parallel,
    host.numa_affinity,
    startup.slow_startup,
    pace.step_outliers,
    pace.compute_bound,
]
"""One rule per advice id; a rule's ``__name__`` is its id."""

STAGE_OF = {
    "input_bound": "data",
    "dataloader_workers": "data",
    "io_bound": "data",
    "small_files": "data",
    "pin_memory": "h2d",
    "preprocess_in_loop": "other",
    "sync_logging": "logging",
    "checkpoint_frequency": "checkpoint",
    "comm_bound": "comm",
    "compute_bound": "forward backward optimizer",
    "launch_bound": "forward backward optimizer",
    "amp": "forward backward",
    "tf32": "forward backward",
    "jit_compile": "forward backward",
    "host_embedding": "forward",
}
"""The stages an advice id is about (the others are about the machine or the whole step)."""

SYMPTOMS = frozenset({"input_bound", "low_gpu_util", "compute_bound"})
"""Rules that measure what the step lacks (a data wait, an idle GPU), not a cause to fix: in the plan
they come after the fixes, which their cards refer to, and take what those leave."""

_GPU_RULES = "low_gpu_util, gpu_memory_pressure, gpu_imbalance, launch_bound, amp, tf32, pin_memory"
_GPU_TELEMETRY_RULES = "gpu_memory_pressure, gpu_imbalance, amp, tf32, pin_memory"
_HOST_RULES = "cpu_contention, host_memory_pressure, io_bound, small_files, numa_affinity"
_CONFIG_RULES = "dataloader_workers, pin_memory, amp, tf32, jit_compile, data_parallel"


@dataclass(frozen=True)
class Advice:
    """The cards, most valuable first, and what the rules could not say."""

    cards: list[Card] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    minor: list[Card] = field(default_factory=list)  # fired, but would save under MINOR_SAVING of a step
    plan: Plan | None = None  # the cards' fixes in order, their savings marginal (None: no steady steps)


def advise(analysis: Analysis) -> Advice:
    """The cards of every rule that fired, as one plan (:mod:`perfmagic.advise.plan`): by estimated
    saving (ties: severity, then catalog order), each saving what the cards before it left.

    A card whose fix would save under ``MINOR_SAVING`` of a step is not shown, only listed
    in ``minor``. ``compute_bound`` is kept only when no card of medium or high severity fired. Each
    rule runs on its own: one that fails costs its card, said in a warning, never the
    report. The warnings also say what the rules could not see.
    """
    cards: list[Card] = []
    warnings: list[str] = []
    for rule in RULES:
        try:
            card = rule(analysis)
        except Exception as e:  # a rule's bug must not cost the user the report
            warnings.append(
                f"advice rule {rule.__name__} failed ({type(e).__name__}: {e}): its card is missing"
            )
            continue
        if card is not None:
            cards.append(card)
    order = {c.id: i for i, c in enumerate(cards)}
    cards.sort(key=lambda c: (-(c.saving_s or 0.0), SEVERITIES.index(c.severity), order[c.id]))
    if any(c.severity in SERIOUS for c in cards if not _minor(c)):
        cards = [c for c in cards if c.id != "compute_bound"]
    plan, cards = plan_of(cards, analysis.steady, STAGE_OF, SYMPTOMS)
    # a symptom stays, its saving what the fixes before it leave: the data wait a worker cannot remove
    minor = [c for c in cards if _minor(c) and c.id not in SYMPTOMS]
    shown = {c.id for c in cards} - {c.id for c in minor}
    cards = with_energy_savings([c for c in cards if c.id in shown], analysis.energy, analysis.steady)
    warnings += [w for w in missing(analysis) if w not in analysis.warnings]
    return Advice(cards, warnings, minor, plan)


def _minor(card: Card) -> bool:
    """A per-step saving too small for a card (a one-time cost, ``metrics["one_time_s"]``, is weighed by its rule)."""
    step = card.metrics.get("step_s")
    if card.saving_s is None or not step or "one_time_s" in card.metrics:
        return False
    return bool(card.saving_s < MINOR_SAVING * step)


def missing(analysis: Analysis) -> list[str]:
    """What was not measured that some rules need, and what would enable it."""
    out: list[str] = []
    if not analysis.steps.count:
        return out  # the analysis already says that no steps were seen
    # a trace's copies say which came from pinned memory, which pin_memory reads without telemetry or hooks
    fed = {"pin_memory"} if analysis.gpu and analysis.gpu["h2d_copies"] else set()

    def silent(rules: str) -> str:
        return ", ".join(r for r in rules.split(", ") if r not in fed)

    trace = analysis.source == "trace"
    if not analysis.devices and (trace or analysis.gpu is not None):
        out.append(
            f"GPU telemetry rules ({silent(_GPU_TELEMETRY_RULES)}) stayed silent: a trace carries no NVML samples "
            "(perfmagic run or perfmagic.profile() records them)"
        )
    elif not analysis.devices:
        out.append(f"GPU rules ({_GPU_RULES}) stayed silent: no NVIDIA GPU was seen through NVML")
    elif analysis.gpu is None:
        out.append("launch_bound stayed silent: it needs a GPU kernel trace (perfmagic run --trace)")
    if analysis.host["cpu_util_mean"] is None:
        out.append(
            f"host rules ({_HOST_RULES}) stayed silent: no host samples were recorded"
            + (
                " (a trace has none)"
                if trace or (analysis.gpu is not None and not analysis.devices)
                else " (sampler off)"
            )
        )
    # the set-up rules read PyTorch's models and DataLoaders: TensorFlow and JAX have none to see
    if (
        analysis.framework in (None, "torch")
        and not analysis.config.models
        and not analysis.config.dataloaders
    ):
        out.append(
            f"set-up rules ({silent(_CONFIG_RULES)}) stayed silent: "
            + (
                "a trace records no models or DataLoaders (perfmagic.profile() or perfmagic run sees them)"
                if trace
                else "the PyTorch hooks saw no model or DataLoader "
                "(profile the training with perfmagic.profile() or perfmagic run)"
            )
        )
    return out
