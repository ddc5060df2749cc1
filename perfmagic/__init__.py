"""perfmagic: find out why deep-learning training is slow, from the notebook where it runs.

``with perfmagic.profile() as session: train()`` records what each training
stage and the hardware did; ``session.report`` says what held the step back.
"""

from __future__ import annotations

from typing import Any

from perfmagic.report import Report
from perfmagic.server import _jupyter_labextension_paths, _jupyter_server_extension_points
from perfmagic.session import Session, load, profile, stage, step
from perfmagic.tuning import tune

__version__ = "0.1.0"
__all__ = [
    "Report",
    "Session",
    "__version__",
    "_jupyter_labextension_paths",
    "_jupyter_server_extension_points",
    "load",
    "load_ipython_extension",
    "profile",
    "stage",
    "step",
    "tune",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext perfmagic``: registers ``%%gpuprofile`` and ``%gpumonitor``."""
    from perfmagic.magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext perfmagic``: stops a running ``%gpumonitor``."""
    from perfmagic.magic import unload_ipython_extension as unload

    unload(ipython)
