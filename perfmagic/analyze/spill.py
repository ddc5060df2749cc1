"""Values whose median or percentile a figure needs: kept in memory up to ``SPILL_VALUES``, beyond that
written to a temporary file and the few order statistics asked for selected there.

Selection reads the file a block at a time (plain reads: a memory map's pages would count as the
process's memory): each pass counts the values in the range that holds the wanted rank in
``BINS`` bins and narrows the range to the bin holding it, until the range holds few enough values
to sort or one value. Medians and percentiles come out as :func:`numpy.median` and
:func:`numpy.percentile` (linear) give them.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from typing import IO

import numpy as np

SPILL_VALUES = 1 << 20
"""Values kept in memory (8 MiB); more go to a temporary file."""
BLOCK = 1 << 18
"""Values read back at a time."""
BINS = 4096


class Values:
    """float64 values, added an array at a time."""

    def __init__(self) -> None:
        self.spill_values = SPILL_VALUES
        self.parts: list[np.ndarray] = []
        self.n = 0
        self.file: IO[bytes] | None = None
        self.low, self.high = math.inf, -math.inf

    def __len__(self) -> int:
        return self.n

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.n += len(values)
        self.low, self.high = min(self.low, float(values.min())), max(self.high, float(values.max()))
        if self.file is None and self.n <= self.spill_values:
            self.parts.append(np.asarray(values, np.float64))
            return
        if self.file is None:
            # open as long as the values are: removed when they are collected
            self.file = tempfile.TemporaryFile(prefix="perfmagic-values-")  # noqa: SIM115
            for part in self.parts:
                self.file.write(part.tobytes())
            self.parts = []
        self.file.write(np.asarray(values, np.float64).tobytes())

    def done(self) -> None:
        """No more values: the file (where there is one) is flushed for reading."""
        if self.file is not None:
            self.file.flush()

    def median(self) -> float:
        if self.file is None:
            return float(np.median(np.concatenate(self.parts)))
        half = self.n // 2
        if self.n % 2:
            return self._kth(half)
        return float(np.mean([self._kth(half - 1), self._kth(half)]))

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile, linear interpolation between the closest ranks."""
        if self.file is None:
            return float(np.percentile(np.concatenate(self.parts), q))
        quantile = q / 100
        virtual = self.n * quantile + (1 + quantile * (1 - 1 - 1)) - 1  # numpy's, for method "linear"
        below = min(max(math.floor(virtual), 0), self.n - 1)
        gamma = virtual - below
        a, b = self._kth(below), self._kth(min(below + 1, self.n - 1))
        diff = b - a  # numpy's _lerp: the closer bound plus the share of the difference
        return float(b - diff * (1 - gamma)) if gamma >= 0.5 else float(a + diff * gamma)

    def _blocks(self) -> Iterator[np.ndarray]:
        assert self.file is not None
        self.file.seek(0)
        while len(block := np.fromfile(self.file, np.float64, BLOCK)):
            yield block

    def _kth(self, k: int) -> float:
        """The ``k``-th smallest value (from 0)."""
        low, high, below = self.low, self.high, 0  # the range [low, high] holds ranks below..
        while low < high:
            inside = np.zeros(BINS, np.int64)
            edges = np.linspace(low, high, BINS + 1)
            least, most = math.inf, -math.inf
            for block in self._blocks():
                v = block[(block >= low) & (block <= high)]
                if len(v):
                    inside += np.bincount(_bin(edges, v), minlength=BINS)
                    least, most = min(least, float(v.min())), max(most, float(v.max()))
            counts = np.cumsum(inside)
            if least == most or counts[-1] <= self.spill_values:
                return least if least == most else self._sorted_kth(k - below, low, high)
            b = int(np.searchsorted(counts, k - below, side="right"))
            if inside[b] == counts[-1]:  # bins too narrow to part the values: take the least out
                same = sum(int((block == least).sum()) for block in self._blocks())
                if k - below < same:
                    return least
                low, below = float(np.nextafter(least, math.inf)), below + same
                continue
            below += int(counts[b - 1]) if b else 0
            low, high = (
                float(edges[b]),
                float(np.nextafter(edges[b + 1], -math.inf)) if b < BINS - 1 else high,
            )
        return low

    def _sorted_kth(self, k: int, low: float, high: float) -> float:
        """The ``k``-th smallest of the values in ``[low, high]``, found by sorting them."""
        v = np.concatenate([block[(block >= low) & (block <= high)] for block in self._blocks()])
        return float(np.partition(v, k)[k])


def _bin(edges: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Each value's bin: ``[edges[i], edges[i + 1])``, the last one closed."""
    out: np.ndarray = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, len(edges) - 2)
    return out
