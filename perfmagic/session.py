"""Session: runs the collectors around a block of code and builds its report."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from perfmagic.analyze.running import RunningStages
from perfmagic.analyze.steps import plan_fold
from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.forked_child import keep_until_exit
from perfmagic.collect.imports import PostImportHook, when_imported
from perfmagic.collect.nvtx_ranges import NO_RECORDER
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.sampler import Sampler, Source
from perfmagic.collect.sources import default_sources
from perfmagic.collect.stacks import StackSource
from perfmagic.registry import StatusFile
from perfmagic.schema import STEP_BOUNDARY_PREFIX, THREAD_PREFIX
from perfmagic.timeline import SPOOL_NAME, Spooler, Timeline

if TYPE_CHECKING:
    from perfmagic.collect.evaluation import EvaluationPasses
    from perfmagic.collect.frameworks import FrameworkHooks
    from perfmagic.collect.tfjax import TfJaxHooks
    from perfmagic.collect.tfjax_profiler import TfJaxProfiler
    from perfmagic.collect.torch_hooks import TorchStages
    from perfmagic.collect.torch_profiler import TorchProfiler
    from perfmagic.report import Report

REPORT_NAME = "report.json"
CHILDREN_DIR = "children"
"""Where the records of the interpreters a window started go, in its ``outdir``."""
_SPOOL_EVERY_S = 1.0

SPAN_BUDGET = 1 << 16
"""Spans held before old steps are folded into rows (1.4 MB of spans; a row takes ~30 bytes a step)."""

BACKLOG_SPANS = 4
"""Times :data:`SPAN_BUDGET` of spans held before the training thread spools and folds them itself: the
sampler thread that does it has fallen behind. A loop of pure Python holds the GIL that thread needs,
and each of its reads and numpy calls that lets the GIL go waits a switch interval (5 ms) to get it back."""

SERIES_BUDGET = 1 << 15
"""Samples of one series held before its older half is averaged in pairs (an hour at 10 Hz; 0.5 MB)."""

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
    ``clock`` is what every collector times on (a test's fake one drives the whole window).
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
        clock: Clock = REAL_CLOCK,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        if tune_budget is not None and not (isinstance(tune_budget, (int, float)) and tune_budget > 0):
            raise ValueError(f"tune_budget must be a positive number of seconds, got {tune_budget!r}")
        if not isinstance(tune, bool):
            raise ValueError(f"tune must be True or False, got {tune!r}")
        self.tune = tune
        self.tune_budget = tune_budget
        self.children, self.clock = children, clock
        self.interval = float(interval)
        # torch.profiler over this many training steps (True: 5); the heavy mode is opt-in and bounded
        self.trace_steps = 5 if trace is True else int(trace)
        if self.trace_steps < 0:
            raise ValueError(f"trace must be a number of steps >= 0, got {trace!r}")
        self.outdir = Path(outdir) if outdir is not None else Path(tempfile.mkdtemp(prefix="perfmagic-"))
        self.hooks = hooks
        self.sample = sample
        self.source = source
        self.timeline = Timeline()
        self.recorder: StageRecorder | None = None
        self.warnings: list[str] = []
        self._sources = sources
        self._sampler: Sampler | None = None
        self._torch: TorchStages | None = None
        self._frameworks: FrameworkHooks | None = None
        self._tfjax: TfJaxHooks | None = None  # TensorFlow, Keras, JAX
        self._evaluation: EvaluationPasses | None = None  # shared by the torch and framework hooks
        self._torch_failed = False
        self._tracer: TorchProfiler | None = None
        self._tfjax_tracer: TfJaxProfiler | None = None  # --trace where TensorFlow or JAX trains
        self._pending_import: PostImportHook | None = None
        # torch may be imported (and hooked) on another thread while this one stops the session
        self._hooks_lock = threading.Lock()
        self._spool_file: IO[str] | None = None
        self._spooler: Spooler | None = None
        self._last_spool = 0.0
        self._origin = 0.0
        self._report: Report | None = None
        self._tick_listeners: list[Callable[[], None]] = []
        self._status: StatusFile | None = None  # this session in the machine's registry (perfmagic exporter)
        self._running_stages = RunningStages()  # what it says of the steps ended so far
        self.tuning_status: str | None = None  # what tuning tries now (after the window), for live views
        self._running = False
        self._forked = False  # this is a copy of the session in a forked child: it writes nothing
        self._bounding = True  # folding old steps and thinning old samples (off after a failure)
        # spooling and folding: on the sampler thread, or on the training thread where that one fell behind
        self._upkeep_lock = threading.Lock()
        self._restore_env: Callable[[], None] | None = None  # puts back what profile_children set

    # -- lifecycle -------------------------------------------------------

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
                self._teardown()
            finally:
                self._drop_spool()
                with _active_lock:
                    _active = None
            raise
        return self

    def _start(self) -> None:
        self._origin = self.clock.now()
        self.timeline.meta.update(
            {
                "epoch": self.clock.wall(),
                "pid": os.getpid(),
                "hostname": socket.gethostname(),
                "rank": _env_int("RANK"),
                "local_rank": _env_int("LOCAL_RANK"),
                "node_rank": _env_int("GROUP_RANK"),  # torchrun's node rank
                "world_size": _env_int("WORLD_SIZE"),
                "argv": list(sys.argv),
                "python": sys.version.split()[0],
                "source": self.source,
                "interval": self.interval,
            }
        )
        self._open_spool()
        self._running = True
        meta = self.timeline.meta
        # a session that profiles code (not perfmagic run's own hardware sampler) is a training process
        self._status = (
            None
            if not self.hooks
            else StatusFile(
                {
                    k: meta[k]
                    for k in ("pid", "hostname", "rank", "local_rank", "node_rank", "world_size", "epoch")
                }
                | {"program": Path(sys.argv[0]).name if sys.argv and sys.argv[0] else None}
            )
        )
        if self.children:
            from perfmagic.bootstrap import profile_children

            self._restore_env = profile_children(self.outdir / CHILDREN_DIR, self.interval)
        if self.hooks:
            self.recorder = StageRecorder(self.timeline, self._origin, clock=self.clock)
            self.recorder.on_backlog = self._catch_up
            self.recorder.backlog_spans = BACKLOG_SPANS * SPAN_BUDGET
            self._start_framework_hooks()
        if self.sample:
            sources = list(self._sources if self._sources is not None else default_sources(self.clock))
            recorder = self.recorder
            if recorder is not None:  # where the training thread is, by stage: what fills "other"
                # first in each tick: the sampler has just won the GIL from the training thread, before
                # other sources' I/O hands it back and forth (which would favour moments in torch calls)
                sources.insert(0, StackSource(recorder))
        else:  # no metrics, but the thread still spools: a killed process keeps its record
            sources = []
        interval = self.interval if self.sample else _SPOOL_EVERY_S
        self._sampler = Sampler(
            self.timeline, sources, interval, self._clock, self._on_tick, timer=self.clock
        )
        self._sampler.start()
        # perfmagic's own start (hooks, first imports: tens of ms in a fresh process) is no start-up of the user's
        self.timeline.meta["ready_s"] = self._clock()

    def _open_spool(self) -> None:
        """Open the spool in ``outdir``; where that fails, in a temporary directory; else keep it in memory.

        The training must run whatever the disk says: each fallback is a warning.
        """
        for attempt in range(2):
            try:
                self.outdir.mkdir(parents=True, exist_ok=True)
                self._spool_file = open(self.outdir / SPOOL_NAME, "w", encoding="utf-8")  # noqa: SIM115
                self._spooler = Spooler(self.timeline, self._spool_file, settled=self._settled_spans)
                self._spooler.flush()
                return
            except OSError as e:
                self._drop_spool()
                if attempt == 0:
                    wanted, self.outdir = self.outdir, Path(tempfile.mkdtemp(prefix="perfmagic-"))
                    self.warnings.append(
                        f"cannot write to {wanted} ({e.strerror or e}): the record and report are in "
                        f"{self.outdir} instead"
                    )
                else:
                    self._spool_failed(e)

    def _spool_failed(self, error: OSError) -> None:
        self._drop_spool()
        self.warnings.append(
            f"the record could not be written to {self.outdir} ({error.strerror or error}): profiling went on "
            "in memory only, so a process killed before the end would have left no record"
        )

    def _drop_spool(self) -> None:
        file, self._spool_file, self._spooler = self._spool_file, None, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()

    def _start_framework_hooks(self) -> None:
        from perfmagic.collect import tfjax, torch_hooks

        assert self.recorder is not None
        if tfjax.available():
            self._tfjax = tfjax.TfJaxHooks(self.recorder, self._set_framework)
            self._tfjax.install()
            if self.trace_steps:
                from perfmagic.collect.tfjax_profiler import TfJaxProfiler
                from perfmagic.traces import xplane

                self._tfjax_tracer = TfJaxProfiler(self.recorder, self.outdir, xplane, steps=self.trace_steps)
                self._tfjax_tracer.start()
        if not torch_hooks.torch_available():
            if self._tfjax is None:
                self.warnings.append("torch is not installed: no training stages were recorded")
            return
        from perfmagic.collect.evaluation import EvaluationPasses

        self._evaluation = EvaluationPasses(self.recorder)
        # Hook torch now if it is imported, else as soon as the profiled code imports it.
        self._pending_import = when_imported("torch", self._install_torch)
        if not self._torch_failed:
            self._install_framework_hooks()

    def _set_framework(self, name: str, override: bool) -> None:
        """The report's ``framework``: ``override`` for the library that trains (Keras's backend)."""
        if override or not self.timeline.meta.get("framework"):
            self.timeline.meta["framework"] = name

    def _install_framework_hooks(self) -> None:
        """Hook the training frameworks now for those imported, at their import for the others."""
        from perfmagic.collect.frameworks import FrameworkHooks

        assert self.recorder is not None and self._evaluation is not None
        frameworks = FrameworkHooks(self.recorder, self._evaluation, lambda: self._torch)
        try:
            frameworks.install()
        except Exception as e:  # an unexpected framework version must not fail the block
            self.warnings += [*frameworks.uninstall(), f"framework hooks failed to install ({e!r})"]
        else:
            self._frameworks = frameworks

    def _install_torch(self, _module: object) -> None:
        """Hook torch; runs inside the profiled code's ``import torch`` when that comes later."""
        from perfmagic.collect import torch_hooks

        with self._hooks_lock:
            if not self._running or self.recorder is None:
                return
            hooks = torch_hooks.TorchStages(self.recorder, self._evaluation)
            hooks.kept.hold = self.tune
            try:
                hooks.install()  # on failure it has removed what it installed
            except Exception as e:  # an unexpected torch version must not fail the user's import or block
                self.warnings.append(
                    f"torch hooks failed to install ({e!r}): no training stages were recorded"
                )
                self._torch_failed = True
                frameworks, self._frameworks = self._frameworks, None
                if frameworks is not None:  # they would only call through: take them out too
                    self.warnings += frameworks.uninstall()
                return
            self._torch = hooks
            self.timeline.meta["framework"] = "torch"
            if self.trace_steps:
                from perfmagic.collect.torch_profiler import TorchProfiler

                tracer = TorchProfiler(
                    self.timeline,
                    self._origin,
                    self.outdir,
                    steps=self.trace_steps,
                    thread_id=self.recorder.thread_id,
                    recorder=self.recorder,
                )
                try:
                    tracer.start()
                except Exception as e:
                    self.warnings.append(
                        f"trace: torch.profiler failed to start ({e!r}); no trace was written"
                    )
                    with contextlib.suppress(Exception):
                        tracer.stop()  # whatever part of it started
                else:
                    self._tracer = tracer

    def stop(self) -> Report:
        """Turn every collector off, write the final record, build the report."""
        global _active
        if self._forked:  # the parent's record is the parent's: report what was seen, write nothing
            if self._report is None:
                self._report = self._build_report()
            return self._report
        if not self._running:
            if self._report is None:
                raise RuntimeError("session was never started")
            return self._report
        self._running = False
        self.timeline.meta["wall_s"] = self._clock()
        try:
            self._teardown()
            if self.tune:
                self._tune()
        finally:
            with _active_lock:
                _active = None
            self._tick_listeners = []
            if self._status is not None:
                self._status.remove()
                if self._status.failed:
                    self.warnings.append(self._status.failed)
            self.timeline.meta["warnings"] = list(self.warnings)
            try:
                self._finish_spool()
            except OSError as e:
                self._spool_failed(e)
                self.timeline.meta["warnings"] = list(self.warnings)
        self._report = self._build_report()
        try:
            self._report.save(self.outdir / REPORT_NAME)
        except OSError as e:
            self.warnings.append(f"report.json could not be written to {self.outdir} ({e.strerror or e})")
            self._report = self._build_report()  # the report says so itself
        return self._report

    def _build_report(self) -> Report:
        """The report of the window; if the analysis fails, a report that says so and keeps the record's place."""
        from perfmagic.report import report_from_timelines

        self.timeline.meta["warnings"] = list(self.warnings)
        try:
            return report_from_timelines(with_children(self.timeline, self.outdir), source=self.source)
        except Exception as e:  # a bug in perfmagic must not cost the user the block's results
            bare = Timeline(
                {**self.timeline.meta, "warnings": [*self.warnings, _analysis_failed(e, self.outdir)]}
            )
            return report_from_timelines([bare], source=self.source)

    def _teardown(self) -> None:
        """Remove every hook and stop the sampler (each part only if it started, even if another failed)."""
        try:
            with self._hooks_lock:
                parts: list[tuple[str, Callable[[], list[str] | None]]] = []
                if self._tracer is not None:
                    parts.append(("torch.profiler", self._tracer.stop))
                if self._tfjax_tracer is not None:
                    parts.append(("the TensorFlow/JAX profiler", self._tfjax_tracer.stop))
                if self._pending_import is not None:
                    parts.append(("the import hook", self._pending_import.remove))
                if self._frameworks is not None:
                    parts.append(("the framework hooks", self._frameworks.uninstall))
                if self._tfjax is not None:
                    parts.append(("the TensorFlow/JAX hooks", self._tfjax.uninstall))
                if self._torch is not None:
                    parts.append(("the torch hooks", self._torch.uninstall))
                if self.recorder is not None:
                    parts.append(("the stage recorder", self.recorder.close))
                for what, stop in parts:
                    try:
                        self.warnings += stop() or []
                    except Exception as e:
                        self.warnings.append(f"{what} failed to stop ({e!r})")
        finally:
            restore, self._restore_env = self._restore_env, None
            if restore is not None:
                restore()
            if self._sampler is not None:
                self._sampler.stop()
                self.warnings += self._sampler.warnings
                self.timeline.meta["sampler"] = {
                    "ticks": self._sampler.ticks,
                    "busy_s": self._sampler.busy_s,
                }

    def _tune(self) -> None:
        """Try the fixes on what the window met (after it: the hooks are off), into ``meta["tuning"]``."""
        from perfmagic.analyze.steady import steady_of
        from perfmagic.analyze.steps import step_breakdown
        from perfmagic.tuning import BENCHMARKED, default_budget, tune

        objects = self._torch.kept.for_tuning() if self._torch is not None else {}
        if not objects:
            self.warnings.append("tune: no DataLoader or model was seen in the window: nothing to try")
            return
        steady = steady_of(step_breakdown(self.timeline))
        budget = self.tune_budget or default_budget(float(self.timeline.meta.get("wall_s") or 0.0))
        try:
            self.timeline.meta["tuning"] = tune(
                **objects,
                budget_s=max(budget, 0.5),
                step_s=steady.step_s if steady else None,
                data_s=steady.stage_s("data") if steady else None,
                extra_s=steady.step_s - steady.stage_s(*BENCHMARKED) if steady else 0.0,
                autocast_in_use=bool(self._torch.stats["autocast_forwards"]) if self._torch else False,
                progress=self._tuning_progress,
            )
        except Exception as e:  # the report of the window must not be lost to a tuning failure
            self.warnings.append(f"tune: tuning failed ({e!r}); the report covers the window only")
        finally:
            assert self._torch is not None
            self._torch.kept.clear()  # the batches kept for tuning: no longer needed

    def _tuning_progress(self, what: str, left_s: float) -> None:
        """What tuning tries now, for live views (their tick listeners run: the sampler has stopped)."""
        self.tuning_status = f"tuning {what} · {left_s:.0f} s left"
        self._notify_listeners()

    def _finish_spool(self) -> None:
        """Bring the spool up to date (the recorder has closed: every span's times are final)."""
        if self._spool_file is None or self._spooler is None:
            return
        self._spooler.flush()
        self._spool_file.close()
        self._spool_file = None
        self.timeline.record = self.outdir / SPOOL_NAME

    def flush_spool(self) -> None:
        """Write what the spool lacks now, from any thread (a process about to end without ``stop``)."""
        spooler = self._spooler
        if spooler is not None and not self._forked:
            spooler.flush()

    def _settled_spans(self) -> int:
        """Spans whose times are final (a device time may still move the others): the spool takes these."""
        recorder = self.recorder
        return recorder.settled_spans if recorder is not None else self.timeline.span_count

    def _bound_memory(self) -> None:
        """Fold old steps into rows and average old samples in pairs once they pass their budgets.

        Only what the spool holds goes (memory-only sessions: whatever is settled), so the spool
        keeps every detail; the profiled thread applies a fold at its next step boundary.
        """
        tl, spooler = self.timeline, self._spooler
        settled_samples = spooler.samples_sent if spooler is not None else tl.sample_count
        if tl.raw_span_count() > SPAN_BUDGET and tl.pending_fold is None:
            settled = spooler.spans_sent if spooler is not None else self._settled_spans()
            fold = plan_fold(tl, SPAN_BUDGET // 4, settled, settled_samples)
            if fold is not None:
                tl.request_fold(fold)
        for metric in tl.metrics:
            held = tl.sample_count(metric) - tl.sample_base(metric)
            if held > SERIES_BUDGET and not metric.startswith(THREAD_PREFIX):  # thread.*: folded with steps
                tl.thin(metric, min(held // 2, settled_samples(metric) - tl.sample_base(metric)))

    def _forget_in_child(self) -> None:
        """After ``fork``: the child shares the parent's spool file but none of its threads; it records nothing."""
        self._forked = True
        self._running = False
        if self.recorder is not None:
            self.recorder.stop_recording()
        self._spool_file = self._spooler = None  # not closed: closing could flush into the parent's file
        # the sampler's sources may hold CUDA objects of the parent: kept, never freed here (see
        # StageRecorder.stop_recording)
        keep_until_exit(self._sampler)
        self._sampler = None

    def _clock(self) -> float:
        return self.clock.now() - self._origin

    def add_tick_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the sampler thread after every tick until ``stop`` (live views hang here).

        A listener that raises is dropped with a warning; the others keep running.
        """
        self._tick_listeners = [*self._tick_listeners, fn]

    def _on_tick(self) -> None:
        # spans pass the budget: spool them now, so that they can be folded
        backlog = self.timeline.raw_span_count() > SPAN_BUDGET and self._bounding
        self._upkeep(spool=backlog or self.clock.now() - self._last_spool >= _SPOOL_EVERY_S)
        if self._running and self._status is not None:  # for perfmagic exporter: this process's progress
            recorder, stages = self.recorder, self._running_stages

            def stage_seconds() -> dict[str, float]:
                stages.add_ended(self.timeline)
                return stages.totals

            steps, stage = (recorder.step_count, recorder.current_stage) if recorder else (0, None)
            self._status.publish(steps, stage, stage_seconds)
        self._notify_listeners()

    def _upkeep(self, spool: bool) -> None:
        """Spool what is new (where ``spool``), then fold old steps and thin old samples."""
        with self._upkeep_lock:  # two threads planning folds at once could cut the same spans twice
            if not self._running:
                return
            if spool:
                self._last_spool = self.clock.now()
                if self._spooler is not None:
                    try:
                        self._spooler.flush()
                    except OSError as e:  # a full or lost disk: go on in memory
                        self._spool_failed(e)
            if self._bounding:
                try:
                    self._bound_memory()
                except Exception as e:  # a bug here costs memory on a long run, not the training
                    self._bounding = False
                    self.warnings.append(f"old steps could not be folded ({e!r}): memory grows with the run")

    def _catch_up(self) -> None:
        """On the training thread, at a step end: the sampler thread fell :data:`BACKLOG_SPANS` budgets
        behind, so spool and fold here (the recorder applies the fold right after)."""
        if self._bounding:
            self._upkeep(spool=True)

    def _notify_listeners(self) -> None:
        for fn in self._tick_listeners:
            try:
                fn()
            except Exception as e:  # a view that fails must not end the sampling, nor the tuning
                self._tick_listeners = [f for f in self._tick_listeners if f is not fn]
                self.warnings.append(f"a live view failed and was turned off ({e!r})")

    # -- results ---------------------------------------------------------

    @property
    def report(self) -> Report:
        if self._report is None:
            raise RuntimeError("the report exists once the profiled block has ended")
        return self._report

    # -- context manager -------------------------------------------------

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            try:
                self.stop()
            except Exception as e:  # perfmagic's failure is not the training's: the code after the block runs
                warnings.warn(f"perfmagic could not finish the profile ({e!r})", RuntimeWarning, stacklevel=2)
            return
        self.warnings.append(f"the profiled block ended with {exc_type.__name__}: the report covers what ran")
        try:
            self.stop()
        except Exception as e:  # the block's own exception is the one to propagate, not ours
            warnings.warn(f"perfmagic could not finish the profile ({e!r})", RuntimeWarning, stacklevel=2)


def _after_fork_in_child() -> None:
    global _active
    session, _active = _active, None
    if session is not None:
        session._forget_in_child()


# A child forked while profiling (multiprocessing's fork start method, os.fork) must not write into the
# parent's record. Registered once, on import: it does nothing unless a session is active.
os.register_at_fork(after_in_child=_after_fork_in_child)


def _analysis_failed(error: Exception, outdir: Path) -> str:
    return (
        f"the analysis failed ({error!r}): this report has no figures; the record is in {outdir} "
        "(perfmagic.load() rebuilds the report once the bug is fixed)"
    )


def profile(**options: Any) -> Session:
    """Profile a block: ``with perfmagic.profile() as session: train()``."""
    return Session(**options)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """A user-named stage (and NVTX range) around a block."""
    if not isinstance(name, str) or not name or name.startswith(STEP_BOUNDARY_PREFIX):
        raise ValueError(
            f"perfmagic.stage: a stage name is a non-empty string not starting with {STEP_BOUNDARY_PREFIX!r} "
            f"(those mark step ends), got {name!r}"
        )
    session = _active
    recorder = session.recorder if session is not None else None
    with (recorder or NO_RECORDER).stage(name):
        yield


def step() -> None:
    """Mark the end of a training step, where no optimizer or DataLoader shows it."""
    session = _active
    if session is not None and session.recorder is not None:
        session.recorder.boundary("user")


def load(path: str | os.PathLike[str]) -> Report:
    """Rebuild a report from a session's output directory, its spool or a report file."""
    from perfmagic.report import Report, report_from_timelines

    p = Path(path)
    if p.is_file() and p.name != SPOOL_NAME and p.suffix == ".json":
        return Report.load(p)
    if p.is_dir() and not (p / SPOOL_NAME).exists() and (p / REPORT_NAME).exists():
        return Report.load(p / REPORT_NAME)  # a perfmagic run directory: the records are per process
    timeline = Timeline.load(p)
    timelines = with_children(timeline, p) if p.is_dir() else [timeline]
    return report_from_timelines(timelines, source=str(timeline.meta.get("source", "live")))


def with_children(timeline: Timeline, outdir: Path) -> list[Timeline]:
    """A window's timeline and those of the interpreters it started (``outdir/children``), on its clock."""
    from perfmagic.merge import on_one_clock, read_node

    directory = outdir / CHILDREN_DIR
    if not directory.is_dir():
        return [timeline]
    node = read_node(directory)
    if not node.processes:
        return [timeline]
    timeline.meta["warnings"] = [*timeline.meta.get("warnings", []), *node.warnings]
    timelines = [timeline, *node.processes]
    on_one_clock(timelines, timeline.meta.get("epoch"))
    return timelines


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
