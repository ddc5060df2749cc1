"""Jupyter server extension: the GPU monitor behind perfmagic's JupyterLab sidebar.

``perfmagic/__init__.py`` re-exports the three ``_jupyter_*`` hooks, so both ``perfmagic`` and
``perfmagic.server`` work as the extension's module name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from perfmagic.server.app import PerfmagicExtension

    return [{"module": "perfmagic.server", "app": PerfmagicExtension}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    # Absolute, so it resolves the same whichever module re-exports this hook.
    src = Path(__file__).resolve().parent.parent / "labextension"
    return [{"src": str(src), "dest": "perfmagic"}]
