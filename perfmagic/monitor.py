"""``%gpumonitor``: GPU and host telemetry in a live panel, without profiling any code."""

from __future__ import annotations

import time

from perfmagic.collect.sampler import Sampler
from perfmagic.collect.sources import default_sources
from perfmagic.render.live import LivePanel
from perfmagic.timeline import Timeline


class Monitor:
    """A sampler and a live panel that follows it."""

    def __init__(self, interval: float = 0.5) -> None:
        self.timeline = Timeline()
        self.recorder: None = None  # no code is profiled, so no stages: the panel shows devices only
        self.tuning_status: None = None  # nor tuned
        self._origin = time.perf_counter()
        self.panel = LivePanel(self, title="perfmagic monitor")
        self._sampler = Sampler(self.timeline, default_sources(), interval, self._clock, self.panel.update)

    def _clock(self) -> float:
        return time.perf_counter() - self._origin

    def start(self) -> None:
        self._sampler.start()
        self.panel.update(force=True)

    def stop(self) -> list[str]:
        """Stop sampling and updating the panel, whose widgets stay open; returns the sampler's warnings."""
        try:
            self._sampler.stop()
        finally:
            self.panel.freeze()
        return self._sampler.warnings

    def close(self) -> None:
        """Stop, and close the panel's widgets (put something in their output's place first)."""
        try:
            self.stop()
        finally:
            self.panel.close()
