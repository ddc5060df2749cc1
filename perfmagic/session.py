"""Session: runs the collectors around a block of code and builds its report."""

from __future__ import annotations

import os
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from perfmagic.children import CHILDREN_DIR, ChildProfiling
from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.collectors import Collectors, Switch
from perfmagic.collect.forked_child import keep_until_exit
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.sampler import Sampler, Source
from perfmagic.collect.sources import session_sources
from perfmagic.price import gpu_hour_price
from perfmagic.process_meta import process_identity, process_meta
from perfmagic.registry import SessionStatus
from perfmagic.timeline import Timeline
from perfmagic.training_hooks import TrainingHooks, tune_after
from perfmagic.upkeep import SPOOL_EVERY_S, RecordUpkeep

if TYPE_CHECKING:
    from perfmagic.report import Report

_active_lock = threading.Lock()
_active: Session | None = None


def active_session() -> Session | None:
    """The session profiling this process right now, if any."""
    return _active


class Session:
    """One profiled window: collectors on at ``start``, all off at ``stop``.

    ``outdir`` receives the spool (``timeline.jsonl``, appended about once a
    second so a killed process leaves a readable record) and ``report.json``.
    Without it, a temporary directory is used. With ``children`` (the default), the
    Python interpreters the block starts (``torch.multiprocessing.spawn`` workers,
    subprocesses) are profiled into ``outdir/children`` and are the report's ranks.
    ``price_per_gpu_hour`` (else ``$PERFMAGIC_PRICE_PER_GPU_HOUR``) puts money on the energy figures;
    without it the report has none. ``clock`` is what every collector times on (a test's fake one
    drives the whole window).
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
        clock: Clock = REAL_CLOCK,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        if tune_budget is not None and not (isinstance(tune_budget, (int, float)) and tune_budget > 0):
            raise ValueError(f"tune_budget must be a positive number of seconds, got {tune_budget!r}")
        if not isinstance(tune, bool):
            raise ValueError(f"tune must be True or False, got {tune!r}")
        # torch.profiler over this many training steps (True: 5); the heavy mode is opt-in and bounded
        trace_steps = 5 if trace is True else int(trace)
        if trace_steps < 0:
            raise ValueError(f"trace must be a number of steps >= 0, got {trace!r}")
        self.interval, self.hooks, self.sample, self.source = float(interval), hooks, sample, source
        self.tune, self.tune_budget, self.trace_steps = tune, tune_budget, trace_steps
        self.children, self.clock = children, clock
        self.price_per_gpu_hour = gpu_hour_price(price_per_gpu_hour)
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
        self._tick_listeners: list[Callable[[], None]] = []
        self._status: SessionStatus | None = (
            None  # this session in the machine's registry (perfmagic exporter)
        )

    # -- start -----------------------------------------------------------

    def start(self) -> Session:
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError(
                    "perfmagic is already profiling in this process; nested profiles are not supported"
                )
            _active = self
        try:
            self._start()
        except BaseException:
            # A start that failed half-way must not leave a hook, a thread or the spool open.
            self._running = False
            try:
                self.warnings += self._collectors.stop()
            finally:
                self._upkeep.drop()
                with _active_lock:
                    _active = None
            raise
        return self

    def _start(self) -> None:
        self._origin = self.clock.now()
        meta = self.timeline.meta
        meta.update(process_meta(self.clock, self.source, self.interval))
        if self.price_per_gpu_hour is not None:
            meta["price_per_gpu_hour"] = self.price_per_gpu_hour
        self.outdir = self._upkeep.open(self.outdir)
        self._running = True
        if self.children:
            self._collectors.start(
                "the children's profiling", ChildProfiling(self.outdir / CHILDREN_DIR, self.interval)
            )
        if self.hooks:
            self.recorder = recorder = StageRecorder(self.timeline, self._origin, clock=self.clock)
            self._upkeep.watch(recorder)
            self._collectors.start("the stage recorder", Switch(lambda: None, recorder.close))
            self._training = TrainingHooks(recorder, self.outdir, self.trace_steps, self.tune, self.warnings)
            self._collectors.start("the training hooks", self._training)
            # a session that profiles code (not perfmagic run's own hardware sampler) is a training process
            self._status = SessionStatus(process_identity(meta), self.timeline, recorder)
        sources = session_sources(self._sources, self.clock, self.recorder) if self.sample else []
        # no metrics without ``sample``, but the thread still spools: a killed process keeps its record
        interval = self.interval if self.sample else SPOOL_EVERY_S
        sampler = Sampler(self.timeline, sources, interval, self._clock, self._on_tick, timer=self.clock)
        self._sampler = sampler
        self._collectors.start("the sampler", Switch(sampler.start, lambda: self._stop_sampler(sampler)))
        # perfmagic's own start (hooks, first imports: tens of ms in a fresh process) is no start-up of the user's
        meta["ready_s"] = self._clock()

    def _stop_sampler(self, sampler: Sampler) -> list[str]:
        sampler.stop()
        self.timeline.meta["sampler"] = {"ticks": sampler.ticks, "busy_s": sampler.busy_s}
        return sampler.warnings

    # -- step and stage API (module functions below), ticks ------------------

    def _clock(self) -> float:
        return self.clock.now() - self._origin

    def add_tick_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the sampler thread after every tick until ``stop`` (live views hang here).

        A listener that raises is dropped with a warning; the others keep running.
        """
        self._tick_listeners = [*self._tick_listeners, fn]

    def _on_tick(self) -> None:
        self._upkeep.tick()
        if self._running and self._status is not None:  # for perfmagic exporter: this process's progress
            self._status.tick()
        self._notify_listeners()

    def _notify_listeners(self) -> None:
        for fn in self._tick_listeners:
            try:
                fn()
            except Exception as e:  # a view that fails must not end the sampling, nor the tuning
                self._tick_listeners = [f for f in self._tick_listeners if f is not fn]
                self.warnings.append(f"a live view failed and was turned off ({e!r})")

    def flush_spool(self) -> None:
        """Write what the spool lacks now, from any thread (a process about to end without ``stop``)."""
        self._upkeep.flush()

    # -- stop and report -------------------------------------------------

    def stop(self) -> Report:
        """Turn every collector off, write the final record, build the report."""
        # the analysis, advice and rendering are imported here, not at start: a profiled process pays them
        # only once it reports
        from perfmagic.records import REPORT_NAME, window_report

        if self._forked:  # the parent's record is the parent's: report what was seen, write nothing
            if self._report is None:
                self._report = window_report(self.timeline, self.outdir, self.source, self.warnings)
            return self._report
        if self._report is not None and not self._running:
            return self._report
        if not self._running and not self._ended:
            raise RuntimeError("session was never started")
        self.end_record()
        self._report = window_report(self.timeline, self.outdir, self.source, self.warnings)
        try:
            self._report.save(self.outdir / REPORT_NAME)
        except OSError as e:
            self.warnings.append(f"report.json could not be written to {self.outdir} ({e.strerror or e})")
            self._report = window_report(self.timeline, self.outdir, self.source, self.warnings)
        return self._report

    def end_record(self) -> None:
        """Turn every collector off and write the final record, with no report: for a process whose report
        another builds from its record (``perfmagic run``'s). ``stop`` still builds it."""
        global _active
        if self._forked or not self._running:
            return
        self._running, self._ended = False, True
        self.timeline.meta["wall_s"] = self._clock()
        try:
            self.warnings += self._collectors.stop()
            if self.tune:
                from perfmagic.tuning import default_budget

                budget = self.tune_budget or default_budget(float(self.timeline.meta.get("wall_s") or 0.0))
                self.warnings += tune_after(self._training, self.timeline, budget, self._tuning_progress)
        finally:
            with _active_lock:
                _active = None
            self._tick_listeners = []
            if self._status is not None:
                self.warnings += self._status.remove()
            self.timeline.meta["warnings"] = list(self.warnings)  # in the spool's last lines
            self._upkeep.finish()

    def _tuning_progress(self, what: str, left_s: float) -> None:
        """What tuning tries now, for live views (their tick listeners run: the sampler has stopped)."""
        self.tuning_status = f"tuning {what} · {left_s:.0f} s left"
        self._notify_listeners()

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


def _after_fork_in_child() -> None:
    global _active
    session, _active = _active, None
    if session is not None:
        session._forget_in_child()


# A child forked while profiling (multiprocessing's fork start method, os.fork) must not write into the
# parent's record. Registered once, on import: it does nothing unless a session is active.
os.register_at_fork(after_in_child=_after_fork_in_child)


def profile(**options: Any) -> Session:
    """Profile a block: ``with perfmagic.profile() as session: train()``."""
    return Session(**options)
