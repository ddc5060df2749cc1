"""Reports from traces that ``torch.profiler`` already wrote (``perfmagic report``)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import re
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from perfmagic.analyze import analyze
from perfmagic.analyze.gpu import memory_peaks, trace_gpu
from perfmagic.analyze.gpu_tally import GpuTally
from perfmagic.analyze.ranks import collective_skew, collective_starts
from perfmagic.report import Report, build_report
from perfmagic.timeline import Timeline
from perfmagic.traces.checks import dropped_warning
from perfmagic.traces.events import KinetoTrace
from perfmagic.traces.kineto import TraceFormatError, read_trace, trace_of_document
from perfmagic.traces.nsys import read_capture
from perfmagic.traces.nsys_schema import CAPTURE_SUFFIXES, REPORT_SUFFIXES
from perfmagic.traces.stages import trace_timeline
from perfmagic.traces.xplane import xplane_document

TRACE_SUFFIXES = (".json", ".json.gz", ".xplane.pb", *CAPTURE_SUFFIXES)
"""What a trace file's name ends with (``*.pt.trace.json.gz`` included; ``.xplane.pb``: TensorFlow's and
JAX's profilers, read through TensorFlow's converter; ``.sqlite``, ``.nsys-rep``: Nsight Systems)."""

POOL_MIN_JSON_BYTES = 64 << 20
"""Below this much JSON in all, the traces are read in this process: a spawned worker takes ~0.3 s to start."""
GZIP_RATIO = 20  # JSON bytes per gzipped byte of a Kineto trace, about (13-20 on the shared traces)
WORKER_BYTES = 64 << 20  # a worker process before it reads anything
WORKER_BYTES_PER_JSON_BYTE = (
    0.5  # its peak grows by about this per byte of the trace's JSON (measured 0.2-0.6)
)


def trace_paths(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The trace files named, a directory standing for every trace in it (sorted by name)."""
    out: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            out.append(path)
            continue
        found = sorted(p for p in path.iterdir() if p.name.endswith(TRACE_SUFFIXES) and p.is_file())
        # JAX writes <host>.trace.json.gz beside <host>.xplane.pb: the same trace, read once
        converted = {
            p.name.removesuffix(".trace.json.gz") for p in found if p.name.endswith(".trace.json.gz")
        }
        found = [p for p in found if p.name.removesuffix(".xplane.pb") not in converted]
        # an Nsight report beside its own export: the same capture, read once (from the export)
        exported = {p.name.removesuffix(".gz").removesuffix(".sqlite") for p in found if ".sqlite" in p.name}
        found = [p for p in found if not (p.name.endswith(REPORT_SUFFIXES) and p.stem in exported)]
        if not found:
            raise TraceFormatError(
                f"{path}: no trace files (*.json, *.json.gz, *.xplane.pb, *.sqlite, *.nsys-rep) in this directory"
            )
        out += found
    return out


def report_from_traces(paths: Sequence[str | os.PathLike[str]], step_range: str | None = None) -> Report:
    """One report from one trace per rank (a directory: every trace in it).

    ``step_range``: in Nsight Systems captures, a regular expression for the NVTX ranges that are
    the steps (:func:`perfmagic.traces.nsys.read_capture`).

    The ``gpu`` section is the primary rank's (the one the step figures come from);
    each rank's own is in ``ranks[i]["gpu"]``; ``collective_skew`` says which ranks
    reach the collectives last. Many traces are read in parallel worker processes, as
    many as the CPUs and the memory allow. Raises :class:`TraceFormatError` on a file
    that is not a readable trace, or on two files of the same rank.
    """
    files = trace_paths(paths)
    if not files:
        raise TraceFormatError("no trace given")
    read = _read_ranks(files, pool_size(files), step_range)
    ranks = [r.rank for r in read]
    for i, rank in enumerate(ranks):
        if rank in ranks[:i]:
            other = read[ranks.index(rank)].path
            raise TraceFormatError(
                f"{read[i].path} and {other} are both rank {rank}: give one trace per rank"
            )
    # analyze() takes the primary rank's GPU figures (and each rank's) from timeline.meta["gpu"]
    analysis = analyze([r.timeline for r in read])
    skew = collective_skew({r.rank: r.collectives for r in read})
    return build_report(dataclasses.replace(analysis, collective_skew=skew), source="trace")


