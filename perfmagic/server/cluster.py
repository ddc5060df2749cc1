"""The cluster view: every node's GPUs, from the Prometheus the cluster already runs.

The server queries Prometheus' HTTP API itself (the browser never talks to it, and its URL
never leaves the server) for the GPU series that dcgm-exporter and ``perfmagic exporter`` both
write, and groups them by node. Busiest GPUs first, idle ones last; each with a short
utilization history for a sparkline. Processes profiled by perfmagic (``perfmagic exporter``'s
training series) are listed under their node, by rank.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict

Json = dict[str, Any]


class PrometheusState(TypedDict):
    configured: bool  # c.PerfmagicExtension.prometheus_url is set
    reachable: bool
    error: str | None


class ClusterGpu(TypedDict):
    """One GPU of a node, as its exporter's series say (``nodes[i].gpus[j]``)."""

    gpu: str | None  # its index label
    uuid: str | None
    model: str | None
    util_pct: float | None
    fb_used_mib: float | None
    fb_free_mib: float | None
    power_w: float | None
    util_history: list[tuple[float, float]]  # (Unix time, percent) over the last HISTORY_S


class ClusterRank(TypedDict):
    """A process ``perfmagic exporter`` reports training on a node (``nodes[i].ranks[j]``)."""

    rank: int | None
    local_rank: int | None
    pid: int | None
    program: str | None
    steps: float | None
    steps_per_s: float | None
    joules_per_sample: float | None


class ClusterNode(TypedDict):
    hostname: str
    gpus: list[ClusterGpu]
    ranks: list[ClusterRank]


class ClusterView(TypedDict):
    """``GET perfmagic/api/cluster``: every node's GPUs and profiled processes, busiest first."""

    prometheus: PrometheusState
    nodes: list[ClusterNode]


# what each GPU shows, by the dcgm-exporter series it comes from
CURRENT = {
    "util_pct": "DCGM_FI_DEV_GPU_UTIL",
    "fb_used_mib": "DCGM_FI_DEV_FB_USED",
    "fb_free_mib": "DCGM_FI_DEV_FB_FREE",
    "power_w": "DCGM_FI_DEV_POWER_USAGE",
}
HISTORY_S = 300
HISTORY_STEP_S = 10

Fetch = Callable[[str], Awaitable[bytes]]
"""GET a URL, returning its body (raising on a connection error or a non-2xx answer)."""


class PrometheusError(Exception):
    """Prometheus could not be reached, or answered with an error."""


async def cluster_view(base_url: str, fetch: Fetch, now: float | None = None) -> ClusterView:
    """The nodes' GPUs and profiled processes from Prometheus at ``base_url``: the current value of
    each :data:`CURRENT` series per GPU, and its utilization over the last :data:`HISTORY_S` seconds.
    An unreachable Prometheus gives no nodes and says why."""
    now = time.time() if now is None else now
    try:
        current = {key: await _instant(base_url, fetch, metric) for key, metric in CURRENT.items()}
        history = await _range(base_url, fetch, CURRENT["util_pct"], now - HISTORY_S, now)
        training = {name: await _instant(base_url, fetch, name) for name in TRAINING}
    except PrometheusError as e:
        return {"prometheus": {"configured": True, "reachable": False, "error": str(e)}, "nodes": []}
    nodes = nodes_of(current, history)
    ranks = ranks_of(training)
    for node in nodes:
        node["ranks"] = ranks.pop(node["hostname"], [])
    nodes += [
        {"hostname": host, "gpus": [], "ranks": found} for host, found in ranks.items()
    ]  # GPU-less nodes
    return {"prometheus": {"configured": True, "reachable": True, "error": None}, "nodes": nodes}


TRAINING = (
    "perfmagic_training_steps_total",
    "perfmagic_training_steps_per_second",
    "perfmagic_training_joules_per_sample",
)
"""``perfmagic exporter``'s training series a node's processes are read from."""


