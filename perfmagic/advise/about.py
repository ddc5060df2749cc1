"""What each advice id is about: the stages whose time it explains, its cause, and when it is gone.

A problem is a stage (or group of stages) and a cause: the data stage waiting because loading is too
slow is one, whichever card says it (``input_bound``, ``dataloader_workers``). Read from report
dictionaries alone, so a comparison of reports read back from JSON and the headline agree with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmagic.advise.catalog import STAGE_OF
from perfmagic.advise.data import INPUT_SHARE, PIN_H2D_SHARE, PREPROCESS_SHARE
from perfmagic.advise.distributed import COMM_SHARE
from perfmagic.advise.loop import CHECKPOINT_SHARE, LOGGING_SHARE
from perfmagic.advise.pace import COMPUTE_SHARE
from perfmagic.advise.storage import IO_DATA_SHARE
from perfmagic.contract import Card, MinorCard


@dataclass(frozen=True)
class About:
    """What one advice id is about, beside its stages (``catalog.STAGE_OF``)."""

    cause: str  # why its stages take long, in a few words
    threshold: (
        float | None
    )  # the share of the step its stages reach when it fires (None: not a stage's share)
    explains: tuple[str, ...] = ()  # other stages this cause lengthens (a crowded machine: the loaders')
    fault: bool = True  # False: a state, not a fault (compute-bound): never "resolved"


ABOUT: dict[str, About] = {
    "input_bound": About("slow loading", INPUT_SHARE),
    "dataloader_workers": About("slow loading", INPUT_SHARE),
    "io_bound": About("storage", IO_DATA_SHARE),
    "small_files": About("storage", IO_DATA_SHARE),
    "pin_memory": About("host-to-device copies", PIN_H2D_SHARE),
    "preprocess_in_loop": About("preprocessing in the loop", PREPROCESS_SHARE),
    "sync_logging": About("logging", LOGGING_SHARE),
    "checkpoint_frequency": About("checkpoints", CHECKPOINT_SHARE),
    "comm_bound": About("communication", COMM_SHARE),
    "compute_bound": About("compute", COMPUTE_SHARE, fault=False),
    "launch_bound": About("kernel launches", None),
    "amp": About("float32 math", None),
    "tf32": About("float32 math", None),
    "jit_compile": About("recompilation", None),
    # loaders starved of CPU: input_bound leaves the wait to this card (the model's own work is no wait to explain)
    "cpu_contention": About("CPU contention", None, explains=("data",)),
    "host_memory_pressure": About("host memory", None),
    "gpu_memory_pressure": About("device memory", None),  # one problem with the breakdown's cards
    "activation_memory": About("device memory", None),
    "optimizer_memory": About("device memory", None),
    "weight_memory": About("device memory", None),
    "allocator_fragmentation": About("device memory", None),
    "dataloader_copy_on_read": About("host memory", None),
    "pinned_memory_held": About("host memory", None),
    "swap_growth": About("swapping", None),
    "host_embedding": About("embedding lookups on the host", None),
    "low_gpu_util": About("idle GPU", None),
    "gpu_gaps": About("GPU starvation gaps", None),
    "sync_copies": About("synchronous copies", None),
    "rank_straggler": About("a straggler rank", None, explains=("comm",)),
    "gpu_imbalance": About("unbalanced GPUs", None),
    "data_parallel": About("DataParallel", None),
    "numa_affinity": About("NUMA placement", None, explains=("data", "h2d")),
    "slow_startup": About("start-up", None),
    "step_outliers": About("slow steps", None),
}
"""Every rule of the catalog (``tests/unit`` holds it to that)."""

STAGE_RULE = {
    "data": "input_bound",
    "h2d": "pin_memory",
    "forward": "compute_bound",
    "backward": "compute_bound",
    "optimizer": "compute_bound",
    "logging": "sync_logging",
    "checkpoint": "checkpoint_frequency",
    "comm": "comm_bound",
}
"""The rule that measures a stage's own share: the problem a headline names when no card does."""

UNTRACKED = About("untracked work", PREPROCESS_SHARE)
"""The ``other`` stage as a headline names it: time in no known stage, a problem from the share at
which host work in the loop is worth moving (``preprocess_in_loop``, which is about the same stage)."""


def about(id: str) -> About:
    """What ``id`` is about; an id this version does not know (an older or newer report's) is its own cause."""
    return ABOUT.get(id) or About(id, None)


def stages_of(id: str) -> tuple[str, ...]:
    """The stages ``id`` is about; () for the machine or the whole step."""
    return tuple(STAGE_OF.get(id, "").split())


def stage_problem(stage: str) -> tuple[tuple[str, ...], About]:
    """The stages and cause a headline names when no card is about ``stage``: its own rule's, where one
    measures it, else the stage alone (untracked work, or the user's own stage)."""
    rule = STAGE_RULE.get(stage)
    if rule is not None:
        return stages_of(rule), ABOUT[rule]
    return (stage,), UNTRACKED if stage == "other" else About(f"your stage “{stage}”", None)


def addresses(card: Card | MinorCard, stage: str) -> bool:
    """The card is about ``stage``: its catalog stages, or the stage its metrics name (the straggler's,
    the host stage an idle GPU waits for)."""
    metrics: dict[str, Any] = card["metrics"] if "metrics" in card else {}  # a minor card has none
    named = (metrics.get("stage"), metrics.get("top_host_stage"))
    return stage in stages_of(card["id"]) or stage in named


def explains(card: Card | MinorCard, stage: str) -> bool:
    """The card names a cause that lengthens ``stage`` (a crowded machine starves the loaders)."""
    return stage in about(card["id"]).explains
