"""The host source against the real machine: real child processes, a real file, real /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from perfmagic.analyze.host import host_summary
from perfmagic.collect.host import HostSource
from perfmagic.timeline import Timeline
from perfmagic.units import fmt_bytes

# Burns CPU for the given seconds; with "fork", first starts a grandchild that does the same.
BURN = """
import subprocess, sys, time
child = None
if sys.argv[2] == "fork":
    child = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1], "no", ""])
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
if child:
    child.wait()
"""


def cpu_s(processes: list[psutil.Process]) -> dict[int, float]:
    """CPU seconds of each of ``processes`` still running, by pid."""
    seconds = {}
    for proc in processes:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        seconds[proc.pid] = times.user + times.system
    return seconds


def poll_for(source: HostSource, timeline: Timeline, seconds: float, origin: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        source.poll(time.perf_counter() - origin, timeline)
        time.sleep(0.02)


def integral(timeline: Timeline, metric: str) -> float:
    t, v = timeline.series(metric)
    # each rate sample covers the interval since the previous tick
    return float(np.sum(v[1:] * np.diff(t)))


def test_process_tree_cpu_counts_workers_that_come_and_go() -> None:
    timeline = Timeline()
    source = HostSource(root_pid=os.getpid(), slow_interval=0.1)
    # processes earlier tests left under this one are in the tree too: their CPU is counted as well
    strays = psutil.Process().children(recursive=True)
    origin = time.perf_counter()
    source.open(timeline)
    strays_before, own_before = cpu_s(strays), time.process_time()
    poll_for(source, timeline, 0.1, origin)
    # a worker that starts mid-window, starts its own worker, and both exit before the window ends
    worker = subprocess.Popen([sys.executable, "-c", BURN, "0.4", "fork", BURN])
    poll_for(source, timeline, 0.2, origin)
    # this worker's CPU and its own worker's, reaped by it: not another child's that Popen reaps meanwhile
    _, status, usage = os.wait4(worker.pid, 0)
    worker.returncode = os.waitstatus_to_exitcode(status)
    poll_for(source, timeline, 0.2, origin)
    source.close(timeline)
    burned = usage.ru_utime + usage.ru_stime
    own = time.process_time() - own_before
    strays_after = cpu_s(strays)
    stray = sum(strays_after[pid] - s for pid, s in strays_before.items() if pid in strays_after)

    measured = integral(timeline, "host.proc_cpu_cores")
    assert burned > 0.7  # the two workers really ran
    assert measured == pytest.approx(burned + own + stray, rel=0.15)
    summary = host_summary(timeline)
    assert summary["proc_cpu_util_mean"] > 0
    assert summary["proc_cpu_util_p95"] <= (psutil.cpu_count() or 1) + 0.5


def test_machine_metrics_have_the_documented_units() -> None:
    timeline = Timeline()
    source = HostSource(slow_interval=0.05)
    source.open(timeline)
    origin = time.perf_counter()
    poll_for(source, timeline, 0.2, origin)
    for _ in range(100):  # a loaded machine may have let fewer ticks happen in 0.2 s: until the CPU is read
        if len(timeline.series("host.cpu_util")[0]) >= 2:
            break
        poll_for(source, timeline, 0.05, origin)
    source.close(timeline)

    meta = timeline.meta["host"]
    assert meta["cpu_count"] == psutil.cpu_count()
    assert meta["affinity"] == sorted(os.sched_getaffinity(0))
    assert all(isinstance(cpus, list) for cpus in meta["numa_nodes"].values())
    s = host_summary(timeline)
    assert 0.0 <= s["cpu_util_mean"] <= 1.0 and 0.0 <= s["cpu_util_p95"] <= 1.0
    assert 0.0 <= s["iowait_mean"] <= 1.0
    assert len(s["per_core_util_mean"]) == psutil.cpu_count()
    assert all(0.0 <= u <= 1.0 for u in s["per_core_util_mean"])
    rss = psutil.Process().memory_info().rss
    assert 0.5 * rss < s["rss_peak_bytes"] < 2 * rss
    assert 0 < s["uss_peak_bytes"] <= s["rss_peak_bytes"]
    assert 0 < s["mem_available_min_bytes"] <= meta["mem_total_bytes"]
    assert s["net_sent_bytes"] >= 0 and s["net_recv_bytes"] >= 0
    assert not source.warnings or all(w.startswith("host:") for w in source.warnings)


def test_a_window_shorter_than_the_pss_interval_still_has_pss_at_its_start_and_end() -> None:
    timeline = Timeline()
    source = HostSource(uss_interval=2.0)
    source.open(timeline)
    for now in (0.0, 0.5, 1.0):  # ticks at these times: only the first is due a PSS reading
        source.poll(now, timeline)
    source.close(timeline)
    if source.warnings or not len(timeline.series("host.pss_bytes")[0]):
        pytest.skip(f"no PSS here: {source.warnings}")
    # the last tick's reading too, so the memory chart can draw the PSS the report names
    assert timeline.series("host.pss_bytes")[0].tolist() == [0.0, 1.0]


def test_reading_a_file_shows_up_as_disk_reads(tmp_path: Path) -> None:
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("cannot evict a file from the page cache here")
    try:
        if psutil.Process().io_counters().read_bytes is None:
            pytest.skip("no per-process I/O counters")
    except (psutil.AccessDenied, AttributeError):
        pytest.skip("/proc/<pid>/io is not readable here")
    data = tmp_path / "shard.bin"
    size = 8 * 1024 * 1024
    data.write_bytes(os.urandom(size))
    fd = os.open(data, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # so the read must reach the disk
    finally:
        os.close(fd)

    timeline = Timeline()
    source = HostSource(slow_interval=0.0)
    source.open(timeline)
    origin = time.perf_counter()
    source.poll(time.perf_counter() - origin, timeline)
    with open(data, "rb", buffering=0) as f:
        while f.read(64 * 1024):
            pass
    source.poll(time.perf_counter() - origin, timeline)
    source.close(timeline)

    s = host_summary(timeline)
    if not s["proc_read_bytes"]:
        pytest.skip("the kernel does not account storage reads to processes here (e.g. tmpfs or overlay)")
    assert s["proc_read_bytes"] >= 0.9 * size
    if s["read_bytes"] is not None:  # the machine's disks saw at least our reads
        assert s["read_bytes"] >= 0.9 * size
        assert s["read_ops"] > 0 and s["avg_read_size_bytes"] > 0


def test_a_process_that_is_gone_is_unavailable_not_a_crash() -> None:
    from perfmagic.collect.sampler import SourceUnavailable

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(SourceUnavailable, match=str(proc.pid)):
        HostSource(root_pid=proc.pid).open(Timeline())


SHARED_TENSOR = """
import sys, time, torch
import perfmagic
from perfmagic.collect.host import HostSource
from perfmagic.session import Session

