"""Telemetry samples as a pandas DataFrame and as an nvidia-smi CSV.

:func:`write_nvidia_smi_csv` writes what ``nvidia-smi --query-gpu=timestamp,name,
pstate,temperature.gpu,utilization.gpu,utilization.memory,memory.total,memory.used,
power.draw --format=csv`` prints, header, units and ``[N/A]`` included, so scripts
that parse nvidia-smi logs read perfmagic's samples unchanged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmagic.analyze.devices import gpu_indices
from perfmagic.contract import DeviceInfo
from perfmagic.timeline import Timeline

if TYPE_CHECKING:
    import pandas as pd

NVIDIA_SMI_HEADER = (
    "timestamp, name, pstate, temperature.gpu, utilization.gpu [%], utilization.memory [%], "
    "memory.total [MiB], memory.used [MiB], power.draw [W]"
)
_NA = "[N/A]"
_MIB = 1024 * 1024


def samples_dataframe(timeline: Timeline, metrics: Iterable[str] | None = None) -> pd.DataFrame:
    """One column per metric, indexed by ``t`` (seconds since the window's start).

    Metrics sampled on the same tick share a row; others leave NaN where they
    have no sample at that time.
    """
    import pandas as pd

    columns: dict[str, Any] = {}
    for metric in sorted(timeline.metrics if metrics is None else metrics):
        t, v = timeline.series(metric)
        series = pd.Series(v, index=pd.Index(t, name="t"), name=metric)
        columns[metric] = series[~series.index.duplicated(keep="last")]
    if not columns:
        return pd.DataFrame(index=pd.Index([], dtype=float, name="t"))
    frame = pd.concat(columns, axis=1).sort_index()
    frame.index.name = "t"
    return frame


def write_nvidia_smi_csv(timeline: Timeline, path: str | os.PathLike[str]) -> int:
    """Write the GPU samples as nvidia-smi's CSV; returns the number of data rows.

    One row per GPU per tick, in tick order, as ``nvidia-smi -l`` logs them.
    Wall-clock times come from ``meta["epoch"]``; without it the window is taken
    to have ended now.
    """
    meta = timeline.meta
    devices = {int(d["index"]): d for d in (meta["devices"] if "devices" in meta else [])}
    rows: list[tuple[float, int, list[str]]] = []
    for i in gpu_indices(timeline):
        columns = {key: _by_time(timeline, f"gpu{i}.{key}") for key in _SMI_KEYS}
        static = devices.get(i, DeviceInfo())
        total = static["mem_total_bytes"] if "mem_total_bytes" in static else None
        for tick in sorted(set().union(*columns.values())):
            util, mem_util, used, power, temp, pstate = (columns[key].get(tick) for key in _SMI_KEYS)
            fields = [
                (static["name"] if "name" in static else None) or _NA,
                _NA if pstate is None else f"P{int(pstate)}",
                _NA if temp is None else f"{round(temp)}",
                _NA if util is None else f"{round(util * 100)} %",
                _NA if mem_util is None else f"{round(mem_util * 100)} %",
                _NA if total is None else f"{int(total) // _MIB} MiB",
                _NA if used is None else f"{int(used) // _MIB} MiB",
                _NA if power is None else f"{power:.2f} W",
            ]
            rows.append((tick, i, fields))
    rows.sort(key=lambda row: row[:2])
    epoch = meta["epoch"] if "epoch" in meta else time.time() - max((row[0] for row in rows), default=0.0)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(NVIDIA_SMI_HEADER + "\n")
        for tick, _, fields in rows:
            stamp = datetime.fromtimestamp(epoch + tick).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
            f.write(", ".join([stamp, *fields]) + "\n")
    return len(rows)


_SMI_KEYS = ("util", "mem_util", "mem_used_bytes", "power_w", "temperature_c", "pstate")


def _by_time(timeline: Timeline, metric: str) -> dict[float, float]:
    t, v = timeline.series(metric)
    ok = np.isfinite(v)
    return dict(zip(t[ok].tolist(), v[ok].tolist(), strict=True))
