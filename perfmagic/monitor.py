"""``%gpumonitor``: GPU and host telemetry in a live panel, without profiling any code; when it
stops, a summary of what it saw (:meth:`Monitor.summary`) takes the panel's place."""

from __future__ import annotations

from collections.abc import Sequence

from perfmagic.analyze.monitoring import MonitorSummary, monitor_summary
from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.sampler import Sampler, Source
from perfmagic.collect.sources import default_sources
from perfmagic.render.live import LivePanel
from perfmagic.timeline import Timeline


class Monitor:
    """A sampler and a live panel that follows it.

    ``clock`` times the samples, the sampler's cadence and the panel (a test's fake one drives them);
    ``sources`` default to a session's (NVML, the host, ...).
    """

    def __init__(
        self, interval: float = 0.5, *, clock: Clock = REAL_CLOCK, sources: Sequence[Source] | None = None
    ) -> None:
        self.timeline = Timeline()
        self.recorder: None = None  # no code is profiled, so no stages: the panel shows devices only
        self.tuning_status: None = None  # nor tuned
        self.clock = clock
        self._origin = clock.now()
        self._stopped_at: float | None = None
        self.panel = LivePanel(self, title="perfmagic monitor", now=clock.now)
        chosen = list(sources) if sources is not None else default_sources(clock)
        self._sampler = Sampler(self.timeline, chosen, interval, self._clock, self.panel.update, timer=clock)

    def _clock(self) -> float:
        return self.clock.now() - self._origin

    def start(self) -> None:
        self._sampler.start()
        self.panel.update(force=True)

    def stop(self) -> list[str]:
        """Stop sampling and updating the panel, whose widgets stay open until :meth:`close`; returns
        the sampler's warnings."""
        try:
            self._sampler.stop()
        finally:
            if self._stopped_at is None:
                self._stopped_at = self._clock()
            self.panel.freeze()
        return self._sampler.warnings

    def close(self) -> None:
        """Stop, and close the panel's widgets (put something in their output's place first)."""
        try:
            self.stop()
        finally:
            self.panel.close()

    def summary(self) -> MonitorSummary:
        """What the monitor saw, from its start to its stop (to now while it runs)."""
        seconds = self._stopped_at if self._stopped_at is not None else self._clock()
        return monitor_summary(self.timeline, seconds)
