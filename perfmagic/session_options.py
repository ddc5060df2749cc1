"""What a profiling session does, checked once: bad options are a clear error before anything starts."""

from __future__ import annotations

from dataclasses import dataclass

from perfmagic.price import gpu_hour_price


@dataclass(frozen=True)
class SessionOptions:
    """A session's options (see :class:`perfmagic.session.Session`), each one valid."""

    interval: float = 0.1  # seconds between samples
    hooks: bool = True  # record stages (off: sampling alone, as perfmagic run's own process)
    sample: bool = True  # sample metrics (off: the thread still spools)
    source: str = "live"
    trace_steps: int = 0  # the framework's profiler over this many steps (0: off)
    tune: bool = False
    tune_budget: float | None = None
    children: bool = True  # profile the Python interpreters the block starts
    price_per_gpu_hour: float | None = None
    full: bool = False  # record every step's stages (else windows of steps: ``collect.schedule``)

    @property
    def every_step(self) -> bool:
        """Whether every step's stages are recorded: asked for, or needed by tuning (what every step's
        hooks keep) or a trace (the stages of its steps)."""
        return self.full or self.tune or bool(self.trace_steps)


def checked_options(
    *,
    interval: float,
    hooks: bool,
    sample: bool,
    source: str,
    trace: bool | int,
    tune: bool,
    tune_budget: float | None,
    children: bool,
    price_per_gpu_hour: float | None,
    full: bool = False,
) -> SessionOptions:
    """The options as given, checked; ``ValueError`` naming the first bad one."""
    if not interval > 0:
        raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
    if tune_budget is not None and not (isinstance(tune_budget, (int, float)) and tune_budget > 0):
        raise ValueError(f"tune_budget must be a positive number of seconds, got {tune_budget!r}")
    if not isinstance(tune, bool):
        raise ValueError(f"tune must be True or False, got {tune!r}")
    if not isinstance(full, bool):
        raise ValueError(f"full must be True or False, got {full!r}")
    # torch.profiler over this many training steps (True: 5); the heavy mode is opt-in and bounded
    trace_steps = 5 if trace is True else int(trace)
    if trace_steps < 0:
        raise ValueError(f"trace must be a number of steps >= 0, got {trace!r}")
    return SessionOptions(
        interval=float(interval),
        hooks=hooks,
        sample=sample,
        source=source,
        trace_steps=trace_steps,
        tune=tune,
        tune_budget=tune_budget,
        children=children,
        price_per_gpu_hour=gpu_hour_price(price_per_gpu_hour),
        full=full,
    )
