"""What the user's code marks itself: a named stage around a block, the end of a step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from perfmagic.collect.nvtx_ranges import NO_RECORDER
from perfmagic.schema import STEP_BOUNDARY_PREFIX
from perfmagic.session import active_session


@contextmanager
def stage(name: str) -> Iterator[None]:
    """A user-named stage (and NVTX range) around a block."""
    if not isinstance(name, str) or not name or name.startswith(STEP_BOUNDARY_PREFIX):
        raise ValueError(
            f"perfmagic.stage: a stage name is a non-empty string not starting with {STEP_BOUNDARY_PREFIX!r} "
            f"(those mark step ends), got {name!r}"
        )
    session = active_session()
    recorder = session.recorder if session is not None else None
    with (recorder or NO_RECORDER).stage(name):
        yield


def step() -> None:
    """Mark the end of a training step, where no optimizer or DataLoader shows it."""
    session = active_session()
    if session is not None and session.recorder is not None:
        session.recorder.boundary("user")
