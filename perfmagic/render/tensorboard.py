"""TensorBoard export: step and stage times and utilization as scalars (tensorboardX event files).

Tags: ``perfmagic/step_time_s`` and ``perfmagic/stage/<name>_s`` per step (x axis:
step number); ``perfmagic/<metric>`` for the sampled metrics (x axis: milliseconds
since the window started); the text report under ``perfmagic/report``. Wall
times are real when the report knows when the window started.
"""

from __future__ import annotations

import os
from pathlib import Path

from perfmagic.contract import ReportData
from perfmagic.render.text import render_text


def write_tensorboard(report: ReportData, logdir: str | os.PathLike[str]) -> Path:
    """Write the report's scalars as a new event file in ``logdir`` (created if needed); returns ``logdir``."""
    from tensorboardX import SummaryWriter

    table, ts = report["step_table"], report["timeseries"]
    epoch = float(ts["epoch"] or 0.0)
    writer = SummaryWriter(logdir=str(logdir))
    try:
        stages = table["stages"]
        k = int(table["steps_per_row"] or 1)  # a long run's rows are blocks of k steps
        for i, (start, end) in enumerate(zip(table["start"], table["end"], strict=True)):
            wall, step = epoch + end, i * k + 1
            writer.add_scalar("perfmagic/step_time_s", (end - start) / k, global_step=step, walltime=wall)
            for name, column in stages.items():
                if column[i] is not None:
                    writer.add_scalar(f"perfmagic/stage/{name}_s", column[i], global_step=step, walltime=wall)
        for metric, series in sorted(ts["metrics"].items()):
            for t, v in zip(series["t"], series["v"], strict=True):
                if v is not None:
                    writer.add_scalar(
                        f"perfmagic/{metric}", v, global_step=round(t * 1000), walltime=epoch + t
                    )
        writer.add_text(
            "perfmagic/report", "```\n" + render_text(report) + "\n```", walltime=epoch + report["wall_s"]
        )
    finally:
        writer.close()
    return Path(logdir)
