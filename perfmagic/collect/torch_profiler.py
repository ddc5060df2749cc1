"""The ``--trace`` collector: torch.profiler over a bounded number of training steps.

Steps are counted at each optimizer step (the global post-hook), so the profiler
waits ``wait`` steps, warms up ``warmup``, records ``steps`` and then turns itself
off: the heavy mode costs only those few steps. The Chrome trace goes to the
output directory, and a ``torch_trace`` mark, placed at the instant of one event
of that trace (a ``record_function`` label), records where it is: that is how the
Chrome-trace export puts both on one clock.

libkineto writes ``USDT ... profiler_start/stop`` lines to the C-level stderr at
every transition; they go to ``torch_profiler.log`` in the output directory, and
fd 2 is restored after each call, whatever happens.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from perfmagic.collect.clock_pin import pin_clock
from perfmagic.collect.recorder import StageRecorder
from perfmagic.schema import TORCH_TRACE_MARK
from perfmagic.timeline import Timeline

TRACE_NAME = "torch_trace.json"
LOG_NAME = "torch_profiler.log"


class TorchProfiler:
    """Runs torch.profiler for ``steps`` optimizer steps after ``wait`` + ``warmup`` steps.

    ``origin`` is the ``time.perf_counter()`` of the timeline's zero; ``thread_id``
    the training thread (the creating thread by default). Given the stage recorder, each
    stage it records while the profiler runs is also a ``## stage ##`` range in the
    trace, so ``perfmagic report`` on the trace finds perfmagic's own stages.
    """

    def __init__(
        self,
        timeline: Timeline,
        origin: float,
        outdir: str | os.PathLike[str],
        steps: int = 5,
        wait: int = 1,
        warmup: int = 1,
        thread_id: int | None = None,
        recorder: StageRecorder | None = None,
    ) -> None:
        if steps < 1:
            raise ValueError(f"--steps must be at least 1, got {steps}")
        self.timeline = timeline
        self.steps = steps
        self.warnings: list[str] = []
        self._origin = origin
        self._wait, self._warmup = wait, warmup
        self._outdir = Path(outdir)
        self._prof: Any = None
        self._hook: Any = None
        # the training thread's steps count, wherever torch happened to be imported
        self._thread = threading.get_ident() if thread_id is None else thread_id
        self._stepped = 0
        self._clock_t: float | None = None
        self._clock_name = ""  # the trace's annotation at ``_clock_t``
        self._written: Path | None = None
        self._recorder = recorder
        self._stopped = False

    def start(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=self._wait, warmup=self._warmup, active=self.steps, repeat=1),
            on_trace_ready=self._export,
        )
        with self._quiet():
            self._prof.start()
        self._hook = register_optimizer_step_post_hook(self._on_step)
        if self._recorder is not None:
            self._recorder.annotate = _annotation

    def _stop_annotating(self) -> None:
        if self._recorder is not None:
            self._recorder.annotate = None

    def stop(self) -> list[str]:
        """Stop profiling (writing the trace if it recorded anything); returns warnings.
        A second call does nothing."""
        if self._stopped:
            return []
        self._stopped = True
        self._stop_annotating()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._prof is not None:
            prof, self._prof = self._prof, None
            with self._quiet():
                prof.stop()
        if self._written is not None and self._clock_t is not None:
            # The mark sits at the clock label's instant, and that is the alignment: Timeline.rebase
            # (``perfmagic run`` puts every process on one clock) moves mark times, not payloads.
            self.timeline.add_mark(
                self._clock_t,
                TORCH_TRACE_MARK,
                path=str(self._written),
                clock_name=self._clock_name,
                steps=max(0, min(self.steps, self._stepped - self._wait - self._warmup)),
            )
        else:
            self.warnings.append(
                f"--trace: torch.profiler recorded nothing: it needs {self._wait + self._warmup + 1} optimizer "
                f"steps and saw {self._stepped}"
            )
        return self.warnings

    def _clock(self) -> float:
        return time.perf_counter() - self._origin

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._prof is None or threading.get_ident() != self._thread:
            return
        self._stepped += 1
        if self._stepped > self._wait + self._warmup + self.steps:
            self._stop_annotating()  # the trace is written: stages cost their usual again
            return
        with self._quiet():
            self._prof.step()
        if self._stepped == self._wait + self._warmup:  # now recording: pin one event to our clock
            from torch.profiler import record_function

            self._clock_name, self._clock_t = pin_clock(record_function, self._clock)

    def _export(self, prof: Any) -> None:
        path = self._outdir / TRACE_NAME
        prof.export_chrome_trace(str(path))
        self._written = path

    @contextmanager
    def _quiet(self) -> Iterator[None]:
        with redirect_fd2(self._outdir / LOG_NAME):
            yield


def _annotation(stage: str) -> Callable[[], object]:
    """Open a ``## stage ##`` range in torch.profiler's trace; returns what closes it."""
    from torch.autograd.profiler import record_function

    annotation: Any = record_function(f"## {stage} ##")
    annotation.__enter__()
    return lambda: annotation.__exit__(None, None, None)


@contextmanager
def redirect_fd2(path: Path) -> Iterator[None]:
    """Send the C-level stderr (fd 2) to ``path`` (appending) for the block; always restored."""
    saved = os.dup(2)
    try:
        with open(path, "ab") as f:
            os.dup2(f.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)
