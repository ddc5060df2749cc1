"""The report's ``host`` section: the machine and the profiled process tree, from a timeline.

Pure functions over what :mod:`perfmagic.collect.host` recorded (metric names are
documented there). Units: bytes and seconds; utilizations and fractions in [0, 1];
CPU of the process tree in cores. A figure that was not measured is ``None``.
"""

from __future__ import annotations

import re

from perfmagic.analyze import samples
from perfmagic.contract import DeviceInfo, Host, HostMeta
from perfmagic.contract.machine import GpuAffinity
from perfmagic.timeline import Timeline


def host_summary(timeline: Timeline) -> Host:
    """The machine and the profiled process tree over the window."""
    meta: HostMeta = timeline.meta.get("host") or {}
    tl = timeline
    cores = sorted(
        (int(m.group(1)), name) for name in tl.metrics if (m := re.fullmatch(r"host\.cpu(\d+)_util", name))
    )
    read_bytes = samples.last(tl, "host.read_bytes")
    read_ops = samples.last(tl, "host.read_ops")
    t = tl.series("host.read_bytes")[0]
    span = float(t[-1] - t[0]) if t.size > 1 else None
    return {
        "cpu_count": meta.get("cpu_count"),
        "physical_cores": meta.get("physical_cores"),
        "cpu_util_mean": samples.mean(tl, "host.cpu_util"),
        "cpu_util_p95": samples.p95(tl, "host.cpu_util"),
        "per_core_util_mean": [samples.mean(tl, name) for _, name in cores],
        "proc_cpu_util_mean": samples.mean(tl, "host.proc_cpu_cores"),
        "proc_cpu_util_p95": samples.p95(tl, "host.proc_cpu_cores"),
        "rss_peak_bytes": samples.as_int(samples.maximum(tl, "host.rss_bytes")),
        "uss_peak_bytes": samples.as_int(samples.maximum(tl, "host.uss_bytes")),
        "pss_peak_bytes": samples.as_int(samples.maximum(tl, "host.pss_bytes")),
        "mem_available_min_bytes": samples.as_int(samples.minimum(tl, "host.mem_available_bytes")),
        "mem_total_bytes": meta.get("mem_total_bytes"),
        "read_bytes": samples.as_int(read_bytes),
        "write_bytes": samples.as_int(samples.last(tl, "host.write_bytes")),
        "read_ops": samples.as_int(read_ops),
        "write_ops": samples.as_int(samples.last(tl, "host.write_ops")),
        "avg_read_size_bytes": read_bytes / read_ops if read_bytes is not None and read_ops else None,
        "read_mean_bytes_per_s": read_bytes / span if read_bytes is not None and span else None,
        "proc_read_bytes": samples.as_int(samples.last(tl, "host.proc_read_bytes")),
        "proc_write_bytes": samples.as_int(samples.last(tl, "host.proc_write_bytes")),
        "iowait_mean": samples.mean(tl, "host.iowait"),
        "net_sent_bytes": samples.as_int(samples.last(tl, "host.net_sent_bytes")),
        "net_recv_bytes": samples.as_int(samples.last(tl, "host.net_recv_bytes")),
        "affinity": meta.get("affinity"),
        "numa_nodes": {str(k): v for k, v in nodes.items()} if (nodes := meta.get("numa_nodes")) else None,
        "gpu_affinity": _gpu_affinity(meta.get("affinity"), timeline.meta.get("devices") or []),
    }


def _gpu_affinity(affinity: list[int] | None, devices: list[DeviceInfo]) -> list[GpuAffinity]:
    """For each GPU: how many of the CPUs the process may use are NUMA-local to it."""
    out: list[GpuAffinity] = []
    for d in devices:
        local = d.get("numa_cpus")
        if affinity is None or not local:
            continue
        allowed_local = len(set(affinity) & set(local))
        out.append(
            {
                "gpu": d["index"],
                "numa_node": d.get("numa_node"),
                "local_cpus": len(local),
                "allowed_cpus": len(affinity),
                "allowed_local_cpus": allowed_local,
                "allowed_local_fraction": allowed_local / len(affinity) if affinity else None,
            }
        )
    return out
