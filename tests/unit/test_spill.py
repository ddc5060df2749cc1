"""Launch delays past what memory keeps: spilled to a file, their median and p90 are numpy's."""

from __future__ import annotations

import numpy as np
import pytest

from perfmagic.analyze import spill
from perfmagic.analyze.spill import Values

RNG = np.random.default_rng(7)
TIES = np.where(RNG.random(400) < 0.5, 1.0, np.nextafter(1.0, 2.0))  # two neighbouring floats, many of each


@pytest.mark.parametrize(
    "values",
    [
        np.concatenate(
            (np.zeros(300), RNG.exponential(40.0, 701))
        ),  # odd, a third of them 0 (kernels on time)
        RNG.exponential(40.0, 1000),  # even: the median is the mean of the middle two
        np.full(500, 3.5),
        TIES,
        np.concatenate((RNG.normal(0, 1e-9, 600), [1e12])),  # a far outlier: bins far wider than the values
    ],
    ids=["zeros", "even", "all-equal", "neighbouring-floats", "outlier"],
)
def test_spilled_values_give_numpys_median_and_percentile(
    values: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "SPILL_VALUES", 64)
    monkeypatch.setattr(spill, "BLOCK", 100)
    shuffled = RNG.permutation(values)
    kept = Values()
    for part in np.array_split(shuffled, 9):
        kept.add(part)
    kept.done()
    assert kept.file is not None  # spilled
    assert kept.median() == np.median(values)
    for q in (90, 50, 10, 99.9):
        assert kept.percentile(q) == np.percentile(values, q)


def test_values_below_the_threshold_stay_in_memory() -> None:
    kept = Values()
    kept.add(np.array([3.0, 1.0, 2.0]))
    kept.done()
    assert kept.file is None and kept.median() == 2.0 and kept.percentile(90) == np.percentile([1, 2, 3], 90)
