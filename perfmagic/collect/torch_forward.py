"""The ``forward`` stage of torch loops: the outermost module call, with autocast and grad counted.

Module calls are wrapped at ``nn.Module.__call__`` rather than through the global module hooks: global
hooks push every module off PyTorch's hook-free fast path, which costs more than the whole recorder on
small models (2.2 µs a module call against 0.3). The wrapper comes and goes with the recording windows
by switching the code of torch's own function (``collect.windowed_hooks``), so no class changes: it
sees a module compiled in place (``model.compile()``) as it sees any other.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.stacks import call_site
from perfmagic.collect.torch_memory import SAMPLE_FORWARD, name_in_caller
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.collect.windowed_hooks import WindowedHooks

if TYPE_CHECKING:
    from perfmagic.collect.torch_hooks import TorchStages


def install_forward(stages: TorchStages, torch: Any, rec: StageRecorder, windowed: WindowedHooks) -> None:
    """Time the outermost module call as ``forward`` (in the windows, ``windowed``); note each top-level
    module once."""
    forward_id = rec.stage_id("forward")
    stats = stages.stats
    is_autocast, autocast_dtype = autocast_queries(torch)
    # one call where most forwards have no autocast (torch >= 2.4), else each device asked
    any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
    autocast_devices = ("cuda", "cpu")
    grad_enabled = torch.is_grad_enabled
    is_compiling = compiling_query(torch)
    seen = stages.seen
    active = rec.active
    kept = stages.kept
    record_model = _model_record(stages, torch)
    memory = stages.memory

    def wrapping(orig_call: Callable[..., Any]) -> Callable[..., Any]:
        def call(module: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                # a module inside the forward pass (most calls): one list read and on
                if active[forward_id] or is_compiling() or not rec.enter(forward_id):
                    return orig_call(module, *args, **kwargs)
                try:
                    stats["forwards"] += 1
                    sampled = False
                    if grad_enabled():
                        stats["grad_enabled_forwards"] += 1
                        sampled = stats["grad_enabled_forwards"] == SAMPLE_FORWARD and not memory.done
                    for device in autocast_devices if any_autocast() else ():
                        if is_autocast(device):
                            stats["autocast_forwards"] += 1
                            dtype = str(autocast_dtype(device)).replace("torch.", "")
                            key = f"{device}:{dtype}"
                            stats["autocast_dtypes"][key] = stats["autocast_dtypes"].get(key, 0) + 1
                            break
                    if sampled:  # one steady step's memory (collect.torch_memory)
                        result = memory.forward(orig_call, module, args, kwargs)
                    else:
                        result = orig_call(module, *args, **kwargs)
                    if id(module) not in seen:  # after the call: a lazy module's parameters exist
                        stages.record_once("model", record_model, module)
                    if kept.hold:
                        kept.inputs[id(module)] = (weakref.ref(module), args, kwargs)
                    return result
                finally:
                    rec.exit()
            except BaseException as e:
                drop_own_frame(e)
                raise

        return call

    windowed.set(torch.nn.Module, "__call__", wrapping)


def _model_record(stages: TorchStages, torch: Any) -> Callable[[Any], None]:
    """What notes a top-level module's set-up: the ``model`` mark."""
    timeline, now = stages.recorder.timeline, stages.now

    def record_model(module: Any) -> None:
        params = [q for q in module.parameters() if not torch.nn.parameter.is_lazy(q)]
        first = params[0] if params else None
        name = type(module).__name__
        caller = sys._getframe(1)
        timeline.add_mark(
            now(),
            "model",
            cls=name,
            variable=name_in_caller(module, caller),
            parameters=sum(int(q.numel()) for q in params),
            param_dtype=str(first.dtype).replace("torch.", "") if first is not None else None,
            device=str(first.device) if first is not None else None,
            data_parallel=isinstance(module, torch.nn.DataParallel),
            ddp=isinstance(module, torch.nn.parallel.DistributedDataParallel),
            compiled=name == "OptimizedModule" or hasattr(module, "_orig_mod"),
            training=bool(module.training),
            call_site=call_site(caller),  # where perfmagic.step() goes if nothing marks steps
        )

    return record_model


def autocast_queries(torch: Any) -> tuple[Callable[[str], bool], Callable[[str], Any]]:
    """``is_autocast_enabled(device)`` and ``get_autocast_dtype(device)``; before torch 2.4 each device
    had its own functions (``is_autocast_enabled()`` meant CUDA)."""
    dtype = getattr(torch, "get_autocast_dtype", None)
    if dtype is not None:
        return torch.is_autocast_enabled, dtype

    def enabled(device: str) -> bool:
        return bool(torch.is_autocast_enabled() if device == "cuda" else torch.is_autocast_cpu_enabled())

    def old_dtype(device: str) -> Any:
        return torch.get_autocast_gpu_dtype() if device == "cuda" else torch.get_autocast_cpu_dtype()

    return enabled, old_dtype


def compiling_query(torch: Any) -> Callable[[], bool]:
    """What says whether dynamo traces now: ``torch.compiler.is_dynamo_compiling`` (one call, where
    ``is_compiling`` makes two: the forward hook asks it every step), else ``is_compiling``; before
    torch 2.3, dynamo's own.

    ``torch._dynamo`` is looked up only where it is imported already: ``torch`` imports it on first
    access, 1.5 to 5 s, and code cannot be compiling while dynamo was never imported."""
    compiler = getattr(torch, "compiler", None)
    query = getattr(compiler, "is_dynamo_compiling", None) or getattr(compiler, "is_compiling", None)
    if query is not None:
        return cast("Callable[[], bool]", query)
    dynamo = vars(torch).get("_dynamo")
    if dynamo is not None:
        return cast("Callable[[], bool]", dynamo.is_compiling)

    def compiling_once_imported() -> bool:
        imported = vars(torch).get("_dynamo")
        return imported is not None and bool(imported.is_compiling())

    return compiling_once_imported
