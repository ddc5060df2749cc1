"""The ``checkpoint`` stage of torch loops: ``torch.save``, safetensors' saves, frameworks' checkpoint routines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmagic.collect.evaluation import EvaluationPasses
from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.saves import rebind_copies, safetensors_torch, saved_size, saved_what
from perfmagic.collect.tracebacks import drop_own_frame


class CheckpointTiming:
    """Times saves as ``checkpoint`` with a ``checkpoint`` mark each: its time, bytes and contents."""

    def __init__(
        self, recorder: StageRecorder, evaluation: EvaluationPasses, now: Callable[[], float]
    ) -> None:
        self._recorder = recorder
        self._evaluation = evaluation
        self._now = now
        # bytes each save wrote inside a framework's checkpoint routine (None outside one)
        self._inner_saves: list[int | None] | None = None

    def install(self, torch: Any, p: Patcher) -> None:
        """Patch ``torch.save``, ``safetensors.torch.save_file`` / ``save_model`` and the copies bound of them."""
        saves: dict[Any, Any] = {torch.save: self._timed_save(torch.save, "torch.save")}
        p.set(torch, "save", saves[torch.save])
        st = safetensors_torch()
        for name in ("save_file", "save_model") if st is not None else ():
            orig = getattr(st, name)
            saves[orig] = self._timed_save(orig, f"safetensors.torch.{name}")
            p.set(st, name, saves[orig])
        rebind_copies(saves, p)

    def _timed_save(self, orig: Any, label: str) -> Any:
        rec = self._recorder
        checkpoint_id = rec.stage_id("checkpoint")
        evaluation = self._evaluation

        def save(*args: Any, **kwargs: Any) -> Any:
            try:
                if not rec.enter(checkpoint_id):
                    if self._inner_saves is None or not rec.on_recorded_thread():
                        return orig(*args, **kwargs)
                    try:  # a save inside a framework's checkpoint routine: only its size is noted
                        return orig(*args, **kwargs)
                    finally:
                        self._inner_saves.append(saved_size(args, kwargs))
                evaluation.checkpoint_starts()
                start = self._now()
                try:
                    return orig(*args, **kwargs)
                finally:
                    rec.exit()
                    rec.timeline.add_mark(
                        start,
                        "checkpoint",
                        fn=label,
                        seconds=self._now() - start,
                        bytes=saved_size(args, kwargs),
                        **saved_what(args, kwargs),
                    )
            except BaseException as e:
                drop_own_frame(e)
                raise

        save.__wrapped__ = orig  # type: ignore[attr-defined]
        return save

    def run_routine(
        self, orig: Callable[..., Any], label: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``orig(*args, **kwargs)``, a framework's whole checkpoint routine (model, optimizer, scheduler
        and RNG state, its own files, the rotation of old checkpoints), recorded as one ``checkpoint``;
        the size of a checkpoint is what the saves inside it wrote."""
        rec = self._recorder
        try:
            if not rec.enter(rec.stage_id("checkpoint")):
                return orig(*args, **kwargs)
            self._evaluation.checkpoint_starts()
            start = self._now()
            outer, self._inner_saves = self._inner_saves, []
            try:
                return orig(*args, **kwargs)
            finally:
                inner, self._inner_saves = self._inner_saves, outer
                rec.exit()
                sizes = [n for n in inner if n is not None]
                rec.timeline.add_mark(
                    start,
                    "checkpoint",
                    fn=label,
                    seconds=self._now() - start,
                    bytes=sum(sizes) if inner and len(sizes) == len(inner) else None,
                    what="checkpoint",
                    files=len(inner),
                )
        except BaseException as e:
            drop_own_frame(e)
            raise
