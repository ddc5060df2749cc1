"""What an Nsight Systems SQLite export (``nsys export --type sqlite``) must hold, and opening one.

An export names its schema in ``META_DATA_EXPORT`` (``EXPORT_META_DATA`` before schema 3):
``EXPORT_SCHEMA_VERSION``. Its tables are written lazily: an event table nothing was recorded
in is left out (a capture without memsets has no ``CUPTI_ACTIVITY_KIND_MEMSET``), so a missing
event table means no such events. A table that is present must have every column
:data:`COLUMNS` names; one without is a schema perfmagic does not know, and the error names
the table and the column. The ``ENUM_*`` tables that name copy directions and memory kinds
arrived with schema 3; older exports use the same numbers, kept in :data:`COPY_KINDS` and
:data:`MEMORY_KINDS`.

Besides ``.sqlite``, a gzipped export (``.sqlite.gz``) is decompressed to a temporary file, and
a report (``.nsys-rep``, ``.qdrep``) is exported by ``nsys`` when it is on ``PATH``.
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from perfmagic.traces.kineto import TraceFormatError

SQLITE_SUFFIXES = (".sqlite", ".sqlite.gz")
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
CAPTURE_SUFFIXES = SQLITE_SUFFIXES + REPORT_SUFFIXES
"""What an Nsight Systems capture's file name ends with."""

META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
"""Where the export names its schema: the first since schema 3, the second before."""

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
STRINGS = "StringIds"
GPUS = "TARGET_INFO_GPU"
SESSION_START = "TARGET_INFO_SESSION_START_TIME"

_GPU_COLUMNS = ("start", "end", "deviceId", "streamId", "correlationId")
COLUMNS: dict[str, tuple[str, ...]] = {
    KERNEL: (*_GPU_COLUMNS, "demangledName"),
    MEMCPY: (*_GPU_COLUMNS, "bytes", "copyKind", "srcKind", "dstKind"),
    MEMSET: (*_GPU_COLUMNS, "bytes", "memKind"),
    RUNTIME: ("start", "end", "eventClass", "globalTid", "correlationId", "nameId"),
    NVTX: ("start", "end", "eventType", "text", "textId", "globalTid", "domainId"),
    STRINGS: ("id", "value"),
    GPUS: ("id", "name"),
    SESSION_START: ("utcEpochNs",),
}
"""The columns perfmagic reads, by table."""
REQUIRED = (STRINGS,)
"""Tables every export has (the strings every name refers to)."""

COPY_KINDS = {
    0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
    8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "Unified HtoD", 12: "Unified DtoH", 13: "Unified DtoD",
}  # fmt: skip
"""``copyKind`` as Kineto names it (``Memcpy HtoD (...)``), when ``ENUM_CUDA_MEMCPY_OPER`` is absent."""
MEMORY_KINDS = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
    6: "Managed Static", 7: "Unknown",
}  # fmt: skip
"""``srcKind``, ``dstKind`` and ``memKind``, when ``ENUM_CUDA_MEM_KIND`` is absent (nsys's numbers, not CUPTI's)."""


class NsysSchema:
    """The tables and columns of one export, checked against :data:`COLUMNS`."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self.path = path
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        meta = next((t for t in META_TABLES if t in tables), None)
        if meta is None:
            raise TraceFormatError(
                f"{path}: not an Nsight Systems export: no {' or '.join(META_TABLES)} table "
                "(write one with: nsys export --type sqlite REPORT.nsys-rep)"
            )
        facts = dict(db.execute(f"SELECT name, value FROM {meta}"))
        self.version = str(facts.get("EXPORT_SCHEMA_VERSION", "unknown"))
        self.product = str(facts.get("EXPORT_PRODUCT_VERSION", "unknown"))
        self.tables = tables
        for table in REQUIRED:
            if table not in tables:
                raise self.unknown(f"no {table} table")
        for table, needed in COLUMNS.items():
            if table in tables:
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                missing = [c for c in needed if c not in have]
                if missing:
                    raise self.unknown(f"table {table} has no column {missing[0]}")
        copies = self._rows(db, "ENUM_CUDA_MEMCPY_OPER", "name")
        self.copy_kinds = {**COPY_KINDS, **{i: _copy_label(name) for i, name in copies}}
        self.memory_kinds = {**MEMORY_KINDS, **dict(self._rows(db, "ENUM_CUDA_MEM_KIND", "label"))}

    def unknown(self, what: str) -> TraceFormatError:
        """The error for an export perfmagic cannot read, naming its schema and ``what`` it lacks."""
        return TraceFormatError(
            f"{self.path}: an Nsight Systems export of schema {self.version} (nsys {self.product}) "
            f"that perfmagic cannot read: {what}"
        )

    def has(self, table: str) -> bool:
        return table in self.tables

    def _rows(self, db: sqlite3.Connection, table: str, column: str) -> list[tuple[int, str]]:
        if table not in self.tables:
            return []
        return [(int(i), str(v)) for i, v in db.execute(f"SELECT id, {column} FROM {table}")]


def _copy_label(enum_name: str) -> str:
    """``CUDA_MEMCPY_KIND_HTOD`` as Kineto writes it, ``HtoD``; ``..._UVM_DTOH``: ``Unified DtoH``."""
    short = enum_name.removeprefix("CUDA_MEMCPY_KIND_")
    unified = short.startswith("UVM_")
    short = short.removeprefix("UVM_")
    short = f"{short[0]}to{short[3]}" if len(short) == 4 and short[1:3] == "TO" else short.capitalize()
    return f"Unified {short}" if unified else short


@contextmanager
def open_capture(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the export at ``path`` (a ``.sqlite.gz`` or ``.nsys-rep`` first
    turned into a temporary ``.sqlite``); raises :class:`TraceFormatError` on what is not one."""
    if not path.is_file():
        raise TraceFormatError(f"{path}: no such file")
    with tempfile.TemporaryDirectory(prefix="perfmagic-nsys-") as tmp:
        db_path = path
        if path.name.endswith(".gz"):
            db_path = Path(tmp) / path.name.removesuffix(".gz")
            _gunzip(path, db_path)
        elif path.name.endswith(REPORT_SUFFIXES):
            db_path = _export(path, Path(tmp))
        try:
            db = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
        except sqlite3.Error as e:
            raise TraceFormatError(f"{path}: cannot open as SQLite ({e})") from e
        try:
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.DatabaseError as e:
            db.close()
            raise TraceFormatError(f"{path}: not an SQLite database ({e})") from e
        try:
            yield db
        finally:
            db.close()


def _gunzip(src: Path, dst: Path) -> None:
    try:
        with gzip.open(src, "rb") as fin, dst.open("wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    except (OSError, EOFError, zlib.error) as e:
        raise TraceFormatError(f"{src}: corrupt gzip data ({e})") from e


def _export(report: Path, tmp: Path) -> Path:
    """``nsys export --type sqlite`` of ``report`` into ``tmp``."""
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceFormatError(
            f"{report}: an Nsight Systems report; perfmagic reads its SQLite export, and nsys is not on PATH. "
            f"Export it where nsys is installed: nsys export --type sqlite --output {report.stem}.sqlite "
            f"{report.name}; then: perfmagic report {report.stem}.sqlite"
        )
    out = tmp / f"{report.stem}.sqlite"
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(out), str(report)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TraceFormatError(f"{report}: nsys export failed ({e})") from e
    if done.returncode != 0 or not out.is_file():
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise TraceFormatError(f"{report}: nsys export failed: {why[0]}")
    return out
