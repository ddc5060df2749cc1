"""perfmagic beside HolisticTraceAnalysis (HTA) 0.5.0 on the same traces: time and peak memory.

Each measurement is a fresh process, so its peak RSS (``VmHWM``, Linux) is its own; HTA
and perfmagic alternate, round after round, so both see the same machine. The time is
the work after the imports (numpy, numpy.ma included for both: pandas imports numpy.ma
when HTA is imported, perfmagic's first ``np.unique`` does it); the whole command's
time (``cmd``: interpreter, imports, work) is printed too. The work:

- HTA: ``TraceAnalysis`` on the trace (load), ``get_temporal_breakdown()`` and
  ``get_idle_time_breakdown()``;
- perfmagic: ``report_from_traces`` (read, GPU figures, steps, stages, advice: the
  whole ``perfmagic report``).

Besides the given traces (default: the real GPU traces in ``tests/data``), it builds the first
one scaled 4x and 16x (``--scale``): its events repeated with shifted timestamps,
step numbers and correlation ids, one copy after another, to show that time and
memory grow linearly with the trace.

Targets, checked per trace and printed: perfmagic >= 10x faster than HTA, peak RSS <=
half of HTA's; for a scaled trace, peak RSS <= the trace's JSON size, and time per
event within 1.3x of the unscaled trace's.

Usage: ``python benchmarks/traces.py [--rounds 3] [--scale 4 16] [--workdir DIR] [TRACE ...]``
(HTA from the ``bench`` extra: ``pip install -e '.[bench]'``).

Nsight Systems captures (``--nsys MB ...``, HTA not needed): synthetic training captures
(``tests/nsys_capture.py``, the real exports' schema) of about that many MB of CUDA and NVTX events,
and (``--nsys-total MB``) the smallest of them grown to that size with rows of a table perfmagic does
not read, as CPU sampling and scheduling make up most of a real capture. ``perfmagic report`` on each
in a fresh process: time and peak RSS, and RSS per event read, over the whole peak and over the growth
from the capture before (the events are kept as columns, so this is what each one costs). Target: peak
RSS <= ``NSYS_RSS_TARGET`` on each (the issue's: a 4 GB capture); the rows of tables perfmagic does not
read are never fetched, so a grown capture costs what its events do.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
DEFAULT = [
    "a100_rank3_control.json.gz",
    "v100_ns_resolution.json.gz",
    "sampled_rank-0.json.gz",
    "sampled_rank-1.json.gz",
]
SPEEDUP_TARGET = 10.0
MEMORY_TARGET = 0.5  # perfmagic's peak over HTA's
LINEAR_TARGET = 1.3  # time per event of a scaled trace over the unscaled one's
STEP = re.compile(r"ProfilerStep#(\d+)")
NSYS_RSS_TARGET = 300e6  # peak RSS of perfmagic report on a capture (of 4 GB)


def child(tool: str, path: str) -> None:
    """Run one tool on one trace in this process; print its seconds of work and peak RSS as JSON."""
    import numpy.ma  # noqa: F401 (imported before the clock starts, for both tools)

    if tool == "hta":
        import logging

        from hta.trace_analysis import TraceAnalysis

        logging.disable(logging.WARNING)
        start = time.perf_counter()
        analysis = TraceAnalysis(trace_files={0: path})
        analysis.get_temporal_breakdown(visualize=False)
        analysis.get_idle_time_breakdown(ranks=[0], visualize=False)
    else:
        from perfmagic.heap import hold_mmap_threshold
        from perfmagic.trace_report import report_from_traces

        hold_mmap_threshold()  # as the perfmagic report command does
        start = time.perf_counter()
        report_from_traces([path])
    seconds = time.perf_counter() - start
    # the high-water mark of this process's own memory (ru_maxrss would count the parent's,
    # which the fork that started it copied)
    status = Path("/proc/self/status").read_text()
    peak = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]
    print(json.dumps({"seconds": seconds, "peak": peak}))


def measure(tool: str, path: Path) -> tuple[float, float, float]:
    """(seconds of work, peak RSS in bytes, seconds of the whole command) of one tool on one trace."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, __file__, "--child", tool, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    command = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{tool} failed on {path} (exit {result.returncode}):\n{result.stderr[-2000:]}")
    out = json.loads(result.stdout.splitlines()[-1])
    return out["seconds"], float(out["peak"]), command


def json_size(path: Path) -> int:
    """Bytes of JSON text in the trace (decompressed)."""
    with gzip.open(path) if path.suffix == ".gz" else path.open("rb") as f:
        return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 24), b""))


