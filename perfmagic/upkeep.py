"""A window's record while it runs: spooled to disk, and held in bounded memory however long it runs."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from perfmagic.clock import Clock
from perfmagic.collect.recorder import StageRecorder
from perfmagic.schema import RECORDING, THREAD_PREFIX
from perfmagic.timeline import Timeline
from perfmagic.timeline.file import SPOOL_NAME, Spooler

SPOOL_EVERY_S = 1.0

SPAN_BUDGET = 1 << 16
"""Spans held before old steps are folded into rows (1.4 MB of spans; a row takes ~30 bytes a step)."""

BACKLOG_SPANS = 4
"""Times :data:`SPAN_BUDGET` of spans held before the training thread spools and folds them itself: the
sampler thread that does it has fallen behind. A loop of pure Python holds the GIL that thread needs,
and each of its reads and numpy calls that lets the GIL go waits a switch interval (5 ms) to get it back."""

SERIES_BUDGET = 1 << 15
"""Samples of one series held before its older half is averaged in pairs (an hour at 10 Hz; 0.5 MB)."""


class RecordUpkeep:
    """Keeps a window's timeline: appends what is new to the spool in ``outdir`` (``timeline.jsonl``,
    about once a second, so a killed process leaves a readable record), folds old steps into rows and
    averages old samples in pairs once they pass their budgets.

    It works on the sampler thread (:meth:`tick`), or on the training thread where that one fell
    behind (:meth:`catch_up`), and only while ``running()``. Each failure is a warning in ``warnings``:
    the training runs whatever the disk says.
    """

    def __init__(self, timeline: Timeline, clock: Clock, warnings: list[str], running: Callable[[], bool]):
        self.timeline, self.clock, self.warnings, self._running = timeline, clock, warnings, running
        self.outdir = Path()
        self.recorder: StageRecorder | None = None
        self._file: IO[str] | None = None
        self._spooler: Spooler | None = None
        self._last_spool = 0.0
        self._bounding = True  # folding old steps and thinning old samples (off after a failure)
        self._lock = threading.Lock()  # two threads planning folds at once could cut the same spans twice

    def open(self, outdir: Path) -> Path:
        """Open the spool in ``outdir``; where that fails, in a temporary directory; else keep the record in
        memory. Returns the directory the record goes to."""
        self.outdir = outdir
        for attempt in range(2):
            try:
                self.outdir.mkdir(parents=True, exist_ok=True)
                self._file = open(self.outdir / SPOOL_NAME, "w", encoding="utf-8")  # noqa: SIM115
                self._spooler = Spooler(self.timeline, self._file, settled=self._settled_spans)
                self._spooler.flush()
                break
            except OSError as e:
                self.drop()
                if attempt == 0:
                    wanted, self.outdir = self.outdir, Path(tempfile.mkdtemp(prefix="perfmagic-"))
                    self.warnings.append(
                        f"cannot write to {wanted} ({e.strerror or e}): the record and report are in "
                        f"{self.outdir} instead"
                    )
                else:
                    self._failed(e)
        return self.outdir

    def watch(self, recorder: StageRecorder) -> None:
        """Take ``recorder``'s settled spans only, and let it call :meth:`catch_up` at a step end where the
        spans held pass :data:`BACKLOG_SPANS` budgets."""
        self.recorder = recorder
        recorder.on_backlog = self.catch_up
        recorder.backlog_spans = BACKLOG_SPANS * SPAN_BUDGET

    def tick(self) -> None:
        """The sampler's tick: spool where a second has passed or spans pass the budget (so that they
        can be folded), then fold and thin."""
        backlog = self.timeline.raw_span_count() > SPAN_BUDGET and self._bounding
        self._keep(spool=backlog or self.clock.now() - self._last_spool >= SPOOL_EVERY_S)

    def catch_up(self) -> None:
        """On the training thread, at a step end: the sampler thread fell behind, so spool and fold here
        (the recorder applies the fold right after)."""
        if self._bounding:
            self._keep(spool=True)

    def flush(self) -> None:
        """Write what the spool lacks now, from any thread (a process about to end without stopping)."""
        spooler = self._spooler
        if spooler is not None:
            spooler.flush()

    def finish(self) -> None:
        """Bring the spool up to date and close it (the recorder has closed: every span's times are final)."""
        try:
            if self._file is None or self._spooler is None:
                return
            self._spooler.flush()
            self._file.close()
            self._file = None
            self.timeline.record = self.outdir / SPOOL_NAME
        except OSError as e:
            self._failed(e)

    def drop(self) -> None:
        """Close the spool where it is open, as it is."""
        file, self._file, self._spooler = self._file, None, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()

    def forget_in_child(self) -> None:
        """After ``fork``: the spool file is the parent's. Not closed: that could flush into it."""
        self._file = self._spooler = None

    def _failed(self, error: OSError) -> None:
        self.drop()
        self.warnings.append(
            f"the record could not be written to {self.outdir} ({error.strerror or error}): profiling went on "
            "in memory only, so a process killed before the end would have left no record"
        )

    def _settled_spans(self) -> int:
        """Spans whose times are final (a device time may still move the others): the spool takes these."""
        recorder = self.recorder
        return recorder.settled_spans if recorder is not None else self.timeline.span_count

    def _keep(self, spool: bool) -> None:
        """Spool what is new (where ``spool``), then fold old steps and thin old samples."""
        with self._lock:
            if not self._running():
                return
            if spool:
                self._last_spool = self.clock.now()
                if self._spooler is not None:
                    try:
                        self._spooler.flush()
                    except OSError as e:  # a full or lost disk: go on in memory
                        self._failed(e)
            if self._bounding:
                try:
                    self._bound_memory()
                except Exception as e:  # a bug here costs memory on a long run, not the training
                    self._bounding = False
                    self.warnings.append(f"old steps could not be folded ({e!r}): memory grows with the run")

    def _bound_memory(self) -> None:
        """Fold old steps into rows and average old samples in pairs once they pass their budgets.

        Only what the spool holds goes (memory-only sessions: whatever is settled), so the spool
        keeps every detail; the profiled thread applies a fold at its next step boundary.
        """
        tl, spooler = self.timeline, self._spooler
        settled_samples = spooler.samples_sent if spooler is not None else tl.sample_count
        if tl.raw_span_count() > SPAN_BUDGET and tl.pending_fold is None:
            settled = spooler.spans_sent if spooler is not None else self._settled_spans()
            from perfmagic.analyze.steps import plan_fold  # only long runs fold: not at start-up

            fold = plan_fold(tl, SPAN_BUDGET // 4, settled, settled_samples)
            if fold is not None:
                tl.request_fold(fold)
        for metric in tl.metrics:
            held = tl.sample_count(metric) - tl.sample_base(metric)
            # thread.*: folded with steps; the recording's changes: an average of two is neither
            if held > SERIES_BUDGET and not metric.startswith(THREAD_PREFIX) and metric != RECORDING:
                tl.thin(metric, min(held // 2, settled_samples(metric) - tl.sample_base(metric)))
