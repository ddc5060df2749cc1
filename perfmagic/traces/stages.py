"""A trace's CPU events as perfmagic's own timeline: steps and training stages.

Steps are the ``ProfilerStep#N`` ranges (``prof.step()`` delimits them): each one is
an ``other`` span on the main thread (the thread that records them), ended by a
``step:profiler_step`` boundary; stages nest inside it. Stages come from what
PyTorch records:

- ``data``: ``enumerate(DataLoader)#...__next__``;
- every built-in stage: its ``## stage ##`` annotation (``perfmagic --trace`` writes one per
  stage it records, so a report of its own trace has its stages);
- ``forward``: ``## forward ##`` annotations, ``*.forward`` labels (DDP, FSDP) and
  ``nn.Module: ...`` Python events (``with_stack=True``); a trace without any leaves
  forward time in ``other`` and says so;
- ``backward``: the autograd engine's ``evaluate_function`` events (on CUDA they run on
  the engine's own thread while the main thread waits), joined across the short
  gaps in which the main thread did nothing else; ``## backward ##`` annotations;
- ``optimizer``: ``Optimizer.step#...``, ``Optimizer.zero_grad#...``, ``## optimizer ##``,
  ``## zero_grad ##``;
- ``logging``: explicit synchronizations (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, blocking ``cudaMemcpy``);
- ``comm``: collectives the main thread calls (``c10d::``, ``nccl:``, ``gloo:``).

The stage recorder's nesting rules hold here too (:func:`perfmagic.schema.nests_inside`):
a stage does not nest in itself, and no built-in stage nests inside ``data`` or ``comm``.
"""

from __future__ import annotations

import re

import numpy as np

from perfmagic.intervals import merge_intervals
from perfmagic.schema import STAGES, STEP_BOUNDARY_PREFIX, nests_inside
from perfmagic.timeline import Timeline
from perfmagic.traces.kineto import CpuEvents, KinetoTrace

PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)$")
BOUNDARY = STEP_BOUNDARY_PREFIX + "profiler_step"
BACKWARD_EVENT = "autograd::engine::evaluate_function: "

_EXACT = {
    **{f"## {stage} ##": stage for stage in STAGES if stage != "other"},  # perfmagic --trace writes these
    "## zero_grad ##": "optimizer",
    "cudaStreamSynchronize": "logging",
    "cudaDeviceSynchronize": "logging",
    "cudaEventSynchronize": "logging",
    "cudaMemcpy": "logging",
}
_PREFIXES = (
    ("enumerate(DataLoader)#", "data"),
    ("Optimizer.step#", "optimizer"),
    ("Optimizer.zero_grad#", "optimizer"),
    ("nn.Module: ", "forward"),
    ("c10d::", "comm"),
    ("nccl:", "comm"),
    ("gloo:", "comm"),
)


def stage_of(name: str) -> str | None:
    """The stage a CPU event's name stands for, or None."""
    stage = _EXACT.get(name)
    if stage is not None:
        return stage
    for prefix, stage in _PREFIXES:
        if name.startswith(prefix):
            return stage
    return "forward" if name.endswith(".forward") else None


