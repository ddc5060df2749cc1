"""Synthetic Nsight Systems captures of a training loop, written with a real export's schema.

The tables are created by the very ``CREATE TABLE`` statements of the real exports in
``tests/data`` (the CloverLeaf capture's, nsys 2024.5, schema 3.13.2; ``NVTX_EVENTS`` and
``CUPTI_ACTIVITY_KIND_MEMSET``, which that export leaves out, from the saxpy capture's, schema
2.9.1), with its ``META_DATA_EXPORT`` and ``ENUM_*`` rows. The events are made up: a loop of
steps, each ``data``, ``h2d``, ``forward``, ``backward``, ``optimizer`` (and ``logging``) as
perfmagic's NVTX ranges and a user's own ``train_iter`` range, kernels launched by runtime calls
and run on one stream as soon as the GPU is free. :class:`Loop` says which of Nsight's expert
checks the capture shows.
"""

from __future__ import annotations

import gzip
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from paths import DATA

CLOVERLEAF = DATA / "perlmutter-cloverleaf-cuda.sqlite.gz"
SAXPY = DATA / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite.gz"
_FROM_CLOVERLEAF = (
    "StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_RUNTIME",
    "TARGET_INFO_GPU", "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT", "ENUM_CUDA_MEMCPY_OPER",
    "ENUM_CUDA_MEM_KIND",
)  # fmt: skip
_WITH_ROWS = ("META_DATA_EXPORT", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND")
_FROM_SAXPY = ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_MEMSET")
PID, TID = 4242, 4242
GLOBAL_TID = (PID << 24) | TID  # the first process's main thread
US = 1000  # ns
PAGEABLE, PINNED, DEVICE = 0, 1, 2  # ENUM_CUDA_MEM_KIND
HTOD, DTOH = 1, 2  # ENUM_CUDA_MEMCPY_OPER


@dataclass
class Loop:
    """What the synthetic loop does each step (times in µs)."""

    steps: int = 12
    data_us: float = 30.0
    kernels: tuple[int, int, int] = (40, 80, 20)  # forward, backward, optimizer
    kernel_us: float = 30.0
    launch_us: float = 10.0
    copy_bytes: int = 8 << 20
    copy_us: float = 700.0
    pageable: bool = False  # the batch copied asynchronously from pageable memory (the call waits for it)
    sync_copies: bool = False  # a blocking cudaMemcpy (loss to host) and cudaMemset each step
    blocking_sync: bool = False  # cudaDeviceSynchronize each step
    stall_every: int = 0  # every this many steps, the host stalls in data for stall_us (GPU starvation gaps)
    stall_us: float = 3000.0
    allreduce_us: float = 0.0  # an NCCL all-reduce kernel after the backward pass, this long
    late_us: float = 0.0  # this rank reaches each all-reduce this much later (collective skew)
    profiler_steps: bool = False  # ProfilerStep#N ranges (torch.autograd.profiler.emit_nvtx)
    perfmagic_ranges: bool = True
    names: dict[str, int] = field(default_factory=dict)


class _Writer:
    def __init__(self, db: sqlite3.Connection, loop: Loop, process: int = 0) -> None:
        """The writer of process number ``process`` (its own pid, thread and GPU)."""
        self.db, self.loop = db, loop
        self.pid, self.device = PID + process, process
        self.global_tid = (self.pid << 24) | (TID + process)
        self.t = 1_000_000 + process * 300 * US  # host clock (ns); each process starts a little later
        self.gpu_free = 0
        self.corr = 0
        self.rows: dict[str, list[tuple[object, ...]]] = {}
        self.perfmagic_domain = 7

    def string(self, value: str) -> int:
        names = self.loop.names
        if value not in names:
            names[value] = len(names) + 1
            self.db.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (names[value], value))
        return names[value]

    def insert(self, table: str, **values: object) -> None:
        self.rows.setdefault(table, []).append(tuple(values.items()))

    def nvtx(self, text: str, start: int, end: int, perfmagic: bool = False) -> None:
        self.insert("NVTX_EVENTS", start=start, end=end, eventType=59, text=text, globalTid=self.global_tid,
                    domainId=self.perfmagic_domain if perfmagic else 0)  # fmt: skip

    def call(self, name: str, dur_ns: int) -> tuple[int, int, int]:
        """A runtime call on the main thread now: (start, end, correlation)."""
        self.corr += 1
        start, end = self.t, self.t + dur_ns
        self.insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=start, end=end, eventClass=1, globalTid=self.global_tid,
                    correlationId=self.corr, nameId=self.string(name), returnValue=0)  # fmt: skip
        self.t = end
        return start, end, self.corr

    def gpu(self, table: str, launched_end: int, dur_ns: int, corr: int, **values: object) -> tuple[int, int]:
        start = max(launched_end + 2 * US, self.gpu_free)
        self.gpu_free = start + dur_ns
        self.insert(table, start=start, end=start + dur_ns, deviceId=self.device, contextId=1,
                    streamId=7, correlationId=corr, globalPid=self.pid << 24, **values)  # fmt: skip
        return start, start + dur_ns

    def launch(self, name: str, dur_us: float) -> None:
        """A kernel launched now, run as soon as the GPU is free."""
        _, end, corr = self.call("cudaLaunchKernel_v7000", int(self.loop.launch_us * US))
        kid = self.string(name)
        self.gpu("CUPTI_ACTIVITY_KIND_KERNEL", end, int(dur_us * US), corr, demangledName=kid, shortName=kid,
                 gridX=1, gridY=1, gridZ=1, blockX=128, blockY=1, blockZ=1)  # fmt: skip

    def kernels(self, n: int, name: str) -> None:
        for _ in range(n):
            self.launch(name, self.loop.kernel_us)

    def wait_for_gpu(self, name: str) -> None:
        """A call that blocks until the GPU has done its queued work."""
        self.call(name, max(self.gpu_free - self.t, 0) + 5 * US)

    def blocking(self, name: str, table: str, dur_us: float, **values: object) -> None:
        """A blocking copy or memset: queued behind the GPU's work, the call returns when it is done."""
        s = self.t
        self.gpu(table, s, int(dur_us * US), self.corr + 1, **values)
        self.call(name, self.gpu_free - s + 5 * US)

    def stage(self, name: str, body: object) -> None:
        start = self.t
        body()  # type: ignore[operator]
        if self.loop.perfmagic_ranges:
            self.nvtx(name, start, self.t, perfmagic=True)

    def step(self, k: int) -> None:
        loop, start = self.loop, self.t

        def data() -> None:
            stall = loop.stall_every and k % loop.stall_every == loop.stall_every - 1
            self.t += int((loop.data_us + (loop.stall_us if stall else 0.0)) * US)

        def h2d() -> None:
            call_us = loop.copy_us + 20 if loop.pageable else 15.0
            s, _, corr = self.call("cudaMemcpyAsync_v3020", int(call_us * US))
            self.gpu("CUPTI_ACTIVITY_KIND_MEMCPY", s, int(loop.copy_us * US), corr, bytes=loop.copy_bytes,
                     copyKind=HTOD, srcKind=PAGEABLE if loop.pageable else PINNED, dstKind=DEVICE)  # fmt: skip

        def logging() -> None:
            if loop.sync_copies:
                self.blocking("cudaMemset_v3020", "CUPTI_ACTIVITY_KIND_MEMSET", 50, value=0, bytes=1 << 20,
                              memKind=DEVICE)  # fmt: skip
                self.blocking("cudaMemcpy_v3020", "CUPTI_ACTIVITY_KIND_MEMCPY", 4, bytes=4, copyKind=DTOH,
                              srcKind=DEVICE, dstKind=PAGEABLE)  # fmt: skip
            if loop.blocking_sync:
                self.wait_for_gpu("cudaDeviceSynchronize_v3020")

        self.stage("data", data)
        self.stage("h2d", h2d)
        for stage, n in zip(("forward", "backward", "optimizer"), loop.kernels, strict=True):
            self.stage(
                stage, lambda n=n, stage=stage: self.kernels(n, f"void {stage}_kernel<float>(float*, int)")
            )
        if loop.allreduce_us:
            self.t += int(loop.late_us * US)
            self.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                        loop.allreduce_us)  # fmt: skip
        if loop.sync_copies or loop.blocking_sync:
            self.stage("logging", logging)
        self.nvtx("train_iter", start, self.t)
        if loop.profiler_steps:
            self.nvtx(f"ProfilerStep#{k}", start, self.t)

    def flush(self) -> None:
        for table, rows in self.rows.items():
            shapes: dict[tuple[str, ...], list[tuple[tuple[str, object], ...]]] = {}
            for row in rows:
                shapes.setdefault(tuple(c for c, _ in row), []).append(row)
            for same in shapes.values():
                _insert(self.db, table, same)
        self.rows.clear()


