"""How much of each stage the training thread spent waiting on storage, from sampled states.

Each sampler tick reads the thread's scheduler state with the stage it is in
(``collect.stacks``). In uninterruptible sleep (``D``) a thread waits on the kernel, mostly
on storage: reading a dataset, writing a checkpoint, paging. Only that state is reported: to
read it the sampler must hold the GIL, so a thread running Python code is asleep on the GIL
(``S``) at every reading, and running-versus-asleep is what the sampler makes it; ``D`` is not.

A stage's share is of its samples, over the whole window (as ``hotspots`` are). It is an upper
bound: a tick runs when the sampler gets the GIL, and a thread reading or writing a file has let
it go, so ticks fall in disk waits more often than their share of the time (a loader whose clocks
left 25% of its loading blocked was sampled in ``D`` 58% of the time). The loading account holds
its own share to what the clocks left blocked (``analyze.loading``). A stage seen in fewer than ``MIN_SAMPLES`` ticks
is left out: its share would say little.
"""

from __future__ import annotations

from perfmagic.contract import DiskWait
from perfmagic.schema import THREAD_STATES
from perfmagic.timeline import Timeline

MIN_SAMPLES = 5
"""Ticks a stage needs before its share is reported."""


def disk_waits(timeline: Timeline) -> dict[str, DiskWait]:
    """Per stage, the share of its sampled time the training thread was in uninterruptible sleep."""
    seen: dict[str, list[int]] = {}
    for row in timeline.meta.get(THREAD_STATES) or []:
        counts = seen.setdefault(row["stage"], [0, 0])
        counts[0] += row["count"]
        counts[1] += row["count"] if row["state"] == "D" else 0
    return {
        stage: {"samples": total, "share": disk / total}
        for stage, (total, disk) in seen.items()
        if total >= MIN_SAMPLES
    }
