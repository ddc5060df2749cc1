"""Host telemetry: the machine's CPU, memory, disk and network, and the profiled process tree.

:class:`HostSource` writes these samples (cumulative ones count from the window's start):

- ``host.cpu_util`` and ``host.cpu{k}_util`` (busy fraction of all cores / of core k),
  ``host.iowait`` (fraction of CPU time spent waiting for I/O);
- ``host.mem_available_bytes``, ``host.swap_used_bytes`` (the machine's swap in use);
- ``host.proc_cpu_cores``: CPU used by the profiled process and all its descendants
  (DataLoader workers), in cores; ``host.children_cpu_cores``: the descendants' part;
  ``host.children_wait_cores``: the time the descendants were runnable but waited for
  a CPU, in cores (Linux schedstat run delay; a worker starved of CPU, not waiting on I/O);
  ``host.children_disk``: descendants in uninterruptible sleep (``D``: mostly disk I/O) at the tick;
  ``host.major_faults_per_s``: the tree's major page faults (a page read back from swap or a file),
  per second (Linux);
  ``host.rss_bytes``, ``host.uss_bytes`` and ``host.pss_bytes`` summed over that tree: RSS counts
  a page shared between processes once per process (forked DataLoader workers reading the
  parent's dataset count it once each), USS not at all, PSS in equal parts among its sharers,
  so the tree's PSS is what it really holds;
- ``host.read_bytes``, ``host.write_bytes``, ``host.read_ops``, ``host.write_ops``:
  the machine's block-device I/O (requests that reached a disk);
  ``host.proc_read_bytes``, ``host.proc_write_bytes``: storage I/O of the process tree;
- ``host.net_sent_bytes``, ``host.net_recv_bytes`` (all interfaces but loopback).

``timeline.meta["host"]`` holds ``cpu_count``, ``physical_cores``, ``affinity`` (CPUs
the profiled process may run on), ``numa_nodes`` (``{node: [cpus]}``),
``mem_total_bytes`` and ``root_pid``.

Cost: only the machine's total CPU and the tree's CPU and RSS are read every tick,
on Linux by re-reading ``/proc`` files through descriptors kept open (one ``pread``
per file, no open or close; psutil elsewhere).
Per-core CPU, available memory and the cumulative counters (disk, network, process
I/O) are read every ``slow_interval`` seconds (per-core figures then average over
that interval), and USS and PSS, which cost a millisecond or so per process, every
``uss_interval`` seconds and at the last tick (so a short window has two readings). The tree is kept current each tick, and cheaply: the PID
list is diffed only when the kernel's last-allocated PID (``/proc/loadavg``) moved,
so a worker counts from its first tick. A descriptor on ``/proc/<pid>/stat`` also
never reads a later process that reuses the PID. The CPU of a process that exited is kept
because the kernel adds it to its parent's ``children_*`` times: the tree's counter
is the sum of each live member's own plus reaped-children times.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil

from perfmagic.collect.sampler import SourceUnavailable
from perfmagic.schema import CHILDREN_DISK, MAJOR_FAULTS, SWAP_USED
from perfmagic.timeline import Timeline


def numa_nodes() -> dict[int, list[int]]:
    """CPUs of each NUMA node, from sysfs; empty where the kernel does not say."""
    nodes: dict[int, list[int]] = {}
    for path in sorted(Path("/sys/devices/system/node").glob("node[0-9]*")):
        try:
            nodes[int(path.name[4:])] = _parse_cpulist((path / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    return nodes


def _parse_cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


_HZ = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _open_proc(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


def _pread(fd: int, size: int = 4096) -> bytes:
    return os.pread(fd, size, 0)


CpuTimes = tuple[float, float, float]  # (total, idle, iowait) seconds


def cpu_times_of(t: Any) -> CpuTimes:
    """One cpu_times() entry as (total, idle, iowait); idle includes iowait, as psutil counts it."""
    # guest time is already inside user/nice on Linux
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    iowait = getattr(t, "iowait", 0.0)
    return total, t.idle + iowait, iowait


def busy_fractions(cur: CpuTimes, prev: CpuTimes) -> tuple[float, float] | None:
    """(busy, iowait) fractions between two readings; None if no time passed."""
    dt = cur[0] - prev[0]
    if dt <= 0:
        return None
    busy = dt - (cur[1] - prev[1])
    return min(1.0, max(0.0, busy / dt)), min(1.0, max(0.0, (cur[2] - prev[2]) / dt))


class HostSource:
    """Samples the host and the process tree rooted at ``root_pid``."""

    name = "host"

    def __init__(
        self, root_pid: int | None = None, slow_interval: float = 1.0, uss_interval: float = 2.0
    ) -> None:
        self.warnings: list[str] = []
        self._root_pid = os.getpid() if root_pid is None else root_pid
        self._slow_interval = slow_interval
        self._uss_interval = uss_interval
        self._tree: dict[int, psutil.Process] = {}
        self._stat_fds: dict[int, int] = {}  # pid -> open /proc/<pid>/stat
        self._sched_fds: dict[int, int] = {}  # child pid -> open /proc/<pid>/schedstat
        self._waits: dict[int, float] = {}  # child pid -> run delay seconds at the last tick
        self._pids: set[int] = set()
        self._last_pid: int | None = None
        self._cpu_fd: int | None = None  # /proc/stat
        self._loadavg_fd: int | None = None
        self._cpu_prev: CpuTimes = (0.0, 0.0, 0.0)
        self._cores_prev: list[CpuTimes] = []
        self._tree_cpu: float | None = None
        self._children_cpu: float | None = None
        self._faults: float | None = None  # the tree's major faults (own and reaped) at the last tick
        self._tree_t = 0.0
        self._io_ok = True
        self._uss_ok = True
        self._base: dict[str, float] = {}
        self._next_slow = 0.0
        self._next_uss = 0.0
        self._uss_t: float | None = None  # the tick of the last USS and PSS reading
        self._last_tick: float | None = None

    def open(self, timeline: Timeline) -> None:
        try:
            root = psutil.Process(self._root_pid)
        except psutil.Error as e:
            raise SourceUnavailable(f"cannot watch process {self._root_pid} ({e})") from e
        try:
            affinity: list[int] | None = root.cpu_affinity()
        except (AttributeError, psutil.Error):  # not on macOS
            affinity = None
        timeline.meta["host"] = {
            "cpu_count": psutil.cpu_count() or 1,
            "physical_cores": psutil.cpu_count(logical=False),
            "affinity": affinity,
            "numa_nodes": numa_nodes(),
            "mem_total_bytes": psutil.virtual_memory().total,
            "root_pid": self._root_pid,
        }
        self._cpu_fd = _open_proc("/proc/stat")
        self._loadavg_fd = _open_proc("/proc/loadavg")
        self._last_pid = self._read_last_pid()
        self._pids = set(psutil.pids())
        self._adopt(root)
        try:
            for child in root.children(recursive=True):
                self._adopt(child)
        except psutil.Error:
            pass
        self._cpu_prev = self._system_cpu()
        self._cores_prev = [cpu_times_of(t) for t in psutil.cpu_times(percpu=True)]
        self._base = self._counters()

    def poll(self, now: float, timeline: Timeline) -> None:
        add = timeline.add_sample
        cpu_now = self._system_cpu()
        fractions = busy_fractions(cpu_now, self._cpu_prev)
        self._cpu_prev = cpu_now
        if fractions is not None:
            add("host.cpu_util", now, fractions[0])
            add("host.iowait", now, fractions[1])
        self._grow_tree()
        cpu, root_cpu, rss, disk, faults = self._tree_cpu_rss()
        children = cpu - root_cpu
        if self._tree_cpu is not None and self._children_cpu is not None and now > self._tree_t:
            # a reparented orphan leaves the tree with its CPU: never report a negative rate
            dt = now - self._tree_t
            add("host.proc_cpu_cores", now, max(0.0, cpu - self._tree_cpu) / dt)
            add("host.children_cpu_cores", now, max(0.0, children - self._children_cpu) / dt)
            if self._sched_fds:
                add("host.children_wait_cores", now, self._children_wait() / dt)
                add(CHILDREN_DISK, now, float(disk))
            if self._faults is not None and self._stat_fds:
                add(MAJOR_FAULTS, now, max(0.0, faults - self._faults) / dt)
        self._tree_cpu, self._children_cpu, self._tree_t, self._faults = cpu, children, now, faults
        add("host.rss_bytes", now, float(rss))
        if now >= self._next_slow:  # the tick's time: on the session's clock, fake in tests
            self._next_slow = now + self._slow_interval
            self._poll_cores(now, timeline)
            add("host.mem_available_bytes", now, float(psutil.virtual_memory().available))
            add(SWAP_USED, now, float(psutil.swap_memory().used))
            for metric, value in self._counters().items():
                add(metric, now, value - self._base.get(metric, 0.0))
        self._last_tick = now
        if now >= self._next_uss:
            self._next_uss = now + self._uss_interval
            self._add_uss_pss(now, timeline)

    def _add_uss_pss(self, now: float, timeline: Timeline) -> None:
        self._uss_t = now
        shares = self._tree_uss_pss()
        if shares is not None:
            timeline.add_sample("host.uss_bytes", now, float(shares[0]))
            if shares[1] is not None:
                timeline.add_sample("host.pss_bytes", now, float(shares[1]))

    def close(self, timeline: Timeline) -> None:
        # PSS at the last tick too: a window shorter than ``uss_interval`` had one reading, too few for
        # a chart, which then drew RSS under a report that named PSS
        if self._last_tick is not None and self._uss_t != self._last_tick:
            self._add_uss_pss(self._last_tick, timeline)
        for fd in [self._cpu_fd, self._loadavg_fd, *self._stat_fds.values(), *self._sched_fds.values()]:
            if fd is not None:
                os.close(fd)
        self._cpu_fd = self._loadavg_fd = None
        self._stat_fds.clear()
        self._sched_fds.clear()
        self._tree.clear()

    # -- pieces ------------------------------------------------------------

    def _system_cpu(self) -> CpuTimes:
        if self._cpu_fd is None:
            return cpu_times_of(psutil.cpu_times())
        # "cpu  user nice system idle iowait irq softirq steal guest guest_nice" in clock ticks
        v = [int(x) / _HZ for x in _pread(self._cpu_fd, 512).split(b"\n", 1)[0].split()[1:9]]
        return sum(v), v[3] + v[4], v[4]

    def _read_last_pid(self) -> int | None:
        """The PID the kernel allocated last; it moves whenever a process or thread starts."""
        if self._loadavg_fd is None:
            return None
        try:
            return int(_pread(self._loadavg_fd, 128).split()[-1])
        except (OSError, ValueError, IndexError):
            return None

    def _adopt(self, proc: psutil.Process) -> None:
        self._tree[proc.pid] = proc
        fd = _open_proc(f"/proc/{proc.pid}/stat")
        if fd is not None:
            self._stat_fds[proc.pid] = fd
        if proc.pid != self._root_pid:
            fd = _open_proc(f"/proc/{proc.pid}/schedstat")
            if fd is not None:
                self._sched_fds[proc.pid] = fd

    def _drop(self, pid: int) -> None:
        del self._tree[pid]
        self._waits.pop(pid, None)
        for fds in (self._stat_fds, self._sched_fds):
            fd = fds.pop(pid, None)
            if fd is not None:
                os.close(fd)

    def _children_wait(self) -> float:
        """Seconds the children waited for a CPU since the last tick (each from its first tick on)."""
        total = 0.0
        for pid, fd in list(self._sched_fds.items()):
            try:
                wait = int(_pread(fd, 128).split()[1]) / 1e9
            except (OSError, ValueError, IndexError):
                continue  # gone: _tree_cpu_rss drops it
            before = self._waits.get(pid)
            self._waits[pid] = wait
            if before is not None:
                total += max(0.0, wait - before)
        return total

    def _poll_cores(self, now: float, timeline: Timeline) -> None:
        cores = [cpu_times_of(t) for t in psutil.cpu_times(percpu=True)]
        if len(cores) == len(self._cores_prev):  # else a CPU went on- or offline: start over
            for k, (cur, prev) in enumerate(zip(cores, self._cores_prev, strict=True)):
                fractions = busy_fractions(cur, prev)
                if fractions is not None:
                    timeline.add_sample(f"host.cpu{k}_util", now, fractions[0])
        self._cores_prev = cores

    def _grow_tree(self) -> None:
        """Add processes born since the last tick whose parent is in the tree."""
        last = self._read_last_pid()
        if last is not None and last == self._last_pid:
            return  # nothing started anywhere since the last look
        self._last_pid = last
        pids = set(psutil.pids())
        new = sorted(pids - self._pids)  # parents usually have the smaller PID
        self._pids = pids
        for pid in new:
            try:
                proc = psutil.Process(pid)
                if proc.ppid() in self._tree:
                    self._adopt(proc)
            except psutil.Error:
                continue

    def _tree_cpu_rss(self) -> tuple[float, float, int, int, float]:
        """CPU seconds of the tree (own plus reaped children), the root's own part of them, RSS bytes,
        the descendants in uninterruptible sleep now, and the tree's major faults (own plus reaped)."""
        cpu = root = faults = 0.0
        rss = disk = 0
        for pid in list(self._tree):
            try:
                own, reaped, proc_rss, state, proc_faults = self._proc_cpu_rss(pid)
            except (OSError, ValueError, IndexError, psutil.Error):
                self._drop(pid)  # gone: its CPU is in its parent's children_*
                continue
            cpu += own + reaped
            rss += proc_rss
            faults += proc_faults
            if pid == self._root_pid:
                root = own
            else:
                disk += state == "D"
        return cpu, root, rss, disk, faults

    def _proc_cpu_rss(self, pid: int) -> tuple[float, float, int, str, float]:
        """(own CPU seconds, reaped children's CPU seconds, RSS bytes, state letter, major faults: own and
        reaped children's; 0 off Linux) of one process."""
        fd = self._stat_fds.get(pid)
        if fd is None:
            proc = self._tree[pid]
            with proc.oneshot():
                t = proc.cpu_times()
                state = "D" if proc.status() == psutil.STATUS_DISK_SLEEP else "?"
                return (
                    t.user + t.system,
                    t.children_user + t.children_system,
                    proc.memory_info().rss,
                    state,
                    0.0,
                )
        # fields after "(comm)": state ppid ... majflt(9) cmajflt(10) utime(11) stime cutime cstime ... rss(21)
        data = _pread(fd)
        rest = data[data.rindex(b")") + 2 :].split()
        return (
            (int(rest[11]) + int(rest[12])) / _HZ,
            (int(rest[13]) + int(rest[14])) / _HZ,
            int(rest[21]) * _PAGE,
            rest[0].decode(),
            float(int(rest[9]) + int(rest[10])),
        )

    def _tree_uss_pss(self) -> tuple[int, int | None] | None:
        """The tree's USS and PSS (None where the platform has no PSS), in bytes."""
        if not self._uss_ok:
            return None
        uss = 0
        pss: int | None = 0
        for proc in list(self._tree.values()):
            try:
                info = proc.memory_full_info()
            except psutil.AccessDenied:
                self._uss_ok = False
                self.warnings.append(
                    "host: USS and PSS not available (no permission to read /proc/<pid>/smaps)"
                )
                return None
            except psutil.Error:
                continue
            uss += info.uss
            pss = pss + info.pss if pss is not None and hasattr(info, "pss") else None
        return uss, pss

    def _counters(self) -> dict[str, float]:
        """Cumulative disk, network and process-tree I/O counters, as they are now."""
        out: dict[str, float] = {}
        disk = psutil.disk_io_counters()
        if disk is not None:
            out["host.read_bytes"] = disk.read_bytes
            out["host.write_bytes"] = disk.write_bytes
            out["host.read_ops"] = disk.read_count
            out["host.write_ops"] = disk.write_count
        elif not self._base:
            self.warnings.append("host: disk I/O counters not available on this machine")
        nics = psutil.net_io_counters(pernic=True)
        out["host.net_sent_bytes"] = sum(n.bytes_sent for name, n in nics.items() if name != "lo")
        out["host.net_recv_bytes"] = sum(n.bytes_recv for name, n in nics.items() if name != "lo")
        if self._io_ok:
            read = write = 0
            for proc in list(self._tree.values()):
                try:
                    io = proc.io_counters()
                except psutil.AccessDenied:
                    self._io_ok = False
                    self.warnings.append("host: process I/O counters not available (no permission)")
                    break
                except (psutil.Error, AttributeError):
                    continue
                read += io.read_bytes
                write += io.write_bytes
            else:
                out["host.proc_read_bytes"] = read
                out["host.proc_write_bytes"] = write
        return out
