"""perfmagic: find out why deep-learning training is slow, from the notebook where it runs.

``with perfmagic.profile() as session: train()`` records what each training
stage and the hardware did; ``session.report`` says what held the step back.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfmagic.records import load
    from perfmagic.report import Report
    from perfmagic.server import _jupyter_labextension_paths, _jupyter_server_extension_points
    from perfmagic.session import Session, profile
    from perfmagic.tuning import tune
    from perfmagic.user_marks import stage, step

__version__ = "0.1.0"
__all__ = [
    "Report",
    "Session",
    "__version__",
    "_jupyter_labextension_paths",
    "_jupyter_server_extension_points",
    "load",
    "load_ipython_extension",
    "load_trace",
    "profile",
    "stage",
    "step",
    "tune",
    "unload_ipython_extension",
]

_LAZY = {
    "Report": "perfmagic.report",
    "Session": "perfmagic.session",
    "profile": "perfmagic.session",
    "load": "perfmagic.records",
    "tune": "perfmagic.tuning",
    "stage": "perfmagic.user_marks",
    "step": "perfmagic.user_marks",
    "_jupyter_labextension_paths": "perfmagic.server",
    "_jupyter_server_extension_points": "perfmagic.server",
}
"""Where each public name lives. Imported on first use: every Python process that ``perfmagic run``
profiles imports this package at start-up, and the analysis and render layers (numpy among them) cost
it most of a second that only the report needs."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perfmagic' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load_trace(path_or_dir: str | os.PathLike[str], step_range: str | None = None) -> Report:
    """The report of a trace that ``torch.profiler`` wrote (``.json`` or ``.json.gz``) or of an Nsight
    Systems capture (``.sqlite``, ``.nsys-rep``), or of every rank's trace in a directory: what
    ``perfmagic report`` prints, shown in a notebook as a live report is. ``step_range``: a regular
    expression for the NVTX ranges that are a capture's steps. Raises
    :class:`perfmagic.traces.TraceFormatError` on a file that is not a trace."""
    from perfmagic.trace_report import report_from_traces

    return report_from_traces([path_or_dir], step_range)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext perfmagic``: registers ``%%gpuprofile`` and ``%gpumonitor``."""
    from perfmagic.magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext perfmagic``: stops a running ``%gpumonitor``."""
    from perfmagic.magic import unload_ipython_extension as unload

    unload(ipython)
