"""The DataLoader worker model: how many workers a machine affords, and the step they give.

A batch takes one process ``load_s`` to build, ``load_cpu_s`` of it on a CPU; the rest of the
step takes ``rest_s``, ``rest_cpu_s`` of it on a CPU. With ``w`` workers the step is the longest
of three limits:

- the rest of the step (the training loop itself), plus taking each batch over from a worker;
- a batch every ``(load_s + worker cost) / w`` (each worker builds one batch at a time, and
  passes it through queues and shared memory);
- all the CPU work of a step, spread over the CPUs the training's busy processes get: one each
  while they are no more than the CPUs, else a fair share beside the other processes' load.

So CPU-bound loading gains from workers only as far as CPUs are free, and loading that waits
on storage or sleeps gains from many workers per CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfmagic.advise.host import others_cores
from perfmagic.advise.loading import loading_kind
from perfmagic.analyze import Analysis
from perfmagic.analyze.steady import Steady
from perfmagic.schema import CHILDREN_CPU, LOADER_BATCHES, LOADER_BUSY_CPU
from perfmagic.tuning.loader import IO_WORKERS_PER_CPU, MAX_WORKERS

HANDOFF_S = 7e-4
"""An estimate of the training thread's CPU seconds to take one batch over from a worker (unpickle
it, map its tensors' shared memory): 0.6-0.8 ms for a batch of two tensors on this project's 2-core
machine. Only a loop that already has workers shows its own (``loading_kind`` ``"handoff"``)."""
WORKER_BATCH_S = 1.9e-3
"""An estimate of what a batch costs a worker beyond building it: the index and the batch through
queues and shared memory. One worker of an in-memory dataset delivered a batch every 2.0-2.3 ms on
this project's 2-core machine, against 0.1-0.2 ms to build it in the loop."""
PARALLEL_EFFICIENCY = 0.6
"""An estimate of the share of a CPU that CPU-bound loading gains from each CPU beyond the first
(shared caches, memory bandwidth, clock boost): two workers loaded 1.6x as fast as the loop on
this project's 2-core machine. Tuning (``tune=True``) measures the machine's own."""
HANDOFF_SHARE = 0.10
"""Data wait that is the hand-over of batches from busy-enough workers worth a card: below it, the
usual cost of workers (each batch is pickled through shared memory and rebuilt in the training process)."""
STEP_MODEL = (
    "step = max(rest of step + taking a batch over, (load time + a worker's cost) per batch / workers,"
    " CPU work of a step / CPUs the training gets beside other processes); the costs of workers and"
    " of CPUs beyond the first are estimates"
)
NEAR_BEST = 1.05
"""The fewest workers whose step is within this factor of the best step: a worker beyond them
costs memory and start-up for nothing."""


@dataclass(frozen=True)
class LoaderModel:
    """The loading and the rest of the step as measured, on ``cpus`` CPUs beside ``others`` busy cores."""

    wait_s: float
    rest_s: float
    workers: int
    load_cpu_s: float  # CPU seconds per batch of loading
    rest_cpu_s: float  # CPU seconds per step of the rest
    cpus: int  # usable by this rank
    others: float  # cores other processes kept busy
    batch_s: float | None = None  # one worker's seconds per batch, as the workers timed it
    worker_cost_s: float = WORKER_BATCH_S  # a worker's cost per batch beyond building it

    @property
    def load_s(self) -> float:
        """One process's seconds per batch: without workers the wait itself; with them, as the workers
        timed it plus their cost per batch, else ``w * (wait + rest)`` (each worker busy all the time)."""
        if not self.workers:
            return self.wait_s
        if self.batch_s is not None:
            return self.batch_s + self.worker_cost_s
        return self.workers * (self.wait_s + self.rest_s)

    def cpus_for(self, workers: int) -> float:
        """CPUs' worth of work the loop and ``workers`` busy workers get: one each where the CPUs go
        round (else a fair share beside the others' load), each beyond the first at
        :data:`PARALLEL_EFFICIENCY`."""
        ours = workers + 1
        share = ours * min(1.0, self.cpus / (ours + self.others))
        return min(share, 1.0) + max(0.0, share - 1.0) * PARALLEL_EFFICIENCY

    @property
    def handoff_s(self) -> float:
        """Taking a batch over from a worker, added by the first worker (with workers, the wait holds it)."""
        return HANDOFF_S if not self.workers else 0.0

    def step_with(self, workers: int, extra_load_s: float = 0.0) -> float:
        """The step with ``workers`` workers, ``extra_load_s`` of the loop's CPU work moved into loading."""
        rest = self.rest_s - extra_load_s + self.handoff_s
        cpu = self.load_cpu_s + self.rest_cpu_s + self.handoff_s
        per_batch = self.load_s + extra_load_s + (WORKER_BATCH_S if not self.workers else 0.0)
        return max(rest, per_batch / workers, cpu / self.cpus_for(workers))

    def workers_needed(self, extra_load_s: float = 0.0) -> int | None:
        """Workers that keep up with the step (``None`` when nothing else is left in the step)."""
        rest = self.rest_s - extra_load_s
        return math.ceil((self.load_s + extra_load_s) / rest) if rest > 0 else None

    def best_workers(self, cap: int, extra_load_s: float = 0.0) -> int:
        """The fewest workers, up to ``cap``, whose step is within :data:`NEAR_BEST` of the best."""
        counts = range(max(1, self.workers), max(cap, self.workers, 1) + 1)
        steps = {w: self.step_with(w, extra_load_s) for w in counts}
        best = min(steps.values())
        return min(w for w, step in steps.items() if step <= best * NEAR_BEST)


