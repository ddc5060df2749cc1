"""A trace's CPU events as perfmagic's own timeline: steps and training stages.

Steps are the ``ProfilerStep#N`` ranges (``prof.step()`` delimits them), as recorded: each one is
an ``other`` span on the main thread (the thread that records them), begun by a
``step:profiler_step_start`` boundary and ended by a ``step:profiler_step`` one, so a gap between
two ranges is in no step; stages nest inside it. In a JAX or TensorFlow trace
(no ``ProfilerStep#``), the steps are the ranges that carry a ``step_num`` argument
(``jax.profiler.StepTraceAnnotation``, ``tf.profiler.experimental.Trace(..., step_num=...)``).
Stages come from what PyTorch records:

- ``data``: ``enumerate(DataLoader)#...__next__``, ``enumerate(DataPipe)#...``; tf.data's
  ``Iterator::Root`` (the consumer waiting for its next element);
- ``h2d``: host-to-device copies: the outermost copy op (``aten::to``, ``aten::_to_copy``,
  ``aten::copy_``) around a CUDA runtime call whose ``correlation`` id is a ``Memcpy HtoD``
  GPU event's (a runtime call outside any copy op is the copy itself);
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
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, blocking ``cudaMemcpy``), except
  those inside a host-to-device copy: a blocking ``.to("cuda")`` syncs to finish its copy,
  so that wait is ``h2d``. Device-to-host copies (``.item()``, ``.cpu()``) stay syncs;
- ``comm``: collectives the main thread calls (``c10d::``, ``nccl:``, ``gloo:``).

The stage recorder's nesting rules hold here too (:func:`perfmagic.schema.nests_inside`):
a stage does not nest in itself, and no built-in stage nests inside ``data`` or ``comm``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from perfmagic.intervals import merge_intervals
from perfmagic.schema import STAGES, STEP_BOUNDARY_PREFIX, nests_inside
from perfmagic.timeline import Timeline
from perfmagic.traces.checks import step_warnings
from perfmagic.traces.events import CpuEvents, KinetoTrace
from perfmagic.traces.nsys_schema import CAPTURE_SUFFIXES
from perfmagic.traces.xplane import INPUT_WAIT_EVENT

PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)$")
BOUNDARY = STEP_BOUNDARY_PREFIX + "profiler_step"
STEP_START = STEP_BOUNDARY_PREFIX + "profiler_step_start"
BACKWARD_EVENT = "autograd::engine::evaluate_function: "
H2D_MEMCPY = "Memcpy HtoD"  # "Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)"
COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})
_NEST_BLOCK = 8192
_OTHER_LABELS = ("h2d", "other", "backward")  # the spans _spans adds besides the staged events, in order

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
"""CUDA runtime calls that make the host wait for the GPU (``cudaMemcpy`` blocks until its copy ends)."""

_EXACT = {
    **{f"## {stage} ##": stage for stage in STAGES if stage != "other"},  # perfmagic --trace writes these
    "## zero_grad ##": "optimizer",
    **dict.fromkeys(SYNC_CALLS, "logging"),
    INPUT_WAIT_EVENT: "data",
}
_PREFIXES = (
    ("enumerate(DataLoader)#", "data"),
    ("enumerate(DataPipe)#", "data"),  # torchdata's DataPipes iterated by hand
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
    """(numbers, starts, ends) of the steps, in time order (µs)."""
    numbers, rows, _ = _step_rows(trace)
    return numbers, trace.cpu.start[rows], trace.cpu.end[rows]


def _step_rows(trace: KinetoTrace) -> tuple[np.ndarray, np.ndarray, bool]:
    """(numbers, CPU event rows, annotated) of the ``ProfilerStep#N`` events, in time order; without any,
    of the events that carry a ``step_num`` (numbered in time order: the reader keeps no argument's
    value), ``annotated`` then True."""
    cpu = trace.cpu
    number = np.full(len(cpu.names), -1, dtype=np.int64)
    for i, name in enumerate(cpu.names):
        m = PROFILER_STEP.match(name)
        if m:
            number[i] = int(m.group(1))
    rows = np.flatnonzero((number >= 0)[cpu.name_id])
    if not len(rows) and trace.step_names:
        annotated = np.array([name in trace.step_names for name in cpu.names], dtype=bool)
        rows = np.flatnonzero(annotated[cpu.name_id])
        rows = rows[np.argsort(cpu.start[rows], kind="stable")]
        return np.arange(len(rows), dtype=np.int64), rows, True
    rows = rows[np.argsort(cpu.start[rows], kind="stable")]
    return number[cpu.name_id[rows]], rows, False


def trace_timeline(trace: KinetoTrace, rank: int) -> Timeline:
    """The timeline of one rank's trace (times in seconds from the trace's first event)."""
    cpu, gpu = trace.cpu, trace.gpu
    counted = trace.aggregates  # a reader that kept only some events counted these over all
    if counted is not None and counted.first_us is not None:
        origin, last = counted.first_us, counted.last_us
    else:  # the allocator's events too: a trace of them alone (profile_memory, no activities) lasts as long
        origin, last = _extent(
            ((cpu.start, cpu.end), (gpu.start, gpu.start + gpu.dur), (trace.memory.start, trace.memory.start))
        )
    step_no, step_rows, annotated = _step_rows(trace)
    step_start, step_end = cpu.start[step_rows], cpu.start[step_rows] + cpu.dur[step_rows]
    main = _main_thread(cpu, step_rows) if counted is None or len(step_rows) else counted.busiest_thread
    spans, labels = _spans(trace, main, (step_start, step_end))
    pid = cpu.threads[main][0] if len(cpu.threads) else None
    warnings = step_warnings(trace, step_no, step_start, step_end, "step" if annotated else "ProfilerStep#")
    seen = {labels[k] for k in np.unique(spans[2]).tolist()}
    framework = _framework(trace.cpu, annotated)
    if framework != "torch":
        warnings.append(
            f"{trace.path.name}: a {framework} trace: its steps are the ranges its step annotations mark, and "
            "a compiled step runs as one program, so its time counts as 'other' (tf.data's waits for input "
            "are 'data'); perfmagic.profile() around the loop records the stages"
        )
    elif len(step_no) and "forward" not in seen:
        how = (
            "record it under perfmagic.profile(), whose NVTX ranges name the stages"
            if trace.path.name.endswith(CAPTURE_SUFFIXES)
            else "wrap the forward in torch.profiler.record_function('## forward ##') to see it"
        )
        warnings.append(
            f"{trace.path.name}: the trace does not show the forward pass (no '## forward ##' or '*.forward' "
            f"record_function, no nn.Module events), so forward time counts as 'other'; {how}"
        )
    timeline = Timeline(
        {
            "source": "trace",
            "framework": framework,
            "rank": rank,
            "world_size": trace.distributed.get("world_size"),
            "backend": trace.distributed.get("backend"),
            "trace_file": str(trace.path),
            "pid": pid if isinstance(pid, int) else None,
            "wall_s": (last - origin) / 1e6 if last is not None else 0.0,
            "epoch": origin / 1e6 + trace.base_time_ns / 1e9,
            "profiler_steps": step_no.tolist(),
            "warnings": warnings,
        }
    )
    for s, e, name, depth in _nest(*spans, labels):
        timeline.add_span(timeline.name_id(name), (s - origin) / 1e6, (e - origin) / 1e6, depth)
    boundary, began = timeline.name_id(BOUNDARY), timeline.name_id(STEP_START)
    for s, e in zip(step_start, step_end, strict=True):
        t = (float(s) - origin) / 1e6
        timeline.add_span(began, t, t, -1)
        t = (float(e) - origin) / 1e6
        timeline.add_span(boundary, t, t, -1)
    timeline.seal()
    return timeline


_Spans = tuple[np.ndarray, np.ndarray, np.ndarray]


def _spans(trace: KinetoTrace, main: int, steps: tuple[np.ndarray, np.ndarray]) -> tuple[_Spans, list[str]]:
    """The spans as columns (start, end, index into the labels) and their labels: the main thread's events
    that have a stage, its host-to-device copies, the ``steps`` (``other``) and backward passes.
    Columns, and the rows that chose them freed here: a capture has hundreds of thousands of steps, and
    a tuple per span cost ~1 KB a step."""
    cpu = trace.cpu
    stage = np.array([stage_of(n) or "" for n in cpu.names], dtype=object)
    on_main = cpu.thread == main
    h2d_start, h2d_end = _h2d_copies(trace, on_main)
    # by name, then per event: an object array of every event's stage would cost more than the events
    rows = np.flatnonzero(on_main & (stage != "")[cpu.name_id])
    # the sync a blocking copy makes is the copy's wait, not a sync of its own
    in_copy = (_holder(cpu.start[rows], h2d_start, h2d_end) >= 0) & (stage == "logging")[cpu.name_id[rows]]
    rows = rows[~in_copy]
    others = ((h2d_start, h2d_end), steps, _backward(trace, main, on_main))
    labels = list(dict.fromkeys([*_OTHER_LABELS, *(x for x in stage.tolist() if x)]))
    code = np.array([labels.index(x) if x else -1 for x in stage.tolist()], np.int16)
    spans = (
        np.concatenate((cpu.start[rows], *(s for s, _ in others))),
        np.concatenate((cpu.start[rows] + cpu.dur[rows], *(e for _, e in others))),
        np.concatenate(
            (
                code[cpu.name_id[rows]],
                np.repeat(np.arange(len(others), dtype=np.int16), [len(s) for s, _ in others]),
            )
        ),
    )
    return spans, labels


def _extent(spans: tuple[tuple[np.ndarray, np.ndarray], ...]) -> tuple[float, float | None]:
    """(first start, last end) over the (starts, ends) pairs: (0, None) when all are empty. Each pair
    apart, as concatenating a trace's every event would copy them all."""
    full = [(s, e) for s, e in spans if len(s)]
    if not full:
        return 0.0, None
    return min(float(s.min()) for s, _ in full), max(float(e.max()) for _, e in full)


