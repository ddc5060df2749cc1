"""The names every layer shares: stages and their nesting, step boundaries, metrics and marks.

Collectors write these names into a timeline, the analysis reads them and
renderers show them; keeping them here lets each layer import them without
importing another layer.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final, Literal

# -- stages ------------------------------------------------------------------

STAGES = ("data", "h2d", "forward", "backward", "optimizer", "checkpoint", "logging", "comm", "other")
"""Built-in stage names, in the order reports list them."""

COMPUTE_STAGES = ("forward", "backward", "optimizer")
"""The stages that are the model's own work."""

OPAQUE_STAGES = frozenset({"data", "checkpoint", "comm"})
"""Stages inside which no built-in stage is recorded (see :func:`nests_inside`)."""


def nests_inside(stage: str, open_stages: Collection[str]) -> bool:
    """Whether ``stage`` is recorded when ``open_stages`` are open: the nesting rules.

    - a stage does not nest in itself (a module called inside a module is one
      ``forward``);
    - nothing built in nests inside ``data``, ``checkpoint`` or ``comm``: a transform
      that is an ``nn.Module`` is part of loading the batch, and the syncs inside a
      collective are its wait, not logging; user stages still nest, since the user
      asked for them.

    The stage recorder applies the same rules with stage ids on its hot path.
    """
    if stage in open_stages:
        return False
    return stage not in STAGES or OPAQUE_STAGES.isdisjoint(open_stages)


# -- steps -------------------------------------------------------------------

STEP_BOUNDARY_PREFIX = "step:"
"""Zero-length spans named ``step:<kind>`` mark step boundaries (their kinds: ``perfmagic.step_policy``)."""


# -- metrics -----------------------------------------------------------------

_GPU_METRIC = re.compile(r"gpu(\d+)\.")


def gpu_metric(name: str) -> tuple[int, str] | None:
    """``"gpu3.util"`` → ``(3, "util")``: the GPU and the quantity of a GPU metric; None for any other."""
    m = _GPU_METRIC.match(name)
    return (int(m.group(1)), name[m.end() :]) if m else None


THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock",
    0x200: "board_limit",
    0x400: "reliability",
}
"""NVML clocks-event-reason bits of ``gpu{i}.throttle_mask``, by name."""

MEMORY_METRICS: Final = {"PSS": "host.pss_bytes", "RSS": "host.rss_bytes"}
"""The profiled process tree's memory, summed over its processes (``collect.host``): its PSS, each page
shared by several processes split among them (what it holds), else its RSS (each counted by each)."""


def memory_kind(pss_peak_bytes: float | None) -> Literal["PSS", "RSS"]:
    """The one memory measure a report shows: PSS where it was measured, else RSS."""
    return "PSS" if pss_peak_bytes else "RSS"


MEMORY_NAME: Final = "process memory"
"""What every report, chart and panel calls that memory, its measure after it: ``process memory (PSS)``."""


def memory_name(kind: str) -> str:
    """``process memory (PSS)``: the name and the measure, as charts and panels label the memory."""
    return f"{MEMORY_NAME} ({kind})"


THREAD_PREFIX = "thread."
"""Counters of the profiled thread, sampled at step ends (not by the sampler; cumulative)."""
THREAD_CPU = "thread.cpu_s"
"""Cumulative CPU seconds of the profiled thread, sampled at step boundaries at least 10 ms apart…"""
THREAD_WAIT = "thread.wait_s"
"""…and the seconds it was runnable but waited for a CPU (NaN where the OS does not say)."""
THREAD_GC = "thread.gc_s"
"""…and the seconds Python's garbage collector ran on it."""
THREAD_SAMPLES = "thread.samples"
"""Samples the training thread has taken from DataLoaders so far (a batch's leading dimension)."""

THREAD_TOKENS = "thread.tokens"
"""Token ids among them so far: a batch's ``input_ids``, or its one 2-D integer tensor (padding included)."""

THREAD_DATA_CPU = "thread.data_cpu_s"
"""Cumulative CPU seconds the profiled thread spent getting the batches it timed (those at least 10 ms
apart: a CPU clock read costs a fast loop), sampled after each…"""

THREAD_DATA_TIMED = "thread.data_timed_s"
"""…and the cumulative wall seconds of those fetches."""

THREAD_DATA_WAIT = "thread.data_wait_s"
"""…and the cumulative seconds of them it was runnable but waited for a CPU (NaN where the OS does not say)."""