def profiler_steps(trace: KinetoTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(numbers, starts, ends) of the ``ProfilerStep#N`` events, in time order (µs)."""
    numbers, rows = _step_rows(trace.cpu)
    return numbers, trace.cpu.start[rows], trace.cpu.end[rows]


def _step_rows(cpu: CpuEvents) -> tuple[np.ndarray, np.ndarray]:
    """(numbers, CPU event rows) of the ``ProfilerStep#N`` events, in time order."""
    number = np.full(len(cpu.names), -1, dtype=np.int64)
    for i, name in enumerate(cpu.names):
        m = PROFILER_STEP.match(name)
        if m:
            number[i] = int(m.group(1))
    rows = np.flatnonzero(number[cpu.name_id] >= 0)
    rows = rows[np.argsort(cpu.start[rows], kind="stable")]
    return number[cpu.name_id[rows]], rows


def trace_timeline(trace: KinetoTrace, rank: int) -> Timeline:
    """The timeline of one rank's trace (times in seconds from the trace's first event)."""
    cpu, gpu = trace.cpu, trace.gpu
    cpu_end = cpu.end
    starts = np.concatenate((cpu.start, gpu.start))
    ends = np.concatenate((cpu_end, gpu.start + gpu.dur))
    origin = float(starts.min()) if len(starts) else 0.0
    step_no, step_rows = _step_rows(cpu)
    step_start, step_end = cpu.start[step_rows], cpu_end[step_rows]
    main = _main_thread(cpu, step_rows)
    stage = np.array([stage_of(n) or "" for n in cpu.names], dtype=object)
    on_main = cpu.thread == main

    rows = np.flatnonzero(on_main & (stage[cpu.name_id] != ""))
    names = stage[cpu.name_id[rows]].tolist()
    spans = list(zip(cpu.start[rows].tolist(), cpu_end[rows].tolist(), names, strict=True))
    spans += [(float(s), float(e), "other") for s, e in zip(step_start, step_end, strict=True)]
    backward = _backward(trace, main, on_main)
    spans += [(float(s), float(e), "backward") for s, e in zip(*backward, strict=True)]

    pid = cpu.threads[main][0] if len(cpu.threads) else None
    warnings = []
    seen = {s for _, _, s in spans}
    if len(step_no) and "forward" not in seen:
        warnings.append(
            f"{trace.path.name}: the trace does not show the forward pass (no '## forward ##' or '*.forward' "
            "record_function, no nn.Module events), so forward time counts as 'other'; wrap the forward "
            "in torch.profiler.record_function('## forward ##') to see it"
        )
    timeline = Timeline(
        {
            "source": "trace",
            "framework": "torch",
            "rank": rank,
            "world_size": trace.distributed.get("world_size"),
            "backend": trace.distributed.get("backend"),
            "trace_file": str(trace.path),
            "pid": pid if isinstance(pid, int) else None,
            "wall_s": (float(ends.max()) - origin) / 1e6 if len(ends) else 0.0,
            "epoch": origin / 1e6 + trace.base_time_ns / 1e9,
            "profiler_steps": step_no.tolist(),
            "warnings": warnings,
        }
    )
    for s, e, name, depth in _nest(spans):
        timeline.add_span(timeline.name_id(name), (s - origin) / 1e6, (e - origin) / 1e6, depth)
    boundary = timeline.name_id(BOUNDARY)
    for e in step_end:
        t = (float(e) - origin) / 1e6
        timeline.add_span(boundary, t, t, -1)
    return timeline


def _main_thread(cpu: CpuEvents, step_rows: np.ndarray) -> int:
    """The thread that records ``ProfilerStep#`` (``step_rows``); else the busiest one."""
    if not len(cpu):
        return -1
    if len(step_rows):
        return int(cpu.thread[step_rows[0]])
    return int(np.bincount(cpu.thread).argmax())


def _backward(trace: KinetoTrace, main: int, on_main: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Backward passes: the autograd engine's work, joined across gaps where the main thread was idle.

    While ``loss.backward()`` runs, the main thread only waits; so a gap between engine
    events belongs to the backward pass unless the main thread started something in it.
    """
    cpu = trace.cpu
    if main < 0:
        return np.zeros(0), np.zeros(0)
    engine_ids = [i for i, n in enumerate(cpu.names) if n.startswith(BACKWARD_EVENT)]
    pid = cpu.threads[main][0]
    same_process = np.array([t[0] == pid for t in cpu.threads], dtype=bool)[cpu.thread]
    engine = np.isin(cpu.name_id, engine_ids) & same_process
    s, e = merge_intervals(cpu.start[engine], cpu.end[engine])
    if len(s) < 2:
        return s, e
    main_starts = np.sort(cpu.start[on_main & ~engine])
    started = np.searchsorted(main_starts, s[1:], "left") - np.searchsorted(main_starts, e[:-1], "right")
    keep = np.concatenate(([True], started > 0))  # an interval starts a new pass after a busy gap
    heads = np.flatnonzero(keep)
    tails = np.append(heads[1:] - 1, len(s) - 1)
    return s[heads], e[tails]


def _nest(spans: list[tuple[float, float, str]]) -> list[tuple[float, float, str, int]]:
    """Depth of each span on one thread, children clipped to their parent, recorder rules applied."""
    out: list[tuple[float, float, str, int]] = []
    stack: list[tuple[float, str]] = []  # (end, stage) of the open spans
    for s, e, name in sorted(spans, key=lambda x: (x[0], -x[1])):
        while stack and stack[-1][0] <= s:
            stack.pop()
        if stack:
            e = min(e, stack[-1][0])
        if e <= s or not nests_inside(name, [open_ for _, open_ in stack]):
            continue
        out.append((s, e, name, len(stack)))
        stack.append((e, name))
    return out