def ranks_of(training: dict[str, list[Json]]) -> dict[str, list[ClusterRank]]:
    """The profiled processes of each node (``perfmagic exporter``'s :data:`TRAINING` series), by rank."""
    steps, pace, energy = (training.get(name) or [] for name in TRAINING)
    paces = {_process(r["metric"]): _value(r["value"][1]) for r in pace}
    joules = {_process(r["metric"]): _value(r["value"][1]) for r in energy}
    found: dict[str, list[ClusterRank]] = {}
    for r in steps:
        labels = r["metric"]
        found.setdefault(labels.get("Hostname") or "?", []).append(
            {
                "rank": _int(labels.get("rank")),
                "local_rank": _int(labels.get("local_rank")),
                "pid": _int(labels.get("pid")),
                "program": labels.get("program"),
                "steps": _value(r["value"][1]),
                "steps_per_s": paces.get(_process(labels)),
                "joules_per_sample": joules.get(_process(labels)),
            }
        )
    for processes in found.values():
        processes.sort(key=lambda p: (p["rank"] is None, p["rank"] or 0, p["pid"] or 0))
    return found


def _process(labels: dict[str, str]) -> tuple[str | None, str | None]:
    return labels.get("Hostname"), labels.get("pid")


def _int(label: str | None) -> int | None:
    return int(label) if label is not None and label.lstrip("-").isdigit() else None


def nodes_of(current: dict[str, list[Json]], history: list[Json]) -> list[ClusterNode]:
    """Prometheus results grouped into nodes and GPUs (a GPU is its ``Hostname`` and ``UUID``, or
    its ``gpu`` index where no UUID is labelled); nodes busiest first, their GPUs likewise."""
    gpus: dict[tuple[str, str], ClusterGpu] = {}
    for key, results in current.items():
        for r in results:
            gpu = _gpu_of(gpus, r["metric"])
            gpu[key] = _value(r["value"][1])  # type: ignore[literal-required]  # CURRENT's keys
    for r in history:
        _gpu_of(gpus, r["metric"])["util_history"] = [
            (float(t), v) for t, raw in r["values"] if (v := _value(raw)) is not None
        ]
    nodes: dict[str, list[ClusterGpu]] = {}
    for (host, _), gpu in gpus.items():
        nodes.setdefault(host, []).append(gpu)
    ranked = sorted(
        ((host, sorted(found, key=_busy, reverse=True)) for host, found in nodes.items()),
        key=lambda node: _busy(node[1][0]),
        reverse=True,
    )
    return [{"hostname": host, "gpus": found, "ranks": []} for host, found in ranked]


def _gpu_of(gpus: dict[tuple[str, str], ClusterGpu], labels: dict[str, str]) -> ClusterGpu:
    host = labels.get("Hostname") or labels.get("instance") or "?"
    key = (host, labels.get("UUID") or labels.get("gpu") or "?")
    if key not in gpus:
        gpus[key] = {
            "gpu": labels.get("gpu"),
            "uuid": labels.get("UUID"),
            "model": labels.get("modelName"),
            "util_pct": None,
            "fb_used_mib": None,
            "fb_free_mib": None,
            "power_w": None,
            "util_history": [],
        }
    return gpus[key]


def _busy(gpu: ClusterGpu) -> float:
    return float(gpu["util_pct"] or 0.0)


def _value(raw: str) -> float | None:
    v = float(raw)
    return v if math.isfinite(v) else None


async def _instant(base_url: str, fetch: Fetch, query: str) -> list[Json]:
    return await _api(base_url, fetch, "query", {"query": query})


async def _range(base_url: str, fetch: Fetch, query: str, start: float, end: float) -> list[Json]:
    params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(HISTORY_STEP_S)}
    return await _api(base_url, fetch, "query_range", params)


async def _api(base_url: str, fetch: Fetch, endpoint: str, params: dict[str, str]) -> list[Json]:
    url = f"{base_url.rstrip('/')}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
    try:
        body = await fetch(url)
    except Exception as e:  # refused, timed out, a 4xx/5xx: the view says so and shows no nodes
        raise PrometheusError(f"{type(e).__name__}: {e}") from e
    try:
        answer = json.loads(body)
    except ValueError as e:
        raise PrometheusError(f"not a Prometheus API answer ({e})") from e
    if answer.get("status") != "success":
        raise PrometheusError(f"Prometheus: {answer.get('errorType')}: {answer.get('error')}")
    result: list[Json] = answer["data"]["result"]
    return result
