"""Tensor methods of torch loops: host-to-device copies (``h2d``) and host-device syncs (``logging``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.torch_forward import compiling_query
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.collect.windowed_hooks import WindowedHooks

if TYPE_CHECKING:
    from perfmagic.collect.torch_hooks import TorchStages

_SYNC_METHODS = ("item", "tolist", "cpu", "numpy")


def non_blocking(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``Tensor.to``/``Tensor.cuda`` call asks for a non-blocking copy, by keyword or position.

    In every form (``to(device, dtype, non_blocking, copy)``, ``to(dtype, non_blocking, copy)``,
    ``to(tensor, non_blocking, copy)``, ``cuda(device, non_blocking)``) it is the first bool.
    """
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return next((a for a in args if isinstance(a, bool)), False)


def targets_cuda(args: tuple[Any, ...], kwargs: dict[str, Any], device_cls: Any, tensor_cls: Any) -> bool:
    """Whether a ``Tensor.to`` call's target (``device=``, or its first argument) is a CUDA device."""
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, str):
        return target.startswith("cuda")
    if isinstance(target, device_cls):
        return bool(target.type == "cuda")
    if isinstance(target, tensor_cls):
        return bool(target.is_cuda)
    return isinstance(target, int) and not isinstance(target, bool)


def install_tensor_methods(
    stages: TorchStages, torch: Any, rec: StageRecorder, p: Patcher, windowed: WindowedHooks
) -> None:
    """Time ``Tensor.to``/``cuda`` to a CUDA device as ``h2d`` (in the windows), and a CUDA tensor's
    ``item``, ``tolist``, ``cpu``, ``numpy`` and ``cuda.synchronize`` as ``logging`` (syncs are rare and
    long: on every step). Without CUDA there is nothing for them to record, and no hook goes in."""
    if not stages.cuda_available:
        return
    Tensor = torch.Tensor
    windowed.set(Tensor, "to", lambda orig: _copy_to_device(stages, torch, rec, orig, always_cuda=False))
    windowed.set(Tensor, "cuda", lambda orig: _copy_to_device(stages, torch, rec, orig, always_cuda=True))
    for name in _SYNC_METHODS:
        p.set(Tensor, name, _sync(stages, torch, rec, getattr(Tensor, name)))
    if torch.cuda.is_available():
        p.set(torch.cuda, "synchronize", rec.wrap(torch.cuda.synchronize, "logging"))


def _copy_to_device(stages: TorchStages, torch: Any, rec: StageRecorder, orig: Any, always_cuda: bool) -> Any:
    """``orig`` (``Tensor.to``, or ``Tensor.cuda`` where ``always_cuda``) with copies to CUDA in the windows
    as ``h2d``."""
    h2d_id = rec.stage_id("h2d")
    is_compiling = compiling_query(torch)
    stats = stages.stats
    Tensor = torch.Tensor
    device_cls = torch.device
    parameter_cls = torch.nn.Parameter

    def copy(t: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if (
                t.is_cuda
                # model.to("cuda") moves parameters once (Module._apply): set-up, not batch copies
                or isinstance(t, parameter_cls)
                or not (always_cuda or targets_cuda(args, kwargs, device_cls, Tensor))
                or is_compiling()
                or not rec.enter(h2d_id)
            ):
                return orig(t, *args, **kwargs)
            try:
                stats["h2d_copies"] += 1
                nbytes = t.numel() * t.element_size()
                stats["h2d_bytes"] += nbytes
                if t.is_pinned():
                    stats["h2d_pinned_bytes"] += nbytes
                if non_blocking(args, kwargs):
                    stats["h2d_non_blocking"] += 1
                return orig(t, *args, **kwargs)
            finally:
                rec.exit()
                stages.maybe_start_device_clock()
        except BaseException as e:
            drop_own_frame(e)
            raise

    return copy


def _sync(stages: TorchStages, torch: Any, rec: StageRecorder, orig: Any) -> Any:
    """``orig``, a tensor method that waits for the device, with its calls on CUDA tensors as ``logging``."""
    logging_id = rec.stage_id("logging")
    optimizer_id = rec.stage_id("optimizer")
    is_compiling = compiling_query(torch)
    stats = stages.stats

    def synced(t: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            # A sync inside the optimizer step (GradScaler's inf check) is the optimizer's time.
            if not t.is_cuda or is_compiling() or rec.is_open(optimizer_id) or not rec.enter(logging_id):
                return orig(t, *args, **kwargs)
            try:
                stats["syncs"] += 1
                return orig(t, *args, **kwargs)
            finally:
                rec.exit()
        except BaseException as e:
            drop_own_frame(e)
            raise

    return synced
