"""What ``gpu_check.py`` says and keeps: its output teed to a file, each check's verdict, number formats."""

from __future__ import annotations

import contextlib
import subprocess
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO


class Tee:
    """stdout that also goes, line by line, to a file (so a watchdog kill keeps what was said)."""

    def __init__(self, console: TextIO, path: Path | None) -> None:
        self.console = console
        self.file = path.open("w", encoding="utf-8") if path is not None else None

    def write(self, text: str) -> int:
        self.console.write(text)
        if self.file is not None:
            self.file.write(text)
        return len(text)

    def flush(self) -> None:
        self.console.flush()
        if self.file is not None:
            self.file.flush()


class Check:
    """The run's verdicts and the current phase (for the watchdog)."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.phase = "start"
        self.results: dict[str, tuple[bool | None, str]] = {}  # name -> (ok, one-line summary)
        self.child: subprocess.Popen[str] | None = None  # killed with us by the watchdog
        self.started = time.monotonic()

    def record(self, name: str, ok: bool | None, summary: str) -> None:
        self.results[name] = (ok, summary)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        self.phase = name
        t0 = time.monotonic()
        print(f"\n== {name}", flush=True)
        try:
            yield
        except Exception as e:  # one phase failing must not cost the others
            print(f"{name}: FAILED: {type(e).__name__}: {e}")
            tb = traceback.format_exc().rstrip().splitlines()
            print("  " + "\n  ".join(tb[-6:]))
            if name not in self.results:
                self.record(name, False, f"crashed: {type(e).__name__}: {e}")
        finally:
            print(f"({name}: {time.monotonic() - t0:.1f} s)", flush=True)

    def write_file(self, name: str, text: str) -> None:
        if self.out is not None:
            with contextlib.suppress(OSError):
                (self.out / name).write_text(text, encoding="utf-8")

    def verdict(self) -> int:
        print("\n== verdict")
        for name, (ok, summary) in self.results.items():
            mark = "ok  " if ok else ("n/a " if ok is None else "FAIL")
            print(f"[{mark}] {name:<14} {summary}")
        failed = [n for n, (ok, _) in self.results.items() if ok is False]
        print(
            f"gpu-check: {'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} "
            f"({time.monotonic() - self.started:.0f} s)",
            flush=True,
        )
        return 1 if failed else 0


def fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def pct(v: Any) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, (int, float)) else "-"