class Shared(torch.utils.data.Dataset):
    def __init__(self):
        self.table = torch.ones(64 * 2**20 // 4)  # 64 MiB, read by every worker, written by none
    def __len__(self):
        return 24
    def __getitem__(self, i):
        time.sleep(0.1)
        return self.table.sum()

loader = torch.utils.data.DataLoader(Shared(), batch_size=1, num_workers=3, multiprocessing_context="fork")
session = Session(interval=0.05, sources=[HostSource(uss_interval=0.2)])
with session:
    for x in loader:
        perfmagic.step()
host = session.report.to_dict()["host"]
print(host["rss_peak_bytes"], host["pss_peak_bytes"], host["uss_peak_bytes"])
print(session.report)
"""


def test_host_memory_counts_a_tensor_workers_share_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SHARED_TENSOR], capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rss, pss, uss = map(int, done.stdout.splitlines()[0].split())
    tensor = 64 * 2**20
    # RSS summed over the parent and 3 workers counts the 64 MiB once per process that read it
    assert rss > 3 * tensor
    # PSS splits each shared page among its sharers: the tensor once, plus each process's own
    assert tensor < pss < rss - 2 * tensor
    assert uss < pss
    assert f"process memory peak {fmt_bytes(pss)} (PSS)" in done.stdout  # the one measure the report names
