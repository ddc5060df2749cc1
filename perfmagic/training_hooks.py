"""The hooks into the training frameworks a window installs, and the tracers that ride on them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from perfmagic.collect import tfjax
from perfmagic.collect.collectors import Collectors, Switch
from perfmagic.collect.imports import installed, when_imported
from perfmagic.collect.recorder import StageRecorder
from perfmagic.timeline import Timeline

if TYPE_CHECKING:
    from perfmagic.collect.evaluation import EvaluationPasses
    from perfmagic.collect.torch_hooks import TorchStages

Progress = Callable[[str, float], None]
"""What tuning tries now and the seconds it has left, for live views."""


class TrainingHooks:
    """A collector: hooks torch (now, or inside the profiled code's ``import torch``), TensorFlow, Keras,
    JAX and the frameworks over torch, with ``trace_steps`` steps of the framework's own profiler.

    A framework whose hooks fail to install costs a warning in ``warnings``, not the block. ``torch``
    holds the torch hooks once installed (tuning reads what they kept where ``keep_inputs``).
    """

    def __init__(
        self, recorder: StageRecorder, outdir: Path, trace_steps: int, keep_inputs: bool, warnings: list[str]
    ) -> None:
        self.recorder, self.outdir, self.trace_steps = recorder, outdir, trace_steps
        self.keep_inputs, self.warnings = keep_inputs, warnings
        self.torch: TorchStages | None = None
        self._evaluation: EvaluationPasses | None = None  # shared by the torch and framework hooks
        self._running = Collectors()
        self._frameworks: Switch | None = None
        self._torch_failed = False
        self._lock = threading.Lock()  # torch may be imported (and hooked) on another thread than stop's
        self._stopped = False

    def start(self) -> None:
        if tfjax.available():
            self._start_tfjax()
        if not installed("torch"):
            if not tfjax.available():
                self.warnings.append("torch is not installed: no training stages were recorded")
            return
        from perfmagic.collect.evaluation import EvaluationPasses
        from perfmagic.collect.frameworks import FrameworkHooks

        self._evaluation = EvaluationPasses(self.recorder)
        pending = when_imported("torch", self._install_torch)
        if pending is not None:
            self._running.start("the import hook", Switch(lambda: None, pending.remove))
        if self._torch_failed:
            return
        frameworks = FrameworkHooks(self.recorder, self._evaluation, lambda: self.torch)
        switch = Switch(frameworks.install, frameworks.uninstall)
        try:
            self._running.start("the framework hooks", switch)
        except Exception as e:  # an unexpected framework version must not fail the block
            self.warnings += [*frameworks.uninstall(), f"framework hooks failed to install ({e!r})"]
        else:
            self._frameworks = switch

    def _start_tfjax(self) -> None:
        hooks = tfjax.TfJaxHooks(self.recorder, self._set_framework)
        self._running.start("the TensorFlow/JAX hooks", Switch(hooks.install, hooks.uninstall))
        if self.trace_steps:
            from perfmagic.collect.tfjax_profiler import TfJaxProfiler
            from perfmagic.traces import xplane

            tracer = TfJaxProfiler(self.recorder, self.outdir, xplane, steps=self.trace_steps)
            self._running.start("the TensorFlow/JAX profiler", tracer)

    def _set_framework(self, name: str, override: bool) -> None:
        """The report's ``framework``: ``override`` for the library that trains (Keras's backend)."""
        meta = self.recorder.timeline.meta
        if override or not meta.get("framework"):
            meta["framework"] = name

    def _install_torch(self, _module: ModuleType) -> None:
        """Hook torch; runs inside the profiled code's ``import torch`` when that comes later."""
        with self._lock:
            if self._stopped:
                return
            # imported with torch, not at start: a process that never imports torch never pays for it
            from perfmagic.collect.torch_hooks import TorchStages

            hooks = TorchStages(self.recorder, self._evaluation)
            hooks.kept.hold = self.keep_inputs
            try:  # on failure it has removed what it installed
                self._running.start("the torch hooks", Switch(hooks.install, hooks.uninstall))
            except Exception as e:  # an unexpected torch version must not fail the user's import or block
                self.warnings.append(
                    f"torch hooks failed to install ({e!r}): no training stages were recorded"
                )
                self._torch_failed = True
                if self._frameworks is not None:  # they would only call through: take them out too
                    self.warnings += self._frameworks.stop()
                return
            self.torch = hooks
            self.recorder.timeline.meta["framework"] = "torch"
            if self.trace_steps:
                self._start_torch_tracer()

    def _start_torch_tracer(self) -> None:
        from perfmagic.collect.torch_profiler import TorchProfiler

        recorder = self.recorder
        tracer = TorchProfiler(
            recorder.timeline,
            recorder.origin,
            self.outdir,
            steps=self.trace_steps,
            thread_id=recorder.thread_id,
            recorder=recorder,
        )
        try:
            self._running.start("torch.profiler", tracer)
        except Exception as e:
            self.warnings.append(f"trace: torch.profiler failed to start ({e!r}); no trace was written")

    def stop(self) -> list[str]:
        with self._lock:
            self._stopped = True
            return self._running.stop()


def tune_after(
    hooks: TrainingHooks | None, timeline: Timeline, budget_s: float | None, progress: Progress
) -> list[str]:
    """Try the fixes on what the window's torch hooks met (after it: the hooks are off), into
    ``meta["tuning"]``, in ``budget_s`` (None: the default for the window's length); returns
    warnings. The batches kept for it are let go."""
    from perfmagic.analyze.steady import tuning_baseline
    from perfmagic.tuning import default_budget, tune

    if budget_s is None:
        budget_s = default_budget(float(timeline.meta.get("wall_s") or 0.0))

    torch = hooks.torch if hooks is not None else None
    objects = torch.kept.for_tuning() if torch is not None else {}
    if torch is None or not objects:
        return ["tune: no DataLoader or model was seen in the window: nothing to try"]
    try:
        timeline.meta["tuning"] = tune(
            **objects,
            **tuning_baseline(timeline),
            budget_s=max(budget_s, 0.5),
            autocast_in_use=bool(torch.stats["autocast_forwards"]),
            progress=progress,
        )
    except Exception as e:  # the report of the window must not be lost to a tuning failure
        return [f"tune: tuning failed ({e!r}); the report covers the window only"]
    finally:
        torch.kept.clear()  # the batches kept for tuning: no longer needed
    return []
