"""Unions of time intervals, vectorised: what GPU busy time and stage coverage are made of."""

from __future__ import annotations

import numpy as np


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint (start, end) arrays."""
    if not len(start):
        return np.zeros(0), np.zeros(0)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    first = np.empty(len(s), dtype=bool)
    first[0] = True
    first[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(first)
    return s[heads], np.maximum.reduceat(e, heads)


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """The total length of the union of intervals (overlaps counted once)."""
    s, e = merge_intervals(start, end)
    return float((e - s).sum())
