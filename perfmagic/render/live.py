"""The live panel: GPU and host utilization and the training's stages while a cell runs.

ipywidgets for the numbers, an SVG chart of utilization over the last minute
(:mod:`perfmagic.render.live_chart`), and the share of step time per stage building
up with a bar per recent step. Messages only go from the kernel to the browser: one
the browser sent while the cell ran would reach the kernel after the cell, once the
panel's comms are closed. :meth:`LivePanel.update` runs on the sampler's thread
after each tick and does its work at most ``max_hz`` times a second (the stage
shares once a second, over the steps ended since: the cost follows the steps, not
the run's length); the training thread never runs any of it. It only reads: the
timeline's latest samples and spans, and the recorder's current stage and step count.
"""

from __future__ import annotations

import html
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from perfmagic.analyze.running import RunningStages
from perfmagic.contract import DeviceInfo
from perfmagic.render.colors import stage_color
from perfmagic.render.live_chart import UtilizationChart
from perfmagic.schema import MEMORY_METRICS, MEMORY_NAME, memory_kind
from perfmagic.timeline import Timeline
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_rate, fmt_seconds

_RATE_WINDOW_S = 3.0
_BAR = {"width": "150px"}
STAGES_PERIOD_S = 1.0
"""How often the stage shares are added up: each time costs in proportion to the spans since the last."""
RECENT_STEPS = 40
"""Per-step bars the panel shows: the last this many steps."""


class Stages(Protocol):
    """What a panel reads of a stage recorder, from the sampler's thread."""

    @property
    def current_stage(self) -> str | None: ...

    @property
    def step_count(self) -> int: ...


class Feed(Protocol):
    """What a panel watches: a session, or a bare sampler's timeline (no recorder)."""

    @property
    def timeline(self) -> Timeline: ...

    @property
    def recorder(self) -> Stages | None: ...

    @property
    def tuning_status(self) -> str | None:
        """What tuning tries now, once the window has ended; None before and without tuning."""
        ...