def _insert(db: sqlite3.Connection, table: str, rows: list[tuple[tuple[str, object], ...]]) -> None:
    """Rows of (column, value) pairs; the table's other NOT NULL columns 0."""
    info = list(db.execute(f"PRAGMA table_info({table})"))
    given = [c for c, _ in rows[0]]
    zeros = [r[1] for r in info if r[3] and r[1] not in given]
    columns = given + zeros
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    db.executemany(sql, [tuple(v for _, v in row) + (0,) * len(zeros) for row in rows])


def _schema_from(
    db: sqlite3.Connection, capture: Path, tables: tuple[str, ...], rows: tuple[str, ...]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        real = Path(tmp) / "real.sqlite"
        real.write_bytes(gzip.decompress(capture.read_bytes()))
        src = sqlite3.connect(real)
        for name in tables:
            (ddl,) = src.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
            db.execute(ddl)
            if name in rows:
                data = src.execute(f"SELECT * FROM {name}").fetchall()
                db.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(data[0]))})", data)
        src.close()


def write_capture(path: Path, loop: Loop, repeat: int = 1, processes: int = 1) -> Path:
    """Write the capture of ``loop`` (its steps ``repeat`` times over, for a large one) to ``path``; with
    ``processes``, that many processes run it side by side, each on its own GPU, their correlation ids
    each counting from 1 (as CUPTI's do per process)."""
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    _schema_from(db, CLOVERLEAF, _FROM_CLOVERLEAF, _WITH_ROWS)
    _schema_from(db, SAXPY, _FROM_SAXPY, ())
    for gpu in range(processes):
        db.execute(
            "INSERT INTO TARGET_INFO_GPU (vmId, id, name) VALUES (0, ?, 'NVIDIA H100 80GB HBM3')", (gpu,)
        )
    db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME (utcEpochNs) VALUES (1760000000000000000)")
    for process in range(processes):
        w = _Writer(db, loop, process)
        w.insert("NVTX_EVENTS", start=0, eventType=75, text="perfmagic", globalTid=w.global_tid,
                 domainId=w.perfmagic_domain)  # fmt: skip
        k = 0
        for _ in range(repeat):
            for _ in range(loop.steps):
                w.step(k)
                k += 1
            w.flush()
    db.commit()
    db.close()
    return path


def pad_capture(path: Path, total_bytes: int) -> Path:
    """Grow the capture at ``path`` to ``total_bytes`` with rows of a table perfmagic does not read
    (``SCHED_EVENTS``, created by the real export's statement), as a capture's CPU sampling and
    scheduling tables make up most of a real one; its rows carry filler blobs."""
    db = sqlite3.connect(path)
    _schema_from(db, CLOVERLEAF, ("SCHED_EVENTS",), ())
    rows = 4096
    while path.stat().st_size < total_bytes:
        db.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
            "INSERT INTO SCHED_EVENTS (start, cpu, isSchedIn, globalTid, threadBlock) "
            "SELECT i * 1000, i % 64, i % 2, ?, randomblob(4000) FROM n",
            (rows - 1, GLOBAL_TID),
        )
        db.commit()
    db.close()
    return path
