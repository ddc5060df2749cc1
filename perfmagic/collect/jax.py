"""JAX hooks: steps and stages from the profiler annotations, stage ends timed on the device.

========== ==================================================================
steps      a step boundary (kind ``user``) where each
           ``jax.profiler.StepTraceAnnotation`` block ends
stages     each ``jax.profiler.TraceAnnotation`` block is a stage of its name
           (``"data"``, ``"forward"``, ... are the built-in stages; any other
           name is a stage of the user's, like ``perfmagic.stage``)
device     JAX dispatches work and returns before the device has done it:
           :class:`BlockingClock` makes every stage start and end (annotated
           or ``perfmagic.stage``) wait for the arrays alive at that moment,
           so a stage lasts until its device work is done
========== ==================================================================

The annotation classes are patched (``__init__``, ``__enter__``, ``__exit__``),
so annotations imported before profiling are covered; all is put back by
:meth:`JaxHooks.uninstall`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from perfmagic.clock import REAL_CLOCK, Clock
from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.schema import STEP_BOUNDARY_PREFIX


class BlockingClock:
    """A device clock for JAX: an event token waits until every live array is computed, then reads the time.

    Tokens are taken on the training thread at stage starts and ends, so a stage's
    device work ends inside it (a few µs per hundred live arrays).
    """

    def __init__(self, origin: float, clock: Clock = REAL_CLOCK) -> None:
        import jax

        self._jax = jax
        self._origin, self._now = origin, clock.now

    def event_token(self) -> object | None:
        self._jax.block_until_ready(self._jax.live_arrays())
        return self._now() - self._origin

    def done(self, token: object) -> bool:
        return True  # a token is taken once the device is there

    def resolve(self, tokens: list[object]) -> list[float | None]:
        return [t if isinstance(t, float) else None for t in tokens]

    def close(self) -> None:
        return None  # its tokens are times: nothing of the device to free


class JaxHooks:
    """Records JAX's profiler annotations as steps and stages; :meth:`uninstall` puts them back."""

    def __init__(self, recorder: StageRecorder, on_framework: Callable[[str], None]) -> None:
        self._recorder = recorder
        self._on_framework = on_framework
        self._patcher = Patcher()

    def install(self) -> None:
        from jax._src import profiler

        recorder = self._recorder
        # torch's CUDA event clock times a torch loop better; a process that has torch trains with it
        if recorder.device_clock is None and "torch" not in sys.modules:
            recorder.device_clock = BlockingClock(recorder.origin, recorder.clock)
        on_framework = self._on_framework  # at an annotation: Keras imports JAX whatever its backend
        annotation, step = profiler.TraceAnnotation, profiler.StepTraceAnnotation
        init, enter, exit_ = annotation.__init__, annotation.__enter__, annotation.__exit__

        def __init__(note: Any, name: str, *args: Any, **kwargs: Any) -> None:
            init(note, name, *args, **kwargs)
            note._perfmagic_name = name

        def __enter__(note: Any) -> Any:
            out = enter(note)
            name = getattr(note, "_perfmagic_name", None)
            is_step = isinstance(note, step)
            opened = (
                not is_step
                and isinstance(name, str)
                and bool(name)
                and not name.startswith(STEP_BOUNDARY_PREFIX)
                and recorder.enter(recorder.stage_id(name))
            )
            note._perfmagic_open = opened
            if opened or is_step:
                on_framework("jax")
            return out

        def __exit__(note: Any, *exc: Any) -> Any:
            if getattr(note, "_perfmagic_open", False):
                note._perfmagic_open = False
                recorder.exit()
            elif isinstance(note, step):
                recorder.boundary("user")
            return exit_(note, *exc)

        self._patcher.set(annotation, "__init__", __init__)
        self._patcher.set(annotation, "__enter__", __enter__)
        self._patcher.set(annotation, "__exit__", __exit__)

    def uninstall(self) -> list[str]:
        # the clock stays: the recorder, closed next, resolves its last event tokens with it
        return self._patcher.restore()
