"""What a forked child holds of its parent's and must never free: kept referenced until the child exits."""

from __future__ import annotations

_KEPT_BY_FORKED_CHILD: list[object] = []


def keep_until_exit(obj: object) -> None:
    """Keep ``obj`` referenced until this forked child exits: what it holds of the parent's device
    (CUDA events, streams) must never be freed here (see ``StageRecorder.stop_recording``)."""
    _KEPT_BY_FORKED_CHILD.append(obj)
