"""What a data wait is: CPU demand (computing, or queued for a CPU), blocked loaders, or the hand-over.

The training thread's fetches are timed on its CPU clock and its run delay (the
scheduler's ``schedstat``): the time it ran, the time it was ready but had no CPU,
and the rest, when it was blocked (storage, network, sleep, a lock, workers that
have not delivered). Waiting for a CPU is CPU demand, never I/O: a busy machine
that starves a CPU-bound loader must not read as slow storage.
"""

from __future__ import annotations

from typing import Literal

from perfmagic.analyze import Analysis
from perfmagic.units import fmt_fraction

ON_CPU = 0.5
"""Share of its time a loader spends on a CPU above which loading is CPU-bound (below: it waits)."""

QUEUED_SAYS = 0.05
"""Share of the wait the training thread spent ready but without a CPU worth saying in a CPU-bound verdict."""

Loading = Literal["cpu", "io", "handoff"]


def loading_kind(a: Analysis) -> Loading | None:
    """What the data wait is, from where the loaders' time went while the training thread waited.

    ``"cpu"``: building batches takes CPU: the training thread's own, or workers busy, and
    threads that waited for a CPU (run delay) count as CPU demand, never as I/O;
    ``"io"``: the loaders are blocked (storage, network, sleep, a lock) more than they
    compute or queue for a CPU;
    ``"handoff"``: the workers keep up and the training thread spends the wait taking
    each batch over (unpickling it from shared memory).
    None where unmeasured: without the run delay (no schedstat) the CPU-versus-I/O split is unknown.
    """
    share, waiting = a.loop.data_cpu_share, a.loop.data_wait_share
    ld = a.config.loader
    if share is None or waiting is None or ld is None:
        return None
    workers = int(ld.get("num_workers") or 0)
    if not workers:
        return "cpu" if share + waiting >= ON_CPU else "io"
    if share + waiting >= ON_CPU:
        return "handoff"  # taking each batch over, or ready to and queued for a CPU: the hand-over's work
    cores, starved = a.steady_mean("host.children_cpu_cores"), a.steady_mean("host.children_wait_cores")
    if cores is None or starved is None:
        return None
    return "cpu" if (cores + starved) / workers >= ON_CPU else "io"


_LOADING_SAYS = {
    "cpu": "loading is CPU-bound: the loaders compute{queued}",
    "io": "loading is blocked (storage, sleep or a lock): the training thread was on a CPU only {share} of "
    "the wait and waited for one {waiting}",
    "handoff": "the wait is the hand-over from the workers",
}


def loading_says(a: Analysis, kind: Loading) -> str:
    """The verdict on the loading, in the words of what was measured."""
    waiting = a.loop.data_wait_share or 0.0
    queued = f", and waited for a CPU {fmt_fraction(waiting)} of the time" if waiting >= QUEUED_SAYS else ""
    return _LOADING_SAYS[kind].format(
        share=fmt_fraction(a.loop.data_cpu_share), waiting=fmt_fraction(waiting), queued=queued
    )
