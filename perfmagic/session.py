"""Session: runs the collectors around a block of code and builds its report."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from perfmagic import active
from perfmagic.active import active_session as active_session
from perfmagic.children import CHILDREN_DIR, ChildProfiling
from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.collectors import Collectors, Switch
from perfmagic.collect.forked_child import keep_until_exit
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.sampler import Sampler, Source
from perfmagic.collect.schedule import RecordingSchedule
from perfmagic.collect.sources import session_sources
from perfmagic.process_meta import process_identity, process_meta
from perfmagic.registry import SessionStatus
from perfmagic.session_options import checked_options
from perfmagic.tick_listeners import TickListeners
from perfmagic.timeline import Timeline
from perfmagic.training_hooks import TrainingHooks, tune_after
from perfmagic.upkeep import SPOOL_EVERY_S, RecordUpkeep

if TYPE_CHECKING:
    from perfmagic.report import Report


class Session:
    """One profiled window: collectors on at ``start``, all off at ``stop``.

    ``outdir`` (else a temporary directory) receives the spool (``timeline.jsonl``, appended about once
    a second so a killed process leaves a readable record) and ``report.json``. With ``children``, the
    Python interpreters the block starts (spawn workers, subprocesses) are profiled into
    ``outdir/children`` as the report's ranks. ``price_per_gpu_hour`` (else
    ``$PERFMAGIC_PRICE_PER_GPU_HOUR``) puts money on the energy figures. ``full`` records every step's
    stages, not windows of steps (``collect.schedule``). ``clock``: what every collector times on.
    """

    def __init__(
        self,
        *,
        interval: float = 0.1,
        outdir: str | os.PathLike[str] | None = None,
        hooks: bool = True,
        sample: bool = True,
        sources: list[Source] | None = None,
        source: str = "live",
        trace: bool | int = False,
        tune: bool = False,
        tune_budget: float | None = None,
        children: bool = True,
        price_per_gpu_hour: float | None = None,
        full: bool = False,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.options = checked_options(
            interval=interval,
            hooks=hooks,
            sample=sample,
            source=source,
            trace=trace,
            tune=tune,
            tune_budget=tune_budget,
            children=children,
            price_per_gpu_hour=price_per_gpu_hour,
            full=full,
        )
        self.clock = clock
        self.outdir = Path(outdir) if outdir is not None else Path(tempfile.mkdtemp(prefix="perfmagic-"))
        self.timeline = Timeline()
        self.recorder: StageRecorder | None = None
        self.warnings: list[str] = []
        self.tuning_status: str | None = None  # what tuning tries now (after the window), for live views
        self._running = False
        self._ended = False  # the record is finished (``end_record``): ``stop`` builds the report from it
        self._forked = False  # this is a copy of the session in a forked child: it writes nothing
        self._upkeep = RecordUpkeep(self.timeline, clock, self.warnings, lambda: self._running)
        self._sources = sources
        self._collectors = Collectors()  # stopped in the reverse order of their start on every way out
        self._training: TrainingHooks | None = None
        self._sampler: Sampler | None = None
        self._origin = 0.0
        self._report: Report | None = None
        self._listeners = TickListeners(self.warnings)
        self._status: SessionStatus | None = None  # this session in the machine's registry (exporter)

    # -- start -----------------------------------------------------------

    def start(self) -> Session:
        active.claim(self)
        try:
            self._start()
        except BaseException:
            # A start that failed half-way must not leave a hook, a thread or the spool open.
            self._running = False
            try:
                self.warnings += self._collectors.stop()
            finally:
                self._upkeep.drop()
                active.release()
            raise
        return self

    def _start(self) -> None:
        o, self._origin = self.options, self.clock.now()
        meta = self.timeline.meta
        meta.update(process_meta(self.clock, o.source, o.interval, o.price_per_gpu_hour))
        self.outdir = self._upkeep.open(self.outdir)
        self._running = True
        if o.children:
            self._collectors.start(
                "the children's profiling", ChildProfiling(self.outdir / CHILDREN_DIR, o.interval, o.full)
            )
        if o.hooks:
            self.recorder = recorder = StageRecorder(self.timeline, self._origin, clock=self.clock)
            recorder.schedule = RecordingSchedule(self.clock, every_step=o.every_step)
            self._upkeep.watch(recorder)
            self._collectors.start("the stage recorder", Switch(lambda: None, recorder.close))
            self._training = TrainingHooks(recorder, self.outdir, o.trace_steps, o.tune, self.warnings)
            self._collectors.start("the training hooks", self._training)
            # a session that profiles code (not perfmagic run's own hardware sampler) is a training process
            self._status = SessionStatus(process_identity(meta), self.timeline, recorder)
        sources = session_sources(self._sources, self.clock, self.recorder) if o.sample else []
        # no metrics without ``sample``, but the thread still spools: a killed process keeps its record
        interval = o.interval if o.sample else SPOOL_EVERY_S
        sampler = Sampler(self.timeline, sources, interval, self._clock, self._on_tick, timer=self.clock)
        self._sampler = sampler
        self._collectors.start("the sampler", Switch(sampler.start, sampler.finish))
        # perfmagic's own start (hooks, first imports: tens of ms in a fresh process) is no start-up of the user's
        meta["ready_s"] = self._clock()

    # -- step and stage API (module functions below), ticks ------------------

    def _clock(self) -> float:
        return self.clock.now() - self._origin

    def add_tick_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the sampler thread after every tick until ``stop`` (live views hang here).

        A listener that raises is dropped with a warning; the others keep running.
        """
        self._listeners.add(fn)

    def _on_tick(self) -> None:
        self._upkeep.tick()
        if self._running and self._status is not None:  # for perfmagic exporter: this process's progress
            self._status.tick()
        self._listeners.notify()

    def flush_spool(self) -> None:
        """Write what the spool lacks now, from any thread (a process about to end without ``stop``)."""
        self._upkeep.flush()

    # -- stop and report -------------------------------------------------

    def stop(self) -> Report:
        """Turn every collector off, write the final record, build the report."""
        # the analysis, advice and rendering are imported here, not at start: a profiled process pays them
        # only once it reports
        from perfmagic.records import REPORT_NAME, window_report

        report = partial(window_report, self.timeline, self.outdir, self.options.source, self.warnings)
        if self._forked:  # the parent's record is the parent's: report what was seen, write nothing
            self._report = self._report or report()
            return self._report
        if self._report is not None and not self._running:
            return self._report
        if not self._running and not self._ended:
            raise RuntimeError("session was never started")
        self.end_record()
        self._report = report()
        try:
            self._report.save(self.outdir / REPORT_NAME)
        except OSError as e:
            self.warnings.append(f"report.json could not be written to {self.outdir} ({e.strerror or e})")
            self._report = report()
        return self._report

    def end_record(self) -> None:
        """Turn every collector off and write the final record, with no report: for a process whose report
        another builds from its record (``perfmagic run``'s). ``stop`` still builds it."""
        if self._forked or not self._running:
            return
        self._running, self._ended = False, True
        self.timeline.meta["wall_s"] = self._clock()
        try:
            self.warnings += self._collectors.stop()
            if self.options.tune:
                budget = self.options.tune_budget
                self.warnings += tune_after(self._training, self.timeline, budget, self._tuning_progress)
        finally:
            active.release()
            self._listeners.clear()
            if self._status is not None:
                self.warnings += self._status.remove()
            self.timeline.meta["warnings"] = list(self.warnings)  # in the spool's last lines
            self._upkeep.finish()

    def _tuning_progress(self, what: str, left_s: float) -> None:
        """What tuning tries now, for live views (their tick listeners run: the sampler has stopped)."""
        self.tuning_status = f"tuning {what} · {left_s:.0f} s left"
        self._listeners.notify()

    @property
    def report(self) -> Report:
        if self._report is None:
            raise RuntimeError("the report exists once the profiled block has ended")
        return self._report

    def _forget_in_child(self) -> None:
        """After ``fork``: the child shares the parent's spool file but none of its threads; it records nothing."""
        self._forked = True
        self._running = False
        if self.recorder is not None:
            self.recorder.stop_recording()
        self._upkeep.forget_in_child()
        # the sampler's sources may hold CUDA objects of the parent: kept, never freed here (see
        # StageRecorder.stop_recording)
        keep_until_exit(self._sampler)
        self._sampler = None

    # -- context manager -------------------------------------------------

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.warnings.append(
                f"the profiled block ended with {exc_type.__name__}: the report covers what ran"
            )
        try:
            self.stop()
        except Exception as e:  # perfmagic's failure is not the training's, nor the block's own exception
            warnings.warn(f"perfmagic could not finish the profile ({e!r})", RuntimeWarning, stacklevel=2)


def profile(**options: Any) -> Session:
    """Profile a block: ``with perfmagic.profile() as session: train()``."""
    return Session(**options)