RECORDING: Final = "recording.full"
"""Where the stage hooks recorded in windows were installed (1) or removed (0) (``collect.schedule``): steps
between an install and the next removal are recorded fully, the others only at their ends. Never thinned:
a change is 16 bytes, two a window (a mark, as records before it held, is 300)."""

LOADER_BATCHES = "loader.batches_per_s"
"""Batches DataLoader workers built per second (``collect.worker_load``)…"""
LOADER_BUSY = "loader.busy_workers"
"""…workers building a batch, on average (the rest of their time they wait for work)…"""
LOADER_BUSY_CPU = "loader.busy_cpu_cores"
"""…of that, the cores they computed on…"""
LOADER_BUSY_QUEUED = "loader.busy_queued_cores"
"""…and the cores' worth of time they were runnable but waited for one (NaN where the OS does not say)."""
CHILDREN_CPU = "host.children_cpu_cores"
"""Cores the processes under the training's computed on (DataLoader workers; ``collect.host``)…"""
CHILDREN_QUEUED = "host.children_wait_cores"
"""…the cores' worth of time they were runnable but waited for one…"""
CHILDREN_DISK = "host.children_disk"
"""…and how many of them were in uninterruptible sleep (``D``, mostly disk I/O) at a tick."""
LOADER_THREAD_DISK = "loader.thread_disk"
"""Sampled while the training thread is in ``data``: 1 where it was in uninterruptible sleep (``D``,
mostly disk I/O), else 0 (``collect.stacks``)."""

STACK_SAMPLES: Final = "stack_samples"
"""``timeline.meta`` key: where the training thread was at each sampler tick, ``[{"stage", "count",
"function", "file", "line", "cell", "where"}, ...]``: the innermost frame of the user's code, named as
the user knows it (``perfmagic.places``: ``function (In [2], line 29)``, ``function (train.py:12)``)."""

BEFORE_FIRST_STEP: Final = "startup"
"""The stage of :data:`STACK_SAMPLES` taken before the first step boundary: where the start-up went."""

WORKER_STACKS: Final = "worker_stacks"
"""``timeline.meta`` key: where the DataLoader workers forked in the window were while they built
batches, ``{"workers", "samples", "places": [{"count", "function", "file", ...}, ...]}``
(``collect.worker_stacks``)."""

MAJOR_FAULTS: Final = "host.major_faults_per_s"
"""The process tree's major page faults per second: pages read back from swap or from a file (Linux)."""
SWAP_USED: Final = "host.swap_used_bytes"
"""The machine's swap in use (``collect.host``, every slow tick)."""
PINNED_BYTES: Final = "host.pinned_bytes"
"""Page-locked host memory PyTorch's CUDA host allocator holds (``collect.cuda``; torch >= 2.6)."""

WORKER_MEMORY: Final = "worker_memory"
"""``timeline.meta`` key: each DataLoader worker forked in the window, its USS as its first fetch began
and at its last reading, and the samples it read between them, ``[{"pid", "first_uss_bytes",
"last_uss_bytes", "samples"}, ...]`` (``collect.worker_load``)."""

THREAD_STATES: Final = "thread_states"
"""``timeline.meta`` key: the training thread's scheduler state at each sampler tick, by stage,
``[{"stage", "state", "count"}, ...]`` (``state``: ``/proc``'s letter, ``R``, ``S``, ``D``, ...)."""

# -- marks -------------------------------------------------------------------

ALLOCATOR: Final = "cuda_allocator"
"""``timeline.meta`` key: PyTorch's caching allocator per GPU over the window, ``[{"index",
"allocated_peak_bytes", "reserved_peak_bytes", "alloc_retries", "ooms"}, ...]`` (``collect.cuda``)."""

TORCH_TRACE_MARK = "torch_trace"
"""Mark a ``--trace`` collector leaves at the instant of the trace's ``clock_name`` event; ``path`` of the trace."""

EVALUATION_MARK = "evaluation"
"""An evaluation pass (validation, test, prediction, sanity check) at its start: ``seconds``, ``kind``."""

TRAINER_MARK = "trainer"
"""A training framework drove the loop: ``trainer`` (its name), ``version``, ``settings`` (what its fixes
are written in)."""

TRAINERS = ("transformers.Trainer", "lightning.Trainer", "lightning.Fabric", "accelerate", "keras.Model.fit")
"""The report's ``trainer`` names; when several drove the loop (HF's Trainer drives an Accelerator), the
first of them here is the one the user wrote against."""

TF_DATA_MARK = "tf_data"
"""A tf.data pipeline was iterated: ``ops`` (its datasets' kinds, last first), ``serial_maps``,
``parallel_maps``, ``prefetch``, ``cache`` (``collect.tfdata``)."""