def scaled(path: Path, times: int, workdir: Path) -> Path:
    """``path``'s events repeated ``times`` times, each copy after the last (built once, cached)."""
    out = workdir / f"{path.name.split('.')[0]}_x{times}.json.gz"
    if out.exists():
        return out
    with gzip.open(path) as f:
        doc = json.load(f)
    events: list[dict[str, Any]] = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    first = min(e["ts"] for e in timed)
    shift = max(e["ts"] + e.get("dur", 0) for e in timed) - first + 1000.0
    steps = [int(m.group(1)) for e in events if (m := STEP.fullmatch(str(e.get("name"))))]
    step_shift = max(steps) - min(steps) + 1 if steps else 0
    ids = [
        e["args"]["correlation"]
        for e in events
        if isinstance(e.get("args"), dict) and "correlation" in e["args"]
    ]
    id_shift = max(ids, default=0) + 1
    flow_shift = max((e["id"] for e in events if isinstance(e.get("id"), int)), default=0) + 1
    head = json.dumps(doc)[:-1]  # the facts, without the closing brace
    tmp = out.with_suffix(".tmp")
    with gzip.open(tmp, "wt", compresslevel=1) as f:
        f.write(head + (", " if doc else "") + '"traceEvents": [\n')
        for k in range(times):
            copies = []
            for e in events:
                if k and e.get("ph") == "M":
                    continue  # process and thread names: once
                c = dict(e)
                if "ts" in c:
                    c["ts"] = c["ts"] + k * shift
                if (m := STEP.fullmatch(str(c.get("name")))) is not None:
                    c["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_shift}"
                if isinstance(c.get("args"), dict) and "correlation" in c["args"]:
                    c["args"] = {**c["args"], "correlation": c["args"]["correlation"] + k * id_shift}
                if isinstance(c.get("id"), int):
                    c["id"] += k * flow_shift
                copies.append(json.dumps(c))
            f.write((",\n" if k else "") + ",\n".join(copies))
        f.write("\n]}")
    tmp.rename(out)
    return out


@dataclass
class Row:
    path: Path
    events: int
    json_bytes: int
    scale: int = 1
    runs: dict[str, list[tuple[float, float, float]]] = field(
        default_factory=lambda: {"hta": [], "perfmagic": []}
    )

    def seconds(self, tool: str) -> float:
        return statistics.median(r[0] for r in self.runs[tool])

    def peak(self, tool: str) -> float:
        return statistics.median(r[1] for r in self.runs[tool])

    def command(self, tool: str) -> float:
        return statistics.median(r[2] for r in self.runs[tool])


def event_count(path: Path) -> int:
    from perfmagic.traces import read_trace

    trace = read_trace(path)
    return len(trace.cpu) + len(trace.gpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each tool per trace")
    parser.add_argument(
        "--scale", type=int, nargs="*", default=[4, 16], help="scaled copies of the first trace"
    )
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "perfmagic-bench-traces"
    )
    parser.add_argument(
        "--nsys", type=int, nargs="*", metavar="MB", help="Nsight captures of these MB of events"
    )
    parser.add_argument("--nsys-total", type=int, metavar="MB", help="the smallest grown to this size")
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "TRACE"), help=argparse.SUPPRESS)
    parser.add_argument("traces", nargs="*", type=Path)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.nsys:
        nsys_main(args.nsys, args.nsys_total, args.workdir, args.rounds)
        return
    paths = args.traces or [DATA / name for name in DEFAULT if (DATA / name).exists()]
    if not paths:
        raise SystemExit(f"no traces given and none in {DATA}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = [Row(p, event_count(p), json_size(p)) for p in paths]
    for times in args.scale:
        path = scaled(paths[0], times, args.workdir)
        rows.append(Row(path, event_count(path), json_size(path), scale=times))
    for r in range(args.rounds):
        for row in rows:
            order = ("hta", "perfmagic") if r % 2 == 0 else ("perfmagic", "hta")
            for tool in order:
                row.runs[tool].append(measure(tool, row.path))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    mb = 1e6
    print(
        f"{'trace':<30} {'JSON MB':>7} {'events':>8} {'HTA s':>6} {'pm s':>6} {'speed':>6} "
        f"{'HTA MB':>6} {'pm MB':>6} {'mem':>5} {'cmd HTA/pm s':>12}  targets"
    )
    base = rows[0]
    for row in rows:
        hta_s, pm_s = row.seconds("hta"), row.seconds("perfmagic")
        hta_m, pm_m = row.peak("hta"), row.peak("perfmagic")
        checks = [
            f"speed>={SPEEDUP_TARGET:g}x {'yes' if hta_s / pm_s >= SPEEDUP_TARGET else 'NO'}",
            f"mem<=HTA/2 {'yes' if pm_m <= MEMORY_TARGET * hta_m else 'NO'}",
        ]
        if row.scale > 1:
            per_event = (pm_s / row.events) / (base.seconds("perfmagic") / base.events)
            checks.append(f"mem<=JSON {'yes' if pm_m <= row.json_bytes else 'NO'}")
            checks.append(
                f"time/event {per_event:.2f}x of 1x {'yes' if per_event <= LINEAR_TARGET else 'NO'}"
            )
        cmd = f"{row.command('hta'):.2f}/{row.command('perfmagic'):.2f}"
        print(
            f"{row.path.name:<30} {row.json_bytes / mb:>7.1f} {row.events:>8} {hta_s:>6.2f} {pm_s:>6.3f} "
            f"{hta_s / pm_s:>5.1f}x {hta_m / mb:>6.0f} {pm_m / mb:>6.0f} {pm_m / hta_m:>5.2f} {cmd:>12}  "
            + ", ".join(checks)
        )


def nsys_capture(events_mb: int, total_mb: int | None, workdir: Path) -> Path:
    """A synthetic capture of about ``events_mb`` MB of events, grown to ``total_mb`` (built once, cached)."""
    sys.path.insert(0, str(DATA.parent))
    from nsys_capture import Loop, pad_capture, write_capture

    out = workdir / f"nsys_{events_mb}mb{f'_total{total_mb}mb' if total_mb else ''}.sqlite"
    if out.exists():
        return out
    one = write_capture(workdir / "nsys_one.sqlite", Loop()).stat().st_size
    tmp = write_capture(out.with_suffix(".tmp"), Loop(), repeat=max(1, round(events_mb * 1e6 / one)))
    if total_mb:
        pad_capture(tmp, int(total_mb * 1e6))
    tmp.rename(out)
    return out


def capture_events(path: Path) -> int:
    """The events perfmagic reads in a capture (kernels, copies, memsets, runtime calls, NVTX ranges),
    counted by SQL: reading the capture here to count them would cost what is measured."""
    from perfmagic.traces.nsys import NVTX_RANGES
    from perfmagic.traces.nsys_columns import RUNTIME_CLASSES
    from perfmagic.traces.nsys_schema import KERNEL, MEMCPY, MEMSET, NVTX, RUNTIME

    counts = {
        KERNEL: "",
        MEMCPY: "",
        MEMSET: "",
        RUNTIME: f" WHERE eventClass IN {RUNTIME_CLASSES}",
        NVTX: f" WHERE eventType IN {NVTX_RANGES}",
    }
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return sum(
            int(db.execute(f"SELECT count(*) FROM {t}{where}").fetchone()[0])
            for t, where in counts.items()
            if t in tables
        )
    finally:
        db.close()


def nsys_main(sizes: list[int], total: int | None, workdir: Path, rounds: int) -> None:
    """``perfmagic report`` on synthetic Nsight captures: time, peak RSS, RSS per event read (over all
    of the peak, and over the growth from the capture before: what each further event costs)."""
    workdir.mkdir(parents=True, exist_ok=True)
    builds = [(mb, None) for mb in sorted(sizes)] + ([(min(sizes), total)] if total else [])
    print(
        f"{'capture':<34} {'MB':>7} {'events':>9} {'pm s':>7} {'peak MB':>8} {'B/event':>8} {'dB/dev':>7}  target"
    )
    before: tuple[int, float] | None = None
    for mb, grown in builds:
        path = nsys_capture(mb, grown, workdir)
        events = capture_events(path)
        runs = [measure("perfmagic", path) for _ in range(rounds)]
        seconds, peak = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        slope = (peak - before[1]) / (events - before[0]) if before and events > before[0] else None
        before = (events, peak) if not grown else before
        check = f"peak<={NSYS_RSS_TARGET / 1e6:.0f} MB {'yes' if peak <= NSYS_RSS_TARGET else 'NO'}"
        print(
            f"{path.name:<34} {path.stat().st_size / 1e6:>7.0f} {events:>9} {seconds:>7.2f} {peak / 1e6:>8.0f} "
            f"{peak / events:>8.0f} {'' if slope is None else f'{slope:.0f}':>7}  {check}"
        )


if __name__ == "__main__":
    main()
