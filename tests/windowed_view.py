"""What stages recorded in windows would have kept of a run recorded fully, and the check that its
report says what the full one says (``conftest.every_report_is_consistent``, issue 34).

The view is the same run, not a second one: two runs of one loop differ on a busy machine by more
than the point the windows are allowed. Outside its windows the view keeps what the recorder keeps
there (step ends, optimizer steps, checkpoints, logging, syncs, evaluation passes, every sample and
mark) and drops what the windowed hooks record (fetches, forward, backward, copies, optimizer steps), with the
``recording`` marks the recorder writes at each change.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np

from perfmagic.advise.about import about, stages_of
from perfmagic.advise.card import SERIOUS
from perfmagic.advise.workers import HANDOFF_SHARE
from perfmagic.analyze import analyze
from perfmagic.analyze.steps import StepBreakdown, step_breakdown
from perfmagic.contract import ReportData
from perfmagic.report import Report, build_report
from perfmagic.schema import RECORDING, STEP_BOUNDARY_PREFIX
from perfmagic.timeline import Timeline

FIRST_FULL = 20
"""Steps recorded fully from the start in the view: the recorder's 200 would leave the tests' loops whole."""

WINDOW, PERIOD = 5, 10
"""Steps recorded fully in every period after the start: half the steps are estimated."""

MIN_STEPS = FIRST_FULL + 2 * PERIOD
"""Runs shorter than this are compared with nothing: the view would be the run itself."""

WINDOWED_SPANS = frozenset({"data", "forward", "backward", "h2d", "optimizer"})
"""What the hooks installed only in the windows record (``collect.torch_hooks``, ``torch_optimizer``);
a GradScaler's ``optimizer`` spans go too, which the analysis estimates outside the windows anyway."""

BORDERS = {"input_bound": (HANDOFF_SHARE,), "dataloader_workers": (HANDOFF_SHARE,)}
"""Shares of its stages at which a card appears or goes, beside its threshold (``advise.about``):
workers that wait on storage are left alone beneath the hand-over's usual cost."""

PASSES = frozenset({"eval_start", "eval_end", "loader_end"})
"""Boundaries of a DataLoader pass: the recorder installs every hook for the step a pass is in."""

SHARE_POINTS = 0.01
"""How far a stage's share from the windows may be from the full recording's."""

NOISE_SIGMAS = 3.0
"""A stage's share may also be off by this many times the sampling error of the run's own steps (the
square root of the summed squares of the estimated steps' errors, or of the gaps' between windows: see
``_noise``): what a sound estimate of steps that vary at random may miss by, and what an estimate biased
one way on every step exceeds as steps add up."""


def windowed_view(timeline: Timeline) -> Timeline | None:
    """``timeline`` as windows would have recorded it; None where that is the timeline itself (too few
    steps, steps folded on disk, or already recorded in windows)."""
    if timeline.folded is not None or timeline.sample_count(RECORDING):
        return None
    b = step_breakdown(timeline)
    if b.count < MIN_STEPS:
        return None
    spans = timeline.spans
    full = _scheduled(b.count)
    passes = [n[len(STEP_BOUNDARY_PREFIX) :] in PASSES for n in spans.names]
    # the hooks go in as a pass begins and stay to the next step end: the step that holds or follows it
    begun = spans.start[np.array(passes, dtype=bool)[spans.name_id]] if len(spans) else np.zeros(0)
    full[np.minimum(np.searchsorted(b.end, begun, side="right"), b.count - 1)] = True
    # a loop that leaves by ``break`` outside a window loses its last step in windows (nothing after the
    # fetch marks it): one step of the 200 and more that windows need, kept here so that what is
    # compared is the estimate
    full[-1] = True
    windowed = np.array([n in WINDOWED_SPANS for n in spans.names], dtype=bool)[spans.name_id]
    # a span is in the step whose end is the first after its start (one that starts as a step ends is
    # the next step's, as device spans timed on a step's boundary are)
    step = np.minimum(np.searchsorted(b.end, spans.start, side="right"), b.count - 1)
    inside = (spans.start >= b.start[0]) & (spans.start < b.end[-1])
    keep = ~(windowed & inside & ~full[step])

    view = Timeline(timeline.meta)
    view.record = timeline.record
    idx = np.flatnonzero(keep)
    view.add_spans(
        spans.names,
        array("i", spans.name_id[idx].tolist()),
        array("d", spans.start[idx].tolist()),
        array("d", spans.end[idx].tolist()),
        array("b", spans.depth[idx].tolist()),
    )
    for metric in timeline.metrics:
        t, v = timeline.series(metric)
        view.add_samples(metric, array("d", t.tolist()), array("d", v.tolist()))
    changes = np.flatnonzero(np.diff(full.astype(np.int8))) + 1  # steps whose recording differs from the last
    view.add_samples(RECORDING, array("d", b.start[changes].tolist()), array("d", full[changes].tolist()))
    view.add_marks(timeline.marks())
    return view