class LivePanel:
    """Widgets that follow a running feed; ``widget`` is what the notebook displays."""

    def __init__(
        self,
        feed: Feed,
        *,
        title: str = "perfmagic",
        max_hz: float = 4.0,
        window_s: float = 60.0,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``now`` is the clock the panel's rate limit and elapsed time read (a test's fake one)."""
        import ipywidgets as w

        self._now = now
        self.feed = feed
        self.title = title
        self.min_period = 1.0 / max_hz
        self.updates = 0
        self.busy_s = 0.0  # wall time spent updating, on the sampler thread (waits for the GIL included)
        self.cpu_s = 0.0  # CPU time of those updates: what they take from the training
        self._start = now()
        self._last = 0.0
        self._steps: deque[tuple[float, int]] = deque()
        self._gpu_rows: dict[int, tuple[Any, Any, Any, Any, Any]] = {}
        self._frozen = False  # no more updates: the widgets are about to close, or closed
        self._closed = False
        self._lock = threading.Lock()

        self._status = w.HTML(self._status_html(None, 0, None))
        self._status.add_class("pm-live-status")
        self._gpus = w.VBox([w.HTML("<i>waiting for the first sample…</i>")])
        self._gpus.add_class("pm-live-gpus")
        self._cpu = w.FloatProgress(min=0, max=100, bar_style="info", layout=_BAR)
        self._cpu_text = w.HTML()
        self._host_text = w.HTML()
        self._cpu_text.add_class("pm-live-cpu")
        self._host = host = w.HBox(
            [
                w.HTML("<b>Host</b>&nbsp;CPU", layout={"width": "90px"}),
                self._cpu,
                self._cpu_text,
                self._host_text,
            ]
        )
        # the stage shares, added up from the steps ended since the last look
        self._stages = w.HTML()
        self._stages.add_class("pm-live-stages")
        self._running = RunningStages()
        self._recent: deque[dict[str, float]] = deque(maxlen=RECENT_STEPS)
        self._stages_at = 0.0
        self._chart = UtilizationChart(window_s)
        self._chart_view = w.HTML()
        children = [self._status, self._stages, self._gpus, host, self._chart_view]
        self.widget = w.VBox(children, layout={"border": "1px solid #d0d7de", "padding": "6px 10px"})
        self.widget.add_class("perfmagic-live")

    # -- updates (sampler thread) ------------------------------------------

    def update(self, force: bool = False) -> None:
        """Refresh from the feed, unless the last refresh was less than ``1/max_hz`` ago."""
        begin = self._now()
        if not force and begin - self._last < self.min_period:
            return
        if not self._lock.acquire(blocking=False):  # another thread is refreshing right now
            return
        cpu = time.thread_time()
        try:
            if not self._frozen:
                self._last = begin
                self._refresh(begin)
        finally:
            self._lock.release()
        self.cpu_s += time.thread_time() - cpu
        self.busy_s += self._now() - begin

    def _refresh(self, begin: float) -> None:
        tl = self.feed.timeline
        recorder = self.feed.recorder
        steps = recorder.step_count if recorder is not None else None
        stage = recorder.current_stage if recorder is not None else None
        tuning = self.feed.tuning_status
        if tuning is not None:  # the window has ended: its figures stand, and tuning says how far it is
            self._status.value = f"<b>{html.escape(self.title)}</b> · {html.escape(tuning)}"
            return
        self._status.value = self._status_html(stage, steps, self._step_rate(begin, steps))
        if recorder is not None and (begin - self._stages_at >= STAGES_PERIOD_S or not self._stages_at):
            self._stages_at = begin
            self._update_stages(tl)
        gpu_utils = self._update_gpus(tl)
        cpu = _latest(tl, "host.cpu_util")
        self._cpu.value = 0.0 if cpu is None else cpu * 100
        self._cpu_text.value = f"&nbsp;{fmt_fraction(cpu)}"
        cores = _latest(tl, "host.proc_cpu_cores")
        parts = [
            f"process {cores:.1f} cores" if cores is not None else None,
            memory_now(tl),
            f"read {fmt_bytes(_rate(tl, 'host.read_bytes'))}/s",
            f"write {fmt_bytes(_rate(tl, 'host.write_bytes'))}/s",
        ]
        self._host_text.value = "&nbsp;·&nbsp;" + " · ".join(p for p in parts if p)
        gpu = float(np.mean(gpu_utils)) * 100 if gpu_utils else np.nan
        self._chart.add(begin - self._start, gpu=gpu, cpu=np.nan if cpu is None else cpu * 100)
        self._chart_view.value = self._chart.html()
        self.updates += 1

    def freeze(self) -> None:
        """Stop updating; waits for an update under way. The widgets stay open (see :meth:`close`)."""
        with self._lock:
            self._frozen = True

    def close(self) -> None:
        """Stop updating and close every widget's comm, layouts and styles included.

        Replace the panel's output first (with a report, or :meth:`snapshot`): a view whose model
        closes under it leaves the notebook an output that no kernel can draw again.
        """
        self.freeze()
        with self._lock:
            if not self._closed:
                self._closed = True
                _close(self.widget)

    def snapshot(self, note: str) -> dict[str, str]:
        """The panel as it stands, static (HTML without widgets), under the line ``note``."""
        rows = [*self._gpus.children, self._host]
        lines = "".join(f"<div>{_row_html(row)}</div>" for row in rows)
        body = f"{self._stages.value}{lines}{self._chart.html()}"
        return {
            "text/plain": note,
            "text/html": f'<div class="pm-live-snapshot" style="border:1px solid #d0d7de;padding:6px 10px">'
            f"<div><b>{html.escape(note)}</b></div>{body}</div>",
        }

    # -- parts -------------------------------------------------------------

    def _update_gpus(self, tl: Timeline) -> list[float]:
        if "nvml" not in tl.meta:
            return []
        nvml = tl.meta["nvml"]
        if not nvml["available"]:
            if not self._gpu_rows:
                import ipywidgets as w

                reason = html.escape(str(nvml["reason"] or "NVML is not available"))
                _replace_children(self._gpus, [w.HTML(f"<b>No GPU</b>: {reason}. Showing the host only.")])
                self._gpu_rows[-1] = (None, None, None, None, None)
            return []
        devices = tl.meta["devices"] if "devices" in tl.meta else []
        if not self._gpu_rows and devices:
            _replace_children(self._gpus, [self._gpu_row(d) for d in devices])
        utils = []
        for d in devices:
            i = int(d["index"])
            row = self._gpu_rows.get(i)
            if row is None:
                continue
            util_bar, util_text, mem_bar, mem_text, power = row
            util = _latest(tl, f"gpu{i}.util")
            mem = _latest(tl, f"gpu{i}.mem_used_bytes")
            watts = _latest(tl, f"gpu{i}.power_w")
            if util is not None:
                utils.append(util)
            util_bar.value = 0.0 if util is None else util * 100
            util_text.value = f"&nbsp;{fmt_fraction(util)}"
            total = d["mem_total_bytes"] if "mem_total_bytes" in d else None
            mem_bar.value = 0.0 if mem is None or not total else 100 * mem / total
            mem_text.value = f"&nbsp;{fmt_bytes(mem)} / {fmt_bytes(total)}"
            power.value = "" if watts is None else f"&nbsp;·&nbsp;{watts:.0f} W"
        return utils

    def _update_stages(self, tl: Timeline) -> None:
        """Add the steps ended since the last time to the shares and the recent bars."""
        steps = self._running.add_ended(tl)
        if steps is None:
            return
        for row in steps.seconds[-RECENT_STEPS:]:
            self._recent.append({n: float(x) for n, x in zip(steps.stages, row, strict=True) if x > 0})
        running = self._running
        self._stages.value = _stages_html(running.totals, running.steps, list(self._recent))

    def _gpu_row(self, device: DeviceInfo) -> Any:
        import ipywidgets as w

        i = int(device["index"])
        util_bar = w.FloatProgress(min=0, max=100, bar_style="success", layout=_BAR)
        mem_bar = w.FloatProgress(min=0, max=100, bar_style="warning", layout=_BAR)
        util_text, mem_text, power = w.HTML(), w.HTML(), w.HTML()
        util_text.add_class("pm-live-gpu-util")
        self._gpu_rows[i] = (util_bar, util_text, mem_bar, mem_text, power)
        name = html.escape(device["name"] or "" if "name" in device else "")
        label = w.HTML(f"<b>GPU {i}</b>&nbsp;<small>{name}</small>", layout={"width": "220px"})
        return w.HBox([label, util_bar, util_text, w.HTML("&nbsp;mem"), mem_bar, mem_text, power])

    def _step_rate(self, now: float, steps: int | None) -> float | None:
        if steps is None:
            return None
        q = self._steps
        q.append((now, steps))
        while len(q) > 2 and now - q[0][0] > _RATE_WINDOW_S:
            q.popleft()
        (t0, s0), (t1, s1) = q[0], q[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None

    def _status_html(self, stage: str | None, steps: int | None, rate: float | None) -> str:
        elapsed = self._now() - self._start
        parts = [f"<b>{html.escape(self.title)}</b> · running {elapsed:.1f} s"]
        if steps is not None:
            stage = stage or "other"
            parts.append(
                f'stage <span class="pm-live-stage" style="background:{stage_color(stage)};color:#fff;'
                f'border-radius:3px;padding:0 5px">{html.escape(stage)}</span>'
            )
            parts.append(f'<span class="pm-live-steps">{steps}</span> steps')
            parts.append(f"{fmt_rate(rate)} steps/s" if rate else "— steps/s")
        return " · ".join(parts)


def _stages_html(totals: dict[str, float], count: int, recent: list[dict[str, float]]) -> str:
    """The share of step time per stage as one stacked bar with a legend, and a bar per recent step."""
    whole = sum(totals.values())
    if whole <= 0:
        return ""
    order = sorted((n for n in totals if totals[n] > 0), key=lambda n: -totals[n])
    shares = "".join(
        f'<div class="pm-live-share" data-stage="{html.escape(n)}" data-share="{totals[n] / whole:.4f}" '
        f'title="{html.escape(n)} {totals[n] / whole:.0%}" style="width:{100 * totals[n] / whole:.2f}%;'
        f'background:{stage_color(n)}"></div>'
        for n in order
    )
    legend = " · ".join(
        f'<span style="color:{stage_color(n)}">■</span> {html.escape(n)} {fmt_fraction(totals[n] / whole)}'
        for n in order
    )
    peak = max(sum(r.values()) for r in recent) or 1.0
    width, height = 6, 36  # px per step bar, px for the longest recent step
    rects = []
    for i, row in enumerate(recent):
        y = float(height)
        for name in order:  # stacked in the legend's order, largest share at the bottom
            h = row.get(name, 0.0) / peak * height
            if h > 0:
                y -= h
                rects.append(
                    f'<rect x="{i * width}" y="{y:.1f}" width="{width - 1}" height="{h:.1f}" '
                    f'fill="{stage_color(name)}"/>'
                )
    bars = (
        f'<svg class="pm-live-recent" width="{width * len(recent)}" height="{height}">{"".join(rects)}</svg>'
    )
    return (
        f'<div style="font-size:12px;margin:4px 0"><b>Share of step time</b> over {count} steps '
        f'<span style="opacity:.75">(last {len(recent)} steps on the right; longest {fmt_seconds(peak)})</span>'
        f'<div style="display:flex;align-items:flex-end;gap:12px">'
        f'<div style="flex:1;max-width:520px"><div style="display:flex;height:14px;border-radius:3px;'
        f'overflow:hidden">{shares}</div><div>{legend}</div></div>{bars}</div></div>'
    )


def memory_now(tl: Timeline) -> str:
    """The tree's memory now, named as the report will name it: "process memory 1.2 GiB (PSS)"."""
    kind = memory_kind(_latest(tl, MEMORY_METRICS["PSS"]))
    return f"{MEMORY_NAME} {fmt_bytes(_latest(tl, MEMORY_METRICS[kind]))} ({kind})"


def _latest(tl: Timeline, metric: str) -> float | None:
    _, v = tl.last(metric)
    if not len(v) or np.isnan(v[-1]):
        return None
    return float(v[-1])


def _rate(tl: Timeline, metric: str) -> float | None:
    t, v = tl.last(metric, 2)
    if len(t) < 2 or t[-1] <= t[-2]:
        return None
    return float((v[-1] - v[-2]) / (t[-1] - t[-2]))


def _row_html(row: Any) -> str:
    """A row of the panel as HTML: its text, without the bars (the text says their figures)."""
    return "".join(c.value for c in getattr(row, "children", (row,)) if isinstance(c.value, str))


def _replace_children(box: Any, children: list[Any]) -> None:
    """Show ``children`` in ``box`` and close the ones they replace (their views are gone first)."""
    old, box.children = box.children, children
    for child in old:
        _close(child)


def _close(widget: Any) -> None:
    """Close a widget, then what it refers to: its children, layout and style (each a comm of its own).

    A model closes before those it refers to: no open model ever refers to a closed one.
    """
    parts = [
        *getattr(widget, "children", ()),
        getattr(widget, "layout", None),
        getattr(widget, "style", None),
    ]
    widget.close()
    for part in parts:
        if part is not None:
            _close(part)
