"""Evaluation passes: validation, test, prediction and sanity checks, kept out of the training steps.

A pass is seen two ways: a framework's evaluation routine runs (``begin``/``end``,
called by the framework hooks), or a DataLoader pass ran out having trained
nothing (``seen``, called by the torch hooks once it is over). Either way the pass
leaves an ``evaluation`` mark (its start, ``seconds``, ``kind``) and the boundaries
``step:eval_start`` and ``step:eval_end``: the step before it ends where it begins
(what ran after the optimizer step, such as a checkpoint, stays in that step) and the
step after it starts where it ended.

A checkpoint saved inside a pass (Lightning's ``ModelCheckpoint`` saves when
validation ends) is training's saving, not evaluation: the pass ends where the
save begins, and the save falls in the next step.
"""

from __future__ import annotations

from perfmagic.collect.recorder import StageRecorder
from perfmagic.schema import EVALUATION_MARK


class EvaluationPasses:
    """Tracks the evaluation pass the recorded thread is in, if any."""

    def __init__(self, recorder: StageRecorder) -> None:
        self._recorder = recorder
        self._depth = 0
        self._start = 0.0
        self._kind = ""
        self._ended = False  # the pass ended early: a checkpoint began inside it

    @property
    def active(self) -> bool:
        """Whether the recorded thread is inside an evaluation pass (outer or nested)."""
        return self._depth > 0

    def begin(self, kind: str) -> bool:
        """A framework's evaluation routine starts; False where it is not recorded (then no ``end``)."""
        if not self._recorder.on_recorded_thread():
            return False
        self._depth += 1
        if self._depth == 1:
            self._start, self._kind, self._ended = self._now(), kind, False
        return True

    def end(self) -> None:
        self._depth -= 1
        if self._depth == 0 and not self._ended:
            self._close(self._now())

    def seen(self, start: float, kind: str = "dataloader") -> None:
        """A pass that is over already: a DataLoader pass from ``start`` to now that trained nothing."""
        if self._depth == 0 and self._recorder.on_recorded_thread():
            self._start, self._kind = start, kind
            self._close(self._now())

    def checkpoint_starts(self) -> None:
        """A save begins: inside a pass, the pass's evaluation ends here."""
        if self._depth and not self._ended:
            self._ended = True
            self._close(self._now())

    def _close(self, end: float) -> None:
        self._recorder.boundary_at("eval_start", self._start)
        self._recorder.boundary("eval_end")
        self._recorder.timeline.add_mark(
            self._start, EVALUATION_MARK, seconds=max(0.0, end - self._start), kind=self._kind
        )

    def _now(self) -> float:
        return self._recorder.clock.now() - self._recorder.origin