def _scheduled(steps: int) -> np.ndarray:
    """Per step, whether the view's schedule records it fully: the first :data:`FIRST_FULL`, then
    :data:`WINDOW` steps at a place in every :data:`PERIOD` that moves from one to the next, so that
    a loop's own period (a collection every tenth step) neither always falls in the windows nor never."""
    full = np.zeros(steps, dtype=bool)
    full[:FIRST_FULL] = True
    places = np.random.default_rng(0).integers(0, PERIOD - WINDOW + 1, size=steps // PERIOD + 1)
    for k, start in enumerate(range(FIRST_FULL, steps, PERIOD)):
        full[start + places[k] : start + places[k] + WINDOW] = True
    return full


def assert_windows_agree(report: Report) -> None:
    """A report from timelines recorded fully says what the report of their windowed view says: stage
    shares within :data:`SHARE_POINTS` (or within the run's own noise, :data:`NOISE_SIGMAS`), and where
    they are within the point, the same bottleneck, cards and plan. Not where the report found other
    processes taking the CPU: their bursts span steps, so the steps' errors are not independent."""
    timelines = list(report.timelines)
    if report["source"] not in ("live", "run") or len(timelines) != 1 or report.analysis is None:
        return
    full_data = report.to_dict()
    if "cpu_contention" in _cards(full_data):
        return  # other processes took the CPU in bursts that span steps: no sampling error holds them
    view = windowed_view(timelines[0])
    if view is None:
        return
    full = report.analysis
    windowed = build_report(analyze([view], gpu=full.gpu), report["source"], [view])
    assert windowed.analysis is not None and windowed["recording"]["mode"] == "windowed"
    noise = _noise(full.breakdown, windowed.analysis.breakdown)
    windowed_data = windowed.to_dict()
    within_a_point = True
    for name in set(full_data["stages"]) | set(windowed_data["stages"]):
        a, b = (_share(d, name) for d in (full_data, windowed_data))
        within_a_point &= abs(a - b) <= SHARE_POINTS
        assert abs(a - b) <= max(SHARE_POINTS, NOISE_SIGMAS * noise.get(name, 0.0)), (
            f"{name}: {a:.3f} of the step recorded fully, {b:.3f} in windows (noise {noise.get(name, 0.0):.3f}); "
            f"full {_shares(full_data)}, windows {_shares(windowed_data)}"
        )
    if within_a_point:  # a report that says the same figures says the same things
        assert windowed_data["bottleneck"] == full_data["bottleneck"] or _swapped(full_data, windowed_data), (
            _shares(full_data),
            _shares(windowed_data),
        )
        settled = _settled(full_data, windowed_data)
        cards = [settled(_cards(d)) for d in (full_data, windowed_data)]
        savings = [_savings(d) for d in (full_data, windowed_data)]
        assert _in_one_order(cards[0], cards[1], savings), (
            savings,
            _cards(full_data),
            _cards(windowed_data),
            _shares(windowed_data),
        )
        plans = [settled(_plan(d)) for d in (full_data, windowed_data)]
        assert _in_one_order(plans[0], plans[1], savings), (_plan(full_data), _plan(windowed_data))


def _noise(full: StepBreakdown, windowed: StepBreakdown) -> dict[str, float]:
    """Per stage, the sampling error of its share from the windows, as a share of the steady steps' time:
    the estimated steady steps' errors against the full recording, summed in squares step by step or
    gap by gap, whichever is larger. Steps of one gap between windows share their nearest windows, and
    a loop's own short rhythm (the workers' turns, a wait every other step) runs through a gap: their
    errors add up within it, and only the gaps' are independent."""
    assert windowed.full is not None and windowed.count == full.count
    first = 1 if full.count >= 3 else 0  # the steady steps (analyze.steady)
    estimated = ~windowed.full[first:]
    gap = np.cumsum(~estimated)[estimated]  # the estimated steps' gaps, numbered by the windows before them
    total = float(full.durations[first:].sum())
    out = {}
    for name in set(full.stages) & set(windowed.stages):
        error = (full.column(name) - windowed.column(name))[first:][estimated]
        by_gap = np.bincount(gap, weights=error)
        squares = max(float((error**2).sum()), float((by_gap**2).sum()))
        out[name] = float(np.sqrt(squares)) / total if total > 0 else 0.0
    return out


def _swapped(full: ReportData, windowed: ReportData) -> bool:
    """Whether the two reports' bottlenecks are stages whose order the reports' shares swap: a tie at a
    border, as :func:`_settled` leaves out for cards; each report rightly names its own larger one."""
    a, b = full["bottleneck"], windowed["bottleneck"]
    stages = set(full["stages"]) & set(windowed["stages"])
    return (
        a in stages
        and b in stages
        and _share(full, a) >= _share(full, b)
        and _share(windowed, b) >= _share(windowed, a)
    )


def _settled(full: ReportData, windowed: ReportData) -> Callable[[list[str]], list[str]]:
    """A filter of card ids down to those not at a border: a card whose stages' share lies on one side
    of a share at which it appears (:data:`BORDERS`, its threshold) in one report and on the other side
    in the other rightly says different things, however close the two shares are. ``compute_bound``,
    which goes where a card of medium or high severity fires (``advise.catalog.advise``), is at the
    borders of such cards too."""

    def at_border(id: str) -> bool:
        a, b = (sum(_share(d, stage) for stage in stages_of(id)) for d in (full, windowed))
        borders = (about(id).threshold, *BORDERS.get(id, ()))
        return any(t is not None and min(a, b) <= t <= max(a, b) for t in borders)

    serious_at_border = any(
        c["severity"] in SERIOUS and at_border(c["id"]) for d in (full, windowed) for c in d["advice"]
    )

    def settled(id: str) -> bool:
        return not at_border(id) and not (id == "compute_bound" and serious_at_border)

    return lambda ids: [id for id in ids if settled(id)]


def _in_one_order(a: list[str], b: list[str], savings: list[dict[str, float]]) -> bool:
    """Whether two reports give the same cards (or changes) in the same order, where two whose savings
    are within :data:`SHARE_POINTS` of the step of each other in both reports may swap (a tie, which
    each report breaks by its own sub-point figures)."""
    if sorted(a) != sorted(b):
        return False
    where = {id: i for i, id in enumerate(b)}
    swapped = [(x, y) for i, x in enumerate(a) for y in a[i + 1 :] if where[x] > where[y]]
    return all(abs(s.get(x, 0.0) - s.get(y, 0.0)) <= SHARE_POINTS for x, y in swapped for s in savings)


def _savings(data: ReportData) -> dict[str, float]:
    """Each card's saving alone (what the cards and the plan are ordered by, before each saves only what
    the ones ahead of it left) as a share of the steady step."""
    per_s = data["steps"]["per_s"]
    if not per_s:
        return {}
    alone = {c["id"]: c["metrics"].get("saving_alone_s", c["saving_s"]) for c in data["advice"]}
    return {id: float(s or 0.0) * per_s for id, s in alone.items()}


def _share(data: ReportData, stage: str) -> float:
    share = data["stages"].get(stage)
    return float(share["fraction"] or 0.0) if share else 0.0  # a fraction not finite is written None


def _shares(data: ReportData) -> dict[str, float]:
    return {name: round(_share(data, name), 3) for name in data["stages"]}


def _cards(data: ReportData) -> list[str]:
    return [c["id"] for c in data["advice"]]


def _plan(data: ReportData) -> list[str]:
    return [c["id"] for c in data["plan"]["changes"]] if data["plan"] else []
