"""How much a test's own repeated timings can tell: what holds a promise to them on a busy machine."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def median_error(values: Sequence[float] | np.ndarray) -> float:
    """The standard error of the median of ``values``, robust to outliers: the spread 1.4826 median
    absolute deviations make (a normal sample's standard deviation), times the median's 1.25 / sqrt(n)."""
    x = np.asarray(values, dtype=np.float64)
    deviation = float(np.median(np.abs(x - np.median(x))))
    return 1.4826 * deviation * 1.25 / float(np.sqrt(len(x)))