@dataclass(frozen=True)
class MoreWorkers:
    """The worker count this machine affords for the data wait, and what it saves."""

    loading: LoaderModel
    workers: int  # recommended
    needed: int  # that would keep up
    cap: int  # that this machine affords
    step_s: float  # the step with ``workers``

    @property
    def wait_left_s(self) -> float:
        """The data wait left with the recommended workers, beyond taking each batch over."""
        left = self.step_s - self.loading.rest_s - self.loading.handoff_s
        return left if left > 0.01 * self.step_s else 0.0  # beneath that, the model's rounding


def usable_cpus(a: Analysis) -> int | None:
    """CPUs this process may run on: its affinity, else the machine's count."""
    affinity = a.host["affinity"]
    if affinity:
        return len(affinity)
    count = a.host["cpu_count"]
    if count:
        return int(count)
    ld = a.config.loader
    return ld.cpu_count if ld and ld.cpu_count else None


def rank_cpus(a: Analysis) -> int | None:
    """Usable CPUs per training rank on this machine."""
    cpus = usable_cpus(a)
    if cpus is None:
        return None
    ranks = max(1, sum(1 for r in a.ranks if r.steps.count))
    return max(1, cpus // ranks)


def io_worker_cap(a: Analysis) -> int | None:
    """Workers that wait on storage this machine affords: several per CPU, as far as memory allows.

    Each worker is a process with its own copy of what the Dataset references: its share
    of the tree's peak memory, against half the memory that was still available.
    """
    cpus = usable_cpus(a)
    if cpus is None:
        return None
    cap = min(MAX_WORKERS, IO_WORKERS_PER_CPU * cpus)
    ld = a.config.loader
    workers = ld.num_workers if ld else 0
    rss, available = (
        a.host["uss_peak_bytes"] or a.host["rss_peak_bytes"],
        a.host["mem_available_min_bytes"],
    )
    if rss and available:
        per_process = rss / (workers + 1)
        cap = min(cap, workers + int(0.5 * available / per_process))
    return max(cap, workers)


def loader_model(a: Analysis, s: Steady) -> LoaderModel:
    """The loader model of the steady steps; CPU time counts as the whole where it was not measured."""
    ld = a.config.loader
    workers = ld.num_workers if ld else 0
    wait = s.stage_s("data")
    rest = s.step_s - wait
    on_cpu = a.loop.data_cpu_share
    loop_cpu = float(s.cpu_s.mean()) if s.cpu_s is not None else None
    children = a.steady_mean("host.children_cpu_cores")
    if workers:  # the loop's CPU time includes taking batches over, inside the wait
        load_cpu = children * s.step_s if children is not None else workers * (wait + rest)
        rest_cpu = min(s.step_s, loop_cpu) if loop_cpu is not None else rest
    else:
        load_cpu = wait * on_cpu if on_cpu is not None else wait
        rest_cpu = min(rest, max(0.0, loop_cpu - load_cpu)) if loop_cpu is not None else rest
    batch_s, cost = _timed_batch(a)
    return LoaderModel(
        wait, rest, workers, load_cpu, rest_cpu, rank_cpus(a) or 1, others_cores(a) or 0.0, batch_s, cost
    )


def _timed_batch(a: Analysis) -> tuple[float | None, float]:
    """(one worker's seconds per batch, its cost per batch beyond that) as the workers timed them: the
    cost is the workers' CPU outside their fetches (pickling, queues), per batch; else the estimates."""
    account = a.loading
    if account is None or account.batch_s is None:
        return None, WORKER_BATCH_S
    children, fetching = a.steady_mean(CHILDREN_CPU), a.steady_mean(LOADER_BUSY_CPU)
    batches = a.steady_mean(LOADER_BATCHES)
    if children is None or fetching is None or not batches:
        return account.batch_s, WORKER_BATCH_S
    return account.batch_s, max(0.0, children - fetching) / batches


def more_workers(a: Analysis, s: Steady) -> MoreWorkers | None:
    """More DataLoader workers, when the machine affords more and they would shorten the step."""
    kind = loading_kind(a)
    if kind == "handoff":
        return None  # the workers keep up: more of them take nothing off the wait
    ld = a.config.loader
    if kind == "io" and ld and ld.num_workers and s.share("data") < HANDOFF_SHARE:
        return None  # idle workers and a small wait: hand-over cost and slow reads look the same here
    cap = io_worker_cap(a) if kind == "io" else rank_cpus(a)
    if ld is None or cap is None:
        return None
    m = loader_model(a, s)
    if m.workers >= cap:
        return None
    needed = m.workers_needed() or cap
    workers = m.best_workers(cap)
    after = m.step_with(workers)
    if workers <= m.workers or after >= s.step_s:
        return None
    return MoreWorkers(m, workers, needed, cap, after)
