"""The ``optimizer`` stage of torch loops: optimizer steps (which end training steps), ``zero_grad``, GradScaler.

A step the scaler skips (inf/NaN gradients) still ends a training step; a second optimizer stepping in
the same iteration (a GAN's generator after its discriminator) continues it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perfmagic.collect.call_hints import call_hint
from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.stage_wrapper import recorded_as_stage
from perfmagic.collect.torch_memory import name_in_caller
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.collect.windowed_hooks import WindowedHooks

if TYPE_CHECKING:
    from perfmagic.collect.torch_hooks import TorchStages


def install_optimizer(
    stages: TorchStages, torch: Any, rec: StageRecorder, p: Patcher, windowed: WindowedHooks
) -> None:
    """Mark every optimizer ``step``'s end (it ends the steps, on every step); time it and ``zero_grad`` in
    the windows (``windowed``), like the other per-step stages.

    Each optimizer class torch has hooked for profiling (its instances exist) gets a wrapper around its
    ``step``: one Python call a step, where torch's global step hooks would cost three (``step``'s
    wrapper, a pre hook and a post hook). Classes torch hooks while profiling (an optimizer built in the
    profiled code) are wrapped as torch hooks them.
    """
    guarded: set[type] = set()
    guarded_version = _step_wrapper(stages, rec, windowed)

    def guard(cls: type) -> None:
        """Wrap the ``step`` that instances of ``cls`` call, where torch has hooked it."""
        owner = next((c for c in cls.__mro__ if "step" in c.__dict__), None)
        if owner is None or owner in guarded or not getattr(owner.__dict__["step"], "hooked", False):
            return
        p.set(owner, "step", guarded_version(owner.__dict__["step"]))
        guarded.add(owner)

    patch_step_function = torch.optim.Optimizer._patch_step_function

    def patch_and_guard(optimizer: Any) -> None:
        # torch hooks the class of each optimizer built (and unpickled) here, once
        patch_step_function(optimizer)
        guard(type(optimizer))

    for cls in _subclasses(torch.optim.Optimizer):
        guard(cls)
    p.set(torch.optim.Optimizer, "_patch_step_function", patch_and_guard)
    windowed.set(torch.optim.Optimizer, "zero_grad", lambda orig: rec.wrap(orig, "optimizer"))
    windowed.set(torch.nn.Module, "zero_grad", lambda orig: rec.wrap(orig, "optimizer"))


def _step_wrapper(stages: TorchStages, rec: StageRecorder, windowed: WindowedHooks) -> Callable[[Any], Any]:
    """What wraps torch's hooked ``step`` of an optimizer class: it ends the training step, times the step
    in the windows (``windowed.on``: outside them the analysis estimates every per-step stage, and the span
    would be two calls a step for nothing), and closes what it left open when it raised."""
    optimizer_id = rec.stage_id("optimizer")
    other_id = rec.stage_id("other")
    open_steps: list[bool] = []  # per optimizer step open (nested ones too): whether it was recorded
    stats, stepped, seen = stages.stats, stages.stepped, stages.seen
    maybe_start_device_clock = stages.maybe_start_device_clock if stages.cuda_available else None
    record_optimizer = _optimizer_record(stages)
    quick, now, get_ident = rec.quick, rec.clock.now, threading.get_ident
    noted = quick.times

    def guarded_version(step: Any) -> Any:
        """``step`` (torch's hooked one), wrapped."""

        def guarded_step(*args: Any, **kwargs: Any) -> Any:
            if (
                not open_steps
                and len(args) == 1
                and args[0] is quick.owner
                and not kwargs
                and get_ident() == quick.thread_id
            ):  # the step's end is only noted (``collect.quick_ends``)
                open_steps.append(False)  # a step nested in it (``super().step()``) ends none
                try:
                    result = step(*args)
                except BaseException as e:
                    drop_own_frame(e)
                    raise
                finally:
                    open_steps.pop()
                stats["optimizer_steps"] += 1
                t = now()
                noted.append(t)
                if (len(noted) >= quick.limit or t >= quick.due) and not quick.only_read(t):
                    rec.settle_quick_ends(at_step_end=True)
                return result
            depth = len(open_steps)
            if not depth:  # the outermost step (a subclass calling super().step() nests one)
                optimizer = id(args[0])
                if optimizer not in seen:
                    stages.record_once("optimizer", record_optimizer, args[0])
                # The last step ended is held back until now: another optimizer's step in the same
                # iteration (no batch fetched since) continues it; the same optimizer again starts a new
                # one, and this step's own end (``rec.boundary``) writes the held one, at its own time.
                if optimizer not in stepped:
                    rec.drop_held()
                    stepped.add(optimizer)
                elif len(stepped) > 1:  # with one optimizer (most loops) the set stays as it is
                    stepped.clear()
                    stepped.add(optimizer)
                if len(args) > 1 or kwargs:  # a closure, perhaps; most loops pass none
                    args, kwargs = _with_timed_closure(args, kwargs, rec, other_id)
            open_steps.append(windowed.on and rec.enter(optimizer_id))
            try:
                result = step(*args, **kwargs)
            except BaseException as e:
                drop_own_frame(e)
                raise
            finally:
                while len(open_steps) > depth:
                    if open_steps.pop():
                        rec.exit()
            if not depth:
                stats["optimizer_steps"] += 1
                rec.boundary("optimizer", hold=True)
                if maybe_start_device_clock is not None:
                    maybe_start_device_clock()
                elif not windowed.on:  # one optimizer in the steps: it may note their ends
                    rec.allow_quick_ends(args[0] if len(stepped) == 1 else None)
            return result

        guarded_step.hooked = True  # type: ignore[attr-defined]  # torch must not wrap it again
        guarded_step.__wrapped__ = step  # type: ignore[attr-defined]
        return guarded_step

    return guarded_version


def install_grad_scaler(stages: TorchStages, torch: Any, rec: StageRecorder, p: Patcher) -> None:
    """Time ``GradScaler.step`` and ``unscale_`` as ``optimizer``; a step it skips still ends a step."""
    scaler_cls = getattr(torch.amp, "GradScaler", None)  # torch >= 2.3; torch.cuda.amp's subclasses it
    if scaler_cls is None:
        return
    optimizer_id = rec.stage_id("optimizer")
    orig_step = scaler_cls.step
    stats = stages.stats

    def scaler_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if not rec.enter(optimizer_id):
                return orig_step(scaler, optimizer, *args, **kwargs)
            steps = stats["optimizer_steps"]
            try:
                result = orig_step(scaler, optimizer, *args, **kwargs)
            finally:
                rec.exit()
            if stats["optimizer_steps"] == steps:
                # inf/NaN gradients: the scaler skipped optimizer.step(), yet a training step ended
                rec.boundary("optimizer")
            return result
        except BaseException as e:
            drop_own_frame(e)
            raise

    scaler_step.__wrapped__ = orig_step  # type: ignore[attr-defined]
    p.set(scaler_cls, "step", scaler_step)
    p.set(scaler_cls, "unscale_", rec.wrap(scaler_cls.unscale_, "optimizer"))


def _optimizer_record(stages: TorchStages) -> Callable[[Any], None]:
    """What notes an optimizer's set-up: the ``optimizer`` mark."""
    timeline, now = stages.recorder.timeline, stages.now

    def record_optimizer(optimizer: Any) -> None:
        defaults = optimizer.defaults
        caller = sys._getframe(1)
        timeline.add_mark(
            now(),
            "optimizer",
            cls=type(optimizer).__name__,
            variable=name_in_caller(optimizer, caller),
            foreach=defaults.get("foreach"),
            fused=defaults.get("fused"),
            parameters=sum(int(q.numel()) for g in optimizer.param_groups for q in g["params"]),
            # its settings tell the user's calls apart by their literal arguments (``lr=3e-4``)
            call=call_hint(optimizer, caller, values=dict(defaults)),
        )

    return record_optimizer


def _with_timed_closure(
    args: tuple[Any, ...], kwargs: dict[str, Any], rec: StageRecorder, other_id: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """An optimizer step's arguments with its closure timed: a closure (Lightning runs ``training_step``
    in one, LBFGS re-evaluates the loss) is not the optimizer's time: inside it, what is no forward or
    backward is ``other``."""
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
    if closure is None or not callable(closure):
        return args, kwargs
    timed_closure = recorded_as_stage(closure, rec.enter, rec.exit, other_id)

    if "closure" in kwargs:
        return args, {**kwargs, "closure": timed_closure}
    return (args[0], timed_closure, *args[2:]), kwargs


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return list(dict.fromkeys(found))
