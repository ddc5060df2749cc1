"""The colours every renderer gives stages and advice severities.

Each stage has one colour everywhere (built-in stages a fixed one, user stages one derived from
their name), so the charts, the still pictures and the live panel of two runs read alike.
"""

from __future__ import annotations

import zlib

STAGE_COLORS: dict[str, str] = {
    "data": "#f28e2b",
    "h2d": "#edc948",
    "forward": "#4e79a7",
    "backward": "#59a14f",
    "optimizer": "#76b7b2",
    "checkpoint": "#b07aa1",
    "logging": "#e15759",
    "comm": "#9c755f",
    "other": "#bab0ac",
}
_USER_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")

SEVERITY_COLORS = {"high": "#d62728", "medium": "#f28e2b", "low": "#c9a227", "info": "#4e79a7"}
"""An advice card's colour by its severity."""


def stage_color(name: str) -> str:
    """The color of a stage: fixed for built-in stages, stable per name for user stages."""
    color = STAGE_COLORS.get(name)
    if color is None:
        color = _USER_PALETTE[zlib.crc32(name.encode()) % len(_USER_PALETTE)]
    return color
