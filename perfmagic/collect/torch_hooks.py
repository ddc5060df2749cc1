"""PyTorch stage hooks: attribute a training loop's time to stages, no code change needed.

This module installs them and holds what they share; each family of stages has its module
(``torch_data``, ``torch_forward``, ``torch_tensors``, ``torch_optimizer``, ``torch_checkpoint``,
``torch_logging``, ``torch_comm``; backward is ``ddp``'s).

What is patched (and always put back by :meth:`TorchStages.uninstall`):

========== ==========================================================================
data       ``DataLoader.__iter__`` (worker start-up) and ``_BaseDataLoaderIter.__next__``
h2d        ``Tensor.to`` / ``Tensor.cuda`` from a non-CUDA tensor to a CUDA device
forward    the outermost module call: ``nn.Module.__call__``
backward   ``torch.autograd.backward`` (which ``Tensor.backward`` calls)
optimizer  each hooked optimizer class's ``step``, ``Optimizer.zero_grad``, ``Module.zero_grad``,
           ``GradScaler.step`` / ``unscale_`` (a step the scaler skips still ends a step)
checkpoint ``torch.save``, ``safetensors.torch.save_file`` / ``save_model``
logging    ``print``, ``logging.Logger.handle``, writes to ``sys.stdout``/``sys.stderr``,
           TensorBoard ``SummaryWriter.add_*`` (torch and tensorboardX), tqdm bars, and host-device
           syncs: ``item``/``tolist``/``cpu``/``numpy`` of CUDA tensors, ``cuda.synchronize``
comm       ``torch.distributed`` collectives; inside backward, DDP's wait for its gradient reduction
           (``collect.ddp``)
========== ==========================================================================

Steps end as ``perfmagic.step_policy`` says: at each (outermost) optimizer step, else at each
DataLoader batch, else at each backward pass. A DataLoader pass that trained nothing (no optimizer
step, no forward with grad: an evaluation) marks its end, so that it stays out of the training
steps. On CUDA, a :class:`CudaEventClock` times stage boundaries on the device, so a stage lasts
until the GPU has finished the work queued in it.

The hooks that run several times a step (``__next__``, the module call, backward, ``zero_grad``) are
in place only in the steps the schedule records fully (``collect.schedule``): the recorder takes them
out and puts them back at step ends (``StageRecorder.record_in_windows``), by switching the code of
torch's functions, never a class (``collect.windowed_hooks``). ``Tensor.to``/``cuda`` are C methods,
with no code to switch: their wrappers stay and record only in the windows. The others stay for the
whole profile. Without CUDA the tensor methods are not hooked at all: there is no copy to a device or
sync to record.

Inside ``torch.compile``'s tracing the wrappers only call through: anything else would break the graph.
An exception passes through each wrapper without its frame (``collect.tracebacks``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmagic.collect.cuda import CudaEventClock
from perfmagic.collect.ddp import ReducerWait
from perfmagic.collect.evaluation import EvaluationPasses
from perfmagic.collect.imports import PostImportHook, when_imported
from perfmagic.collect.kept_objects import KeptObjects
from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.torch_checkpoint import CheckpointTiming
from perfmagic.collect.torch_comm import install_comm, note_rank
from perfmagic.collect.torch_data import install_data
from perfmagic.collect.torch_forward import install_forward
from perfmagic.collect.torch_logging import install_logging
from perfmagic.collect.torch_memory import MemoryProbe
from perfmagic.collect.torch_optimizer import install_grad_scaler, install_optimizer
from perfmagic.collect.torch_tensors import install_tensor_methods
from perfmagic.collect.windowed_hooks import WindowedHooks
from perfmagic.contract.marks import no_counters


class TorchStages:
    """Installs the stage hooks on torch; :meth:`uninstall` removes every one. The hooks share its state."""

    def __init__(self, recorder: StageRecorder, evaluation: EvaluationPasses | None = None) -> None:
        self.recorder = recorder
        self._patcher = Patcher()
        # the hooks that run several times a step (fetches, forward, backward, zero_grad): in place in the
        # steps the schedule records fully (``collect.schedule``), out of the others
        self.windowed = WindowedHooks()
        self.handles: list[Any] = []  # torch's hook handles, removed at uninstall
        self.torch: Any = None
        self.seen: set[int] = set()  # ids of the objects whose set-up was noted
        self.kept = KeptObjects()
        self.memory = MemoryProbe(self)  # one sampled step's memory (collect.torch_memory)
        self.warnings: list[str] = []
        self.evaluation = evaluation if evaluation is not None else EvaluationPasses(recorder)
        self.checkpoints = CheckpointTiming(recorder, self.evaluation, self.now)
        # ids of the optimizers that stepped since the last step end or batch: a second optimizer
        # stepping in the same iteration (a GAN's generator after its discriminator) ends no step
        self.stepped: set[int] = set()
        self._device_clock_failed = False
        self._dynamo_import: PostImportHook | None = None  # skips the hooks' frames once dynamo is imported
        self.cuda_available = False  # asked once, at install: the hooks that start the clock run every step
        self.stats = no_counters()

    def install(self) -> None:
        import torch

        self.torch = torch
        self.cuda_available = bool(torch.cuda.is_available())
        rec = self.recorder
        p, windowed = self._patcher, self.windowed
        self._record_environment()
        try:
            install_data(self, torch, rec, p, windowed)
            install_forward(self, torch, rec, windowed)
            install_tensor_methods(self, torch, rec, p, windowed)
            ReducerWait(torch, rec).install(windowed)  # backward, with DDP's gradient reduction as comm
            install_optimizer(self, torch, rec, p, windowed)
            install_grad_scaler(self, torch, rec, p)
            self.checkpoints.install(torch, p)
            install_logging(rec, p)
            install_comm(torch, rec, p)
        except BaseException:
            self.uninstall()
            raise
        hooks = [*p.values(), *windowed.functions()]
        # dynamo is imported (1.5 to 5 s) by the code that compiles, never by perfmagic
        self._dynamo_import = when_imported(
            "torch._dynamo", lambda dynamo: _not_compiled_alone(dynamo, hooks)
        )
        self.maybe_start_device_clock()
        rec.record_in_windows(self._record_fully)

    def _record_fully(self, full: bool) -> list[str]:
        """Put the windowed hooks in (``full``) or take them out, at a step end; returns warnings."""
        return self.windowed.switch(full)

    def uninstall(self) -> list[str]:
        """Remove every hook and patch; returns warnings."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self._dynamo_import is not None:
            self._dynamo_import.remove()
            self._dynamo_import = None
        warnings = [*self.windowed.restore(), *self._patcher.restore()]
        self.memory.close()
        if self.torch is not None:
            # the loop may have called set_num_threads after import: what it trained with is this
            self.stats["num_threads"] = self.torch.get_num_threads()
            self.recorder.timeline.add_mark(self.now(), "torch_stats", **self.stats)
        return [*self.warnings, *warnings]

    def record_once(self, kind: str, record: Callable[[Any], None], obj: Any) -> None:
        """``record(obj)`` once per object, which is kept as a ``kind`` met (:class:`KeptObjects`): what
        the hooks note of the user's objects never raises into their code."""
        if id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        self.kept.meet(kind, obj)
        try:
            record(obj)
        except Exception as e:
            self.warnings.append(f"could not record the set-up of a {type(obj).__name__} ({e!r})")

    def _record_environment(self) -> None:
        torch = self.torch
        cuda = torch.cuda.is_available()
        self.recorder.timeline.meta["torch"] = {
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "cuda_available": cuda,
            "cuda_device_count": torch.cuda.device_count() if cuda else 0,
            "num_threads": torch.get_num_threads(),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "distributed": bool(torch.distributed.is_available() and torch.distributed.is_initialized()),
        }
        if torch.distributed.is_available():
            note_rank(torch.distributed, self.recorder)

    def maybe_start_device_clock(self) -> None:
        """Time stages on the device too, once CUDA is in use (called from hooks: must not raise)."""
        torch = self.torch
        if (
            self.cuda_available
            and self.recorder.device_clock is None
            and not self._device_clock_failed
            and torch.cuda.is_initialized()
        ):
            try:
                self.recorder.device_clock = CudaEventClock(torch, self.recorder.origin, self.recorder.clock)
            except Exception as e:
                self._device_clock_failed = True
                self.warnings.append(f"no CUDA event clock ({e!r}): stages are timed on the host only")

    def now(self) -> float:
        """Seconds on the timeline's clock."""
        return self.recorder.clock.now() - self.recorder.origin


def _not_compiled_alone(dynamo: Any, hooks: list[Any]) -> None:
    """Dynamo must never compile a hook as a frame of its own, only trace through it.

    A hook called while dynamo's frame callback is on (inside ``model.compile()``'s call, say)
    was compiled once per module type (its guards check ``type(module)``): graphs the user never
    had, recompiles, and no stage recorded in them. Skipped as a frame, like torch's own
    ``Module.__call__``, it runs as written and what it calls is compiled as without perfmagic.
    """
    skip_code = getattr(getattr(dynamo, "eval_frame", None), "skip_code", None)
    if skip_code is None:
        return
    for hook in hooks:
        code = getattr(hook, "__code__", None)
        if code is not None:
            skip_code(code)
