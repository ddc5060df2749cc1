"""Clocks of several hosts put on one time axis, from the collectives their ranks left together.

Each node's records carry wall-clock times of its own host; hosts disagree by whatever
their clock synchronisation left (milliseconds with NTP, seconds without). A collective
ends on every rank at nearly the same instant (the last rank to arrive releases them all),
so the ends of matching ``comm`` spans say how far one host's clock is from another's.
Collectives are matched by order: the k-th ``comm`` span of every rank is the same
collective (the ranks of a group run their collectives in one order). The offset is the
median over matched collectives of the reference's end less the node's (each node's end
being the median over its ranks). Its uncertainty is the larger of two 90th percentiles:
how far single collectives stray from the offset, and how far apart ranks that share a
clock (one node's) leave one collective, which bounds how together "together" is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmagic.timeline import Timeline

MIN_MATCHED = 3
"""Matched collectives below which a node's clock is not corrected."""


@dataclass(frozen=True)
class ClockOffset:
    offset_s: float  # add to the node's wall-clock times to put them on the reference's clock
    uncertainty_s: float
    matched: int  # collectives matched with the reference


def collective_ends(timeline: Timeline) -> np.ndarray:
    """Wall-clock ends (seconds since the Unix epoch) of a process's ``comm`` spans, in the order they began."""
    spans = timeline.spans
    if "comm" not in spans.names or not len(spans):
        return np.zeros(0)
    mine = np.flatnonzero(spans.name_id == spans.names.index("comm"))
    mine = mine[np.argsort(spans.start[mine], kind="stable")]
    return spans.end[mine] + float(timeline.meta.get("epoch", 0.0))


def clock_offset(reference: list[np.ndarray], node: list[np.ndarray]) -> ClockOffset | None:
    """The node's clock offset against the reference node's, from each one's ranks'
    :func:`collective_ends`; None when fewer than :data:`MIN_MATCHED` collectives match."""
    ranks = [p for p in (*reference, *node) if len(p)]
    n = min((len(p) for p in ranks), default=0)
    if n < MIN_MATCHED or not any(len(p) for p in reference) or not any(len(p) for p in node):
        return None
    ref = np.stack([p[:n] for p in reference if len(p)])
    own = np.stack([p[:n] for p in node if len(p)])
    d = np.median(ref, axis=0) - np.median(own, axis=0)
    offset = float(np.median(d))
    spread = max(float(np.percentile(e.max(axis=0) - e.min(axis=0), 90)) for e in (ref, own))
    return ClockOffset(offset, max(float(np.percentile(np.abs(d - offset), 90)), spread), n)