def _read_ranks(files: list[Path], workers: int, step_range: str | None) -> list[_RankTrace]:
    """The ranks of ``files``: one per trace, one per process of an Nsight capture that ran GPU work."""
    if workers > 1:
        # forked where that is safe (Linux, one thread): no imports to repeat and the caller's
        # script is not run again; else spawned (a notebook kernel has threads running)
        forked = sys.platform == "linux" and threading.active_count() == 1
        context = multiprocessing.get_context("fork" if forked else "spawn")
        try:
            with ProcessPoolExecutor(workers, mp_context=context) as pool:
                read = pool.map(_read_rank, files, range(len(files)), [step_range] * len(files))
                return [rank for ranks in read for rank in ranks]
        except BrokenProcessPool:
            pass  # workers could not start (a script without a __main__ guard): read them here
    return [rank for i, p in enumerate(files) for rank in _read_rank(p, i, step_range)]


def pool_size(files: Sequence[Path]) -> int:
    """Worker processes for reading ``files``: 1 (in this process) for little JSON, else as many as
    the CPUs and half the available memory hold, each worker's peak estimated from the largest file."""
    sizes = np.array([_json_bytes(p) for p in files], dtype=np.float64)
    if len(files) < 2 or sizes.sum() < POOL_MIN_JSON_BYTES:
        return 1
    peak = worker_peak_bytes(files)
    budget = psutil.virtual_memory().available / 2
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, len(files), int(budget // peak)))


def worker_peak_bytes(files: Sequence[Path]) -> float:
    """The memory a process reading ``files`` one at a time is expected to peak at: the budget each
    worker is given, estimated from the largest file's JSON."""
    return WORKER_BYTES + WORKER_BYTES_PER_JSON_BYTE * max((_json_bytes(p) for p in files), default=0.0)


def _json_bytes(path: Path) -> float:
    """The JSON a trace file holds, estimated from its size."""
    try:
        size = path.stat().st_size
    except OSError:
        return 0.0  # read_trace says why
    return float(size * GZIP_RATIO if path.name.endswith(".gz") else size)


@dataclasses.dataclass(frozen=True)
class _RankTrace:
    """What the report needs of one rank's trace: small enough to hand back from a worker."""

    rank: int
    timeline: Timeline
    collectives: dict[str, np.ndarray]
    path: Path


_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)(?!\d)", re.IGNORECASE)


def rank_of_name(name: str, index: int) -> int:
    """The rank of a trace without ``distributedInfo`` (PyTorch before 1.10 wrote none): the number after
    ``rank`` or ``worker`` in its file name (``rank-1.json``, ``worker3.pt.trace.json``), else ``index``."""
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else index


def _read_rank(path: Path, index: int, step_range: str | None = None) -> list[_RankTrace]:
    if path.name.endswith(CAPTURE_SUFFIXES):
        # the GPU figures tallied as the capture streams its events: memory bounded by what is kept
        return [_rank_of(path, trace, index) for trace in read_capture(path, step_range, GpuTally)]
    if path.name.endswith(".xplane.pb"):
        return [_rank_of(path, trace_of_document(xplane_document([path]), path), index)]
    return [_rank_of(path, read_trace(path), index)]


def _rank_of(path: Path, trace: KinetoTrace, index: int) -> _RankTrace:
    rank = trace.rank if trace.rank is not None else rank_of_name(path.name, index)
    timeline = trace_timeline(trace, rank)
    warnings: list[Any] = timeline.meta["warnings"]
    dropped = dropped_warning(trace)
    if dropped is not None:
        warnings.append(dropped)
    gpu = trace_gpu(trace)
    memory = memory_peaks(trace.memory)
    if memory is not None:
        timeline.meta["gpu_memory"] = memory
    if gpu is None and memory is not None:
        warnings.append(
            f"{path.name}: no kernels, memcpy or memset in the trace, only the allocator's memory events: "
            "GPU memory peaks (gpu_memory) without GPU time figures (ProfilerActivity.CUDA records those)"
        )
    elif gpu is None:
        warnings.append(
            f"{path.name}: no GPU events (kernels, memcpy, memset) in the trace, so no GPU "
            + (
                "figures: it was recorded on the CPU only or without ProfilerActivity.CUDA"
                if timeline.meta["framework"] == "torch"
                else "figures (perfmagic reads GPU activity from torch.profiler's traces)"
            )
        )
    else:
        timeline.meta["gpu"] = gpu
        if len(timeline.meta["profiler_steps"]) < 2:
            warnings.append(
                f"{path.name}: fewer than two ProfilerStep# ranges, so the GPU figures cover "
                "the whole trace rather than the complete steps (as HTA does)"
            )
    return _RankTrace(rank, timeline, collective_starts(trace), path)
