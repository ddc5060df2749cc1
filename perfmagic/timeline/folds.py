"""Steps folded out of a timeline's spans to bound its memory: about 30 bytes a step instead of its spans."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class FoldedSteps:
    """Steps whose spans were folded away: per step its start, duration and the exclusive seconds of
    each stage, and the profiled thread's CPU, run-queue wait and GC seconds (NaN: unmeasured)."""

    kind: str  # the boundary kind that delimited them (see ``analyze.steps``)
    until: float  # the end of the last one: spans before it are no longer in the timeline
    start: np.ndarray
    duration: np.ndarray
    stages: dict[str, np.ndarray]
    cpu_s: np.ndarray
    wait_s: np.ndarray
    gc_s: np.ndarray

    def __len__(self) -> int:
        return len(self.start)


@dataclass(frozen=True)
class Fold:
    """The first ``spans`` spans (all before ``steps.until``) and samples, replaced by their steps' rows."""

    spans: int
    steps: FoldedSteps
    samples: dict[str, int]  # per series: how many samples from the first may go


class FoldedColumns:
    """Folded steps as the chunks each fold added (no column is ever copied to grow), float32 where a
    duration is all a column holds; a stage's column where it was not used reads 0."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.until = 0.0
        self.chunks: list[FoldedSteps] = []

    def extend(self, rows: FoldedSteps) -> None:
        import numpy as np

        def f32(column: np.ndarray) -> np.ndarray:
            return np.asarray(column, dtype=np.float32)

        self.chunks.append(
            FoldedSteps(
                kind=rows.kind,
                until=rows.until,
                start=np.asarray(rows.start, dtype=np.float64),
                duration=f32(rows.duration),
                stages={k: f32(v) for k, v in rows.stages.items()},
                cpu_s=f32(rows.cpu_s),
                wait_s=f32(rows.wait_s),
                gc_s=f32(rows.gc_s),
            )
        )
        self.until = rows.until

    def view(self) -> FoldedSteps:
        import numpy as np

        chunks = self.chunks

        def joined(name: str) -> np.ndarray:
            return np.concatenate([getattr(c, name) for c in chunks]).astype(np.float64)

        stages = dict.fromkeys(k for c in chunks for k in c.stages)
        return FoldedSteps(
            kind=self.kind,
            until=self.until,
            start=joined("start"),
            duration=joined("duration"),
            stages={
                k: np.concatenate([c.stages.get(k, np.zeros(len(c), np.float32)) for c in chunks]).astype(
                    np.float64
                )
                for k in stages
            },
            cpu_s=joined("cpu_s"),
            wait_s=joined("wait_s"),
            gc_s=joined("gc_s"),
        )
