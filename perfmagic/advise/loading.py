"""What a data wait is: CPU demand (computing, or queued for a CPU), blocked loaders, or the hand-over.

The verdict reads the account of the loaders' time (``analyze.loading``): the training
thread's fetches, or the workers' own, on a CPU, ready but without one (the scheduler's run
delay), and blocked (disk reads, or asleep: storage over the network, a sleep, a lock).
Waiting for a CPU is CPU demand, never I/O: a busy machine that starves a CPU-bound loader
must not read as slow storage.
"""

from __future__ import annotations

from typing import Literal

from perfmagic.analyze import Analysis
from perfmagic.analyze.loading import LoadingAccount
from perfmagic.units import fmt_fraction

ON_CPU = 0.5
"""Share of its time a loader spends on a CPU above which loading is CPU-bound (below: it waits)."""

SATURATED = 0.8
"""Share of their time workers build batches from which they do not keep up: the step waits for their
loading, whatever the training thread spends taking each batch over; below it, they wait for work,
and the step waits for the hand-over."""

QUEUED_SAYS = 0.05
"""Share of the wait the training thread spent ready but without a CPU worth saying in a CPU-bound verdict."""

Loading = Literal["cpu", "io", "handoff"]


def loading_kind(a: Analysis) -> Loading | None:
    """What the data wait is, from the account of the loaders' time (``Analysis.loading``).

    ``"cpu"``: building batches takes CPU: the loaders computed, or were ready to and waited
    for a CPU (run delay), at least half of their loading time: CPU demand, never I/O;
    ``"io"``: the loaders were blocked (storage, network, sleep, a lock) more than that;
    ``"handoff"``: the workers keep up and the wait is each batch's way over (the training thread
    unpickling it from shared memory, or queued for a CPU to): where the workers timed
    themselves, they were busy under :data:`SATURATED` of their time; else the training thread
    spent at least half its wait on a CPU or queued for one.
    None where unmeasured: without the run delay (no schedstat) the CPU-versus-I/O split is unknown.
    """
    account, ld = a.loading, a.config.loader
    if ld is None or account is None:
        return None
    if account.loaders == "workers" and account.busy is not None:  # the workers timed themselves
        if account.busy < SATURATED:
            return "handoff"  # they keep up: what the step waits for is each batch's way over
    elif account.loaders == "workers":  # else the training thread's wait says it
        share, waiting = a.loop.data_cpu_share, a.loop.data_wait_share
        if share is None or waiting is None:
            return None
        if share + waiting >= ON_CPU:
            return "handoff"  # taking each batch over, or ready to and queued for a CPU: the hand-over's work
    demand = account.cpu_demand
    if demand is None:
        return None
    return "cpu" if demand >= ON_CPU else "io"


def loading_says(a: Analysis, kind: Loading) -> str:
    """The verdict on the loading, in the words of what was measured."""
    account = a.loading
    if kind == "handoff" or account is None:
        return "the wait is the hand-over from the workers"
    if kind == "cpu":
        queued = account.queued or 0.0
        waited = f", and waited for a CPU {fmt_fraction(queued)} of the time" if queued >= QUEUED_SAYS else ""
        return f"loading is CPU-bound: {_loaders(account)[0]} computed{waited}"
    return f"loading is blocked, not computing: {blocked_says(account)}"


def blocked_says(account: LoadingAccount) -> str:
    """Where blocked loaders spent their time: in disk reads, or asleep (a sleep, a lock, the network)."""
    who, was, its = _loaders(account)
    done = (
        f"{who} {was} on a CPU {fmt_fraction(account.cpu)} of {its} loading time and waited for one "
        f"{fmt_fraction(account.queued)}"
    )
    if account.disk is None:
        return f"{done}, and blocked (storage, sleep or a lock) the rest"
    if account.disk >= (account.blocked or 0.0) / 2:
        return f"{done}, and waited on storage (disk reads) {fmt_fraction(account.disk)}"
    return (
        f"{done}, and slept {fmt_fraction(account.sleep)} (a sleep, a lock or the network; disk reads "
        f"{fmt_fraction(account.disk)})"
    )


def _loaders(account: LoadingAccount) -> tuple[str, str, str]:
    """Who loaded, with the verb and possessive that go with it."""
    if account.loaders == "training thread":
        return "the training thread", "was", "its"
    return "the workers", "were", "their"
