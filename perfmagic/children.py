"""Profiling of the Python interpreters a process starts, as ``perfmagic run`` does for its command.

``perfmagic run`` puts a directory holding a ``sitecustomize.py`` first on
``PYTHONPATH`` and names its run directory in ``PERFMAGIC_RUN_DIR``. Python
imports ``sitecustomize`` at start-up in every interpreter the command starts
(torchrun's workers included); it calls ``perfmagic.bootstrap.start_from_env``,
which profiles the process until it exits, then hands over to the user's own
``sitecustomize``, if any. A profiled block does the same for the interpreters
it starts (``torch.multiprocessing.spawn`` workers) with :class:`ChildProfiling`,
for as long as it runs.
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_DIR_ENV = "PERFMAGIC_RUN_DIR"
INTERVAL_ENV = "PERFMAGIC_INTERVAL"
TRACE_ENV = "PERFMAGIC_TRACE_STEPS"
TUNE_ENV = "PERFMAGIC_TUNE"
"""Set: tune at the end of each process; its value, when not empty, is the budget in seconds."""
FULL_ENV = "PERFMAGIC_FULL"
"""Set: record every step's stages in each process (``--full``), not windows of steps."""

CHILDREN_DIR = "children"
"""Where the records of the interpreters a window started go, in its ``outdir``."""

SITECUSTOMIZE = '''\
"""Written by perfmagic run: profiles this interpreter, then runs the user's sitecustomize."""
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
try:
    from perfmagic.bootstrap import start_from_env

    start_from_env()
except Exception as _e:  # never stop the user's program
    _sys.stderr.write(f"perfmagic: not profiling this process ({_e!r})\\n")
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_ours = _sys.modules.pop("sitecustomize")
try:
    import sitecustomize  # noqa: F401  the user's own, if any
except ImportError:
    _sys.modules["sitecustomize"] = _ours  # the import system reads it back after this file runs
'''


def write_sitecustomize(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sitecustomize.py"
    path.write_text(SITECUSTOMIZE, encoding="utf-8")
    return path


class ChildProfiling:
    """A collector: from ``start`` to ``stop``, every Python interpreter this process starts is profiled
    into ``run_dir``, as ``perfmagic run`` does.

    Only a fresh interpreter reads the environment (spawned workers, subprocesses); a forked
    child does not. Inside ``perfmagic run`` the children are its own already: nothing is set.
    ``stop`` restores each variable the block left as ``start`` set it; one the block changed
    itself stays the block's, less this directory on ``PYTHONPATH``.
    """

    def __init__(self, run_dir: Path, interval: float, full: bool = False) -> None:
        self.run_dir, self.interval, self.full = run_dir, interval, full
        self._boot: str | None = None
        self._before: dict[str, str | None] = {}
        self._ours: dict[str, str] = {}

    def start(self) -> None:
        if RUN_DIR_ENV in os.environ:
            return
        self._boot = boot = str(write_sitecustomize(self.run_dir / "boot").parent.resolve())
        before = self._before = {
            name: os.environ.get(name) for name in ("PYTHONPATH", RUN_DIR_ENV, INTERVAL_ENV, FULL_ENV)
        }
        self._ours = {
            "PYTHONPATH": os.pathsep.join([boot, *filter(None, [before["PYTHONPATH"]])]),
            RUN_DIR_ENV: str(self.run_dir.resolve()),
            INTERVAL_ENV: str(self.interval),
        }
        if self.full:  # each child records every step, as the block does
            self._ours[FULL_ENV] = "1"
        os.environ.update(self._ours)

    def stop(self) -> list[str]:
        ours, self._ours = self._ours, {}
        for name, value in ours.items():
            now = os.environ.get(name)
            if now == value:
                old = self._before[name]
                if old is None:
                    del os.environ[name]
                else:
                    os.environ[name] = old
            elif name == "PYTHONPATH" and now is not None:
                os.environ[name] = os.pathsep.join(p for p in now.split(os.pathsep) if p != self._boot)
        return []
