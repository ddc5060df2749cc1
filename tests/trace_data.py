"""The real GPU traces in ``tests/data`` (HolisticTraceAnalysis's test data, MIT; see its README)."""

from __future__ import annotations

import gzip
import html
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from perfmagic.analyze.gpu import tensor_cores

DATA = Path(__file__).resolve().parent / "data"


def real(name: str) -> Path:
    """The path of one of the real traces; a missing one is an error, not a skip."""
    path = DATA / name
    if not path.exists():
        raise FileNotFoundError(f"real trace {name} not found in {DATA}: it is part of the repository")
    return path


def raw(path: Path) -> dict[str, Any]:
    """A gzipped trace's JSON document, as the standard library reads it."""
    with gzip.open(path) as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def gpu_window(path: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(GPU events in HolisticTraceAnalysis's window, every complete event, the ``ProfilerStep#`` ones),
    from the raw JSON with pandas: each GPU event joined to the CPU call with its correlation id
    (``launch``, ``launch_dur``, ``launch_name``) and kept when that call started before the last step."""
    ev = pd.DataFrame([e for e in raw(path)["traceEvents"] if e.get("ph") == "X"])
    ev["corr"] = ev["args"].map(lambda a: a.get("correlation", -1) if isinstance(a, dict) else -1)
    gpu = ev[ev["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"])]
    calls = ev[~ev["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"]) & (ev["corr"] >= 0)]
    calls = calls[["corr", "ts", "dur", "name"]].rename(
        columns={"ts": "launch", "dur": "launch_dur", "name": "launch_name"}
    )
    gpu = gpu.merge(calls.drop_duplicates("corr"), on="corr", how="left")
    # the CPU's step ranges (newer traces copy them onto the GPU's timeline as gpu_user_annotation)
    steps = ev[ev["name"].str.startswith("ProfilerStep#") & (ev["cat"] != "gpu_user_annotation")]
    steps = steps.sort_values("ts")
    return gpu[gpu["launch"] < steps["ts"].max()], ev, steps


def union(intervals: pd.DataFrame) -> list[tuple[float, float]]:
    """The union of the events' ``[ts, ts + dur]`` intervals, as disjoint sorted intervals."""
    out: list[list[float]] = []
    for s, e in sorted(zip(intervals["ts"], intervals["ts"] + intervals["dur"], strict=True)):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def top_kernels(path: Path, n: int = 10) -> pd.DataFrame:
    """The ``n`` kernel names with most GPU time in HTA's window, from the raw JSON: ``share`` of the
    window's span, ``count`` and ``mean`` (µs), longest first."""
    window = gpu_window(path)[0]
    span = (window["ts"] + window["dur"]).max() - window["ts"].min()
    kernels = window[window["cat"] == "kernel"].groupby("name")["dur"].agg(["sum", "size", "mean"])
    kernels = kernels.sort_values("sum", ascending=False).head(n)
    return pd.DataFrame({"share": kernels["sum"] / span, "count": kernels["size"], "mean": kernels["mean"]})


_KERNEL_ROW = re.compile(
    r'<tr><td title="([^"]*)">[^<]*</td><td>([\d.]+)%</td><td>(\d+)</td><td>([\d.]+) (µs|ms|s)</td>'
    r"<td>(yes|no|–)</td></tr>"
)
_MICROSECONDS = {"µs": 1.0, "ms": 1e3, "s": 1e6}
# how far rounding to the last digit shown may move a time (µs), as perfmagic writes them
_ROUNDING = {"µs": 0.5, "ms": 0.05e3, "s": 0.005e6}


def kernel_rows(page: str) -> list[dict[str, Any]]:
    """The top-kernels table's rows as a report's HTML shows them: full ``name``, ``share`` (a fraction),
    ``count``, ``mean`` (µs) and how far rounding may have moved it (``mean_rounding``), ``tensor_cores``
    (``yes``, ``no``, ``–``)."""
    return [
        {
            "name": html.unescape(name),
            "share": float(share) / 100,
            "count": int(count),
            "mean": float(mean) * _MICROSECONDS[unit],
            "mean_rounding": _ROUNDING[unit],
            "tensor_cores": tc,
        }
        for name, share, count, mean, unit, tc in _KERNEL_ROW.findall(page)
    ]


def assert_top_kernels(page: str, path: Path) -> None:
    """The top-kernels table in ``page`` (HTML) holds the trace's ten longest kernels with their share,
    count and mean time as the raw events give them, and whether the name says tensor cores."""
    rows = kernel_rows(page)
    expected = top_kernels(path)
    assert [r["name"] for r in rows] == expected.index.tolist()
    for row in rows:
        want = expected.loc[row["name"]]
        assert row["count"] == want["count"]
        assert row["share"] == pytest.approx(want["share"], abs=0.0005 + 1e-9)
        assert row["mean"] == pytest.approx(want["mean"], abs=row["mean_rounding"] + 1e-9)
        assert row["tensor_cores"] == {True: "yes", False: "no", None: "–"}[tensor_cores(row["name"])]