def _framework(cpu: CpuEvents, annotated: bool) -> str:
    """Who wrote the trace: ``torch``; ``jax`` or ``tensorflow`` where step annotations, not
    ``ProfilerStep#``, mark its steps (JAX's jitted calls are ``PjitFunction(...)`` events)."""
    if not annotated:
        return "torch"
    return "jax" if any(n.startswith("PjitFunction(") for n in cpu.names) else "tensorflow"


def _main_thread(cpu: CpuEvents, step_rows: np.ndarray) -> int:
    """The thread that records ``ProfilerStep#`` (``step_rows``); else the busiest one."""
    if not len(cpu):
        return -1
    if len(step_rows):
        return int(cpu.thread[step_rows[0]])
    return int(np.bincount(cpu.thread).argmax())


def _h2d_copies(trace: KinetoTrace, on_main: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the main thread's host-to-device copies: disjoint, in time order (µs).

    A copy is the outermost copy op around a runtime call that launched a ``Memcpy HtoD``
    (linked by correlation id), or the call itself where no copy op holds it (an
    extension's own ``cudaMemcpyAsync``).
    """
    cpu, gpu = trace.cpu, trace.gpu
    none = np.zeros(0), np.zeros(0)
    if gpu.correlation is None:
        return none
    htod_ids = [i for i, n in enumerate(gpu.names) if n.startswith(H2D_MEMCPY)]
    htod = gpu.correlation[np.isin(gpu.name_id, htod_ids) & (gpu.correlation >= 0)]
    calls = np.flatnonzero(
        on_main & (cpu.correlation >= 0)
    )  # the calls only: an isin over every row sorts them
    launches = calls[np.isin(cpu.correlation[calls], htod)]
    if not len(launches):
        return none
    copy_ids = [i for i, n in enumerate(cpu.names) if n in COPY_OPS]
    copies = np.flatnonzero(on_main & np.isin(cpu.name_id, copy_ids))
    c_start, c_end = cpu.start[copies], cpu.end[copies]
    order = np.lexsort((-c_end, c_start))  # a parent before the children that start with it
    c_start, c_end = c_start[order], c_end[order]
    # ops on one thread nest, so the outermost ones start after every earlier one has ended
    outer = np.ones(len(c_start), dtype=bool)
    outer[1:] = c_start[1:] >= np.maximum.accumulate(c_end)[:-1]
    c_start, c_end = c_start[outer], c_end[outer]
    l_start, l_end = cpu.start[launches], cpu.end[launches]
    at = _holder(l_start, c_start, c_end)
    held = at >= 0
    used = np.unique(at[held])
    starts = np.concatenate((c_start[used], l_start[~held]))
    ends = np.concatenate((c_end[used], l_end[~held]))
    return merge_intervals(starts, ends)


def _holder(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per time in ``t``, the index of the interval ``[starts, ends)`` holding it, or -1.

    The intervals are disjoint and sorted.
    """
    at = np.searchsorted(starts, t, "right") - 1
    valid = at >= 0
    at[valid] = np.where(t[valid] < ends[at[valid]], at[valid], -1)
    return at


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


def _nest(
    start: np.ndarray, end: np.ndarray, label: np.ndarray, labels: list[str]
) -> Iterator[tuple[float, float, str, int]]:
    """Depth of each span (``labels[label]``) on one thread, children clipped to their parent, recorder
    rules applied; in order of start, the longer first, ties as given."""
    stack: list[tuple[float, str]] = []  # (end, stage) of the open spans
    order = np.lexsort((-end, start))
    for at in range(0, len(order), _NEST_BLOCK):  # Python floats for a block at a time
        block = order[at : at + _NEST_BLOCK]
        for s, e, k in zip(start[block].tolist(), end[block].tolist(), label[block].tolist(), strict=True):
            name = labels[k]
            while stack and stack[-1][0] <= s:
                stack.pop()
            if stack:
                e = min(e, stack[-1][0])
            if e <= s or not nests_inside(name, [open_ for _, open_ in stack]):
                continue
            yield s, e, name, len(stack)
            stack.append((e, name))
