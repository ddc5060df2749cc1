"""What the recording windows cost a long run, step by step, against what the report says they cost.

``overhead.py`` times short profiles against unprofiled chunks; a long run is another thing: its
windows come every period, and taking the hooks out slows the steps after each window too. This
runs ``overhead.py``'s loop under one windowed profile (windows from the first step, 5 in every period,
the period a long run of this loop gets: ``collect.schedule.period_after_start``) for about ``--seconds``, times every step (its probe of the CPU's speed before it, untimed, as in
``overhead.py``), and takes the median step at each position of the period over all periods: the positions in and just after a
window, against the median step of the quiet middle of the period. Medians, so that the machine's
own stalls, which fall on any step, drop out. Beside it, the report's own measurement
(``recording.window_cost_s``, ``overhead_fraction``), which should say the same.

    python benchmarks/window_positions.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

import perfmagic
from perfmagic.collect import schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import Loop, period_pinned, steady_step_s, windows_after


def quiet(period: int) -> slice:
    """Positions of a period far from its window: the steps the others are measured against."""
    return slice(schedule.SETTLING_STEPS + 3, period - 2 * schedule.WINDOW - schedule.SETTLING_STEPS)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the profiled run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loop = Loop()
    step_s = steady_step_s(loop)
    period = schedule.period_after_start(step_s)
    with period_pinned(period), windows_after(), perfmagic.profile() as session:
        times = loop.steps(int(args.seconds / step_s)).wall
    periods = len(times) // period
    by_position = [statistics.median(times[i : periods * period : period]) for i in range(period)]
    quiet_s = statistics.median(by_position[quiet(period)])
    added = [s - quiet_s for s in by_position]
    print(
        f"{len(times)} steps, {periods} periods of {period}; the median quiet step {quiet_s * 1e3:.3f} ms "
        f"(unprofiled before the profile: {step_s * 1e3:.3f} ms)"
    )
    window_from = period - schedule.WINDOW
    paid = list(range(window_from, period)) + list(range(schedule.SETTLING_STEPS))
    shown = ", ".join(f"{i}: {added[i] * 1e6:+.0f}" for i in paid)
    print(f"µs over it by position (the window from {window_from}, its settling steps from 0): {shown}")
    per_window_step = sum(added[i] for i in paid) / schedule.WINDOW
    print(
        f"by position: {per_window_step * 1e6:+.0f} µs per window step, "
        f"{per_window_step * schedule.WINDOW / period * 1e6:+.1f} µs a step "
        f"({100 * per_window_step * schedule.WINDOW / period / quiet_s:+.2f}% of it)"
    )
    report = session.report.analysis
    recording = report.recording if report is not None else None
    if recording is None or recording["window_cost_s"] is None:
        print("the report measured no window cost")
        return
    cost, error = recording["window_cost_s"], recording["window_cost_error_s"] or 0.0
    share = recording["overhead_fraction"]
    print(
        f"the report: {cost * 1e6:+.0f} ± {error * 1e6:.0f} µs per window step; overhead_fraction "
        + (f"{100 * share:.2f}% (of its median step, the probe in it)" if share is not None else "none")
    )


if __name__ == "__main__":
    main()
