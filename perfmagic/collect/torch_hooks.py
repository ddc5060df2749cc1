"""PyTorch stage hooks: attribute a training loop's time to stages, no code change needed.

What is patched (and always put back by :meth:`TorchStages.uninstall`):

========== ==========================================================================
data       ``DataLoader.__iter__`` (worker start-up) and ``_BaseDataLoaderIter.__next__``
h2d        ``Tensor.to`` / ``Tensor.cuda`` from a non-CUDA tensor to a CUDA device
forward    the outermost ``nn.Module.__call__``
backward   ``torch.autograd.backward`` (which ``Tensor.backward`` calls)
optimizer  the global optimizer step hooks, ``Optimizer.zero_grad``, ``Module.zero_grad``,
           ``GradScaler.step`` / ``unscale_`` (a step the scaler skips still ends a step)
checkpoint ``torch.save``, ``safetensors.torch.save_file`` / ``save_model``
logging    ``print``, ``logging.Logger.handle``, writes to ``sys.stdout``/``sys.stderr``,
           TensorBoard ``SummaryWriter.add_*`` (torch and tensorboardX), tqdm bars, and host-device
           syncs: ``item``/``tolist``/``cpu``/``numpy`` of CUDA tensors, ``cuda.synchronize``
comm       ``torch.distributed`` collectives; inside backward, DDP's wait for its gradient reduction
           (``collect.ddp``)
========== ==========================================================================

``nn.Module.__call__`` is patched at the class rather than through the global
module hooks: global hooks push every module off PyTorch's hook-free fast path,
which costs more than the whole recorder on small models.

Steps end as ``perfmagic.step_policy`` says: at each (outermost) optimizer step, else at each
DataLoader batch, else at each backward pass. A DataLoader pass that trained nothing (no optimizer
step, no forward with grad: an evaluation) marks its end, so that it stays out of the training
steps. On CUDA, a :class:`CudaEventClock` times stage boundaries on the device, so a stage lasts
until the GPU has finished the work queued in it.

Inside ``torch.compile``'s tracing the wrappers only call through: anything else would break the graph.
An exception passes through each wrapper without its frame (``collect.tracebacks``).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib.util
import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

from perfmagic.collect.cuda import CudaEventClock
from perfmagic.collect.ddp import ReducerWait
from perfmagic.collect.evaluation import EvaluationPasses
from perfmagic.collect.loaders import loader_settings
from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.saves import rebind_copies, safetensors_torch, saved_size, saved_what
from perfmagic.collect.stacks import call_site
from perfmagic.collect.threadclock import cpu_only_reading
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.schema import (
    THREAD_DATA_CPU,
    THREAD_DATA_TIMED,
    THREAD_DATA_WAIT,
    THREAD_SAMPLES,
    THREAD_TOKENS,
)

_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
    "monitored_barrier",
)

_PROGRESS_BARS = (("tqdm.std", "tqdm"), ("tqdm.notebook", "tqdm_notebook"), ("tqdm.rich", "tqdm_rich"))
"""tqdm classes whose ``display`` draws the bar, patched when the profiled code already imported them."""

_SYNC_METHODS = ("item", "tolist", "cpu", "numpy")

DATA_CPU_EVERY_S = 0.01
"""Shortest time between the starts of two fetches whose CPU time is measured (``THREAD_DATA_CPU``)."""


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


def torch_available() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


class TorchStages:
    """Installs the stage hooks on torch; :meth:`uninstall` removes every one."""

    def __init__(self, recorder: StageRecorder, evaluation: EvaluationPasses | None = None) -> None:
        self.recorder = recorder
        self._patcher = Patcher()
        self._handles: list[Any] = []
        self._torch: Any = None
        self._seen: set[int] = set()
        # for tuning (``keep_inputs``): the loaders, models and optimizers met, and each top-level
        # module's last inputs; weak where it can be, so that nothing lives longer for perfmagic
        self.keep_inputs = False
        self.met: dict[str, list[Callable[[], Any]]] = {}
        self.inputs: dict[int, tuple[weakref.ref[Any], tuple[Any, ...], dict[str, Any]]] = {}
        self.warnings: list[str] = []
        self.evaluation = evaluation if evaluation is not None else EvaluationPasses(recorder)
        # ids of the optimizers that stepped since the last step end or batch: a second optimizer
        # stepping in the same iteration (a GAN's generator after its discriminator) ends no step
        self._stepped: set[int] = set()
        # bytes each save wrote inside a framework's checkpoint routine (None outside one)
        self._inner_saves: list[int | None] | None = None
        self._device_clock_failed = False
        self._cuda_available = False  # asked once, at install: the hooks that start the clock run every step
        self.stats: dict[str, Any] = {
            "forwards": 0,
            "autocast_forwards": 0,
            "autocast_dtypes": {},
            "grad_enabled_forwards": 0,
            "h2d_copies": 0,
            "h2d_bytes": 0,
            "h2d_pinned_bytes": 0,
            "h2d_non_blocking": 0,
            "syncs": 0,
            "optimizer_steps": 0,
            "batches": 0,
        }

    # -- install / uninstall ---------------------------------------------

    def install(self) -> None:
        import torch

        self._torch = torch
        self._cuda_available = bool(torch.cuda.is_available())
        rec = self.recorder
        p = self._patcher
        self._record_environment()
        try:
            self._install_data(torch, rec, p)
            self._install_forward(torch, rec, p)
            self._install_tensor_methods(torch, rec, p)
            ReducerWait(torch, rec).install(p)  # backward, with DDP's gradient reduction as comm
            self._install_optimizer(torch, rec, p)
            self._install_grad_scaler(torch, rec, p)
            self._install_checkpoint(torch, rec, p)
            self._install_logging(rec, p)
            self._install_comm(torch, rec, p)
        except BaseException:
            self.uninstall()
            raise
        _not_compiled_alone(torch, p.values())
        self._maybe_start_device_clock()

    def uninstall(self) -> list[str]:
        """Remove every hook and patch; returns warnings."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        warnings = self._patcher.restore()
        if self._torch is not None:
            # the loop may have called set_num_threads after import: what it trained with is this
            self.stats["num_threads"] = self._torch.get_num_threads()
            self.recorder.timeline.add_mark(self._now(), "torch_stats", **self.stats)
        return [*self.warnings, *warnings]

    def tuning_objects(self) -> dict[str, Any]:
        """What tuning needs of what the window met: ``loader`` (the largest), ``model`` (the top-level
        module with the most parameters) with its last ``batch`` (args, kwargs), its ``optimizer``."""
        alive = {k: [o for r in refs if (o := r()) is not None] for k, refs in self.met.items()}
        found: dict[str, Any] = {}
        loaders = alive.get("_record_loader", [])
        if loaders:
            found["loader"] = max(loaders, key=_dataset_len)
        called = [(m, args, kwargs) for ref, args, kwargs in self.inputs.values() if (m := ref()) is not None]
        if called:
            model, args, kwargs = max(called, key=lambda c: sum(p.numel() for p in c[0].parameters()))
            found["model"], found["batch"] = model, (args if not kwargs else kwargs if not args else None)
            own = {id(p) for p in model.parameters()}
            found["optimizer"] = next(
                (
                    o
                    for o in alive.get("_record_optimizer", [])
                    if any(id(p) in own for g in o.param_groups for p in g["params"])
                ),
                None,
            )
        return found

    def _record_once(self, record: Callable[[Any], None], obj: Any) -> None:
        """``record(obj)`` once per object: what the hooks note of the user's objects never raises into their code."""
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if self.keep_inputs:  # kept alive for tuning: `for x in DataLoader(...)` holds its loader nowhere
            self.met.setdefault(record.__name__, []).append(_Strong(obj))
        else:
            with contextlib.suppress(TypeError):  # an object without weak references is not kept
                self.met.setdefault(record.__name__, []).append(weakref.ref(obj))
        try:
            record(obj)
        except Exception as e:
            self.warnings.append(f"could not record the set-up of a {type(obj).__name__} ({e!r})")

    # -- environment -----------------------------------------------------

    def _record_environment(self) -> None:
        torch = self._torch
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
            _note_rank(torch.distributed, self.recorder)

    def _maybe_start_device_clock(self) -> None:
        """Time stages on the device too, once CUDA is in use (called from hooks: must not raise)."""
        torch = self._torch
        if (
            self._cuda_available
            and self.recorder.device_clock is None
            and not self._device_clock_failed
            and torch.cuda.is_initialized()
        ):
            try:
                self.recorder.device_clock = CudaEventClock(torch, self.recorder.origin, self.recorder.clock)
            except Exception as e:
                self._device_clock_failed = True
                self.warnings.append(f"no CUDA event clock ({e!r}): stages are timed on the host only")

    def _now(self) -> float:
        return self.recorder.clock.now() - self.recorder.origin

    # -- data ------------------------------------------------------------

    def _install_data(self, torch: Any, rec: StageRecorder, p: Patcher) -> None:
        from torch.utils.data import dataloader as dl

        data_id = rec.stage_id("data")
        orig_next = dl._BaseDataLoaderIter.__next__
        orig_iter = dl.DataLoader.__iter__
        stats = self.stats
        boundary = rec.boundary
        add_sample, perf_counter, origin = rec.timeline.add_sample, rec.clock.now, rec.origin
        thread_clock = rec.thread_clock.read if rec.thread_clock else cpu_only_reading  # (CPU, run-queue) s
        # a sample each batch: the series' own appends, not a method call (taken at the first batch counted:
        # a loop whose batches have no size has no series)
        appends_samples: list[Callable[[float], None]] = []
        now = self._now
        # id(iterator) -> when its pass began and what had trained by then (optimizer steps, forwards with grad)
        passes: dict[int, tuple[float, int, int]] = {}
        # CPU, wall and run-queue seconds of the fetches timed, and when the last one began: against each
        # other they tell CPU demand (the training thread's own loading, taking batches over from workers, or
        # waiting for a CPU) from blocked waiting. A clock read is a system call that costs a fast loop:
        # fetches are timed DATA_CPU_EVERY_S apart.
        timed = [0.0, 0.0, -DATA_CPU_EVERY_S, 0.0]
        counted = [0, 0]  # samples and tokens taken so far: throughput as the frameworks log it
        Tensor = torch.Tensor

        evaluation, stepped = self.evaluation, self._stepped

        def next_batch(it: Any) -> Any:
            boundary("batch")
            stepped.clear()  # a batch between two optimizer steps: they are two iterations
            entered = rec.enter(data_id)
            began = perf_counter()
            cpu = thread_clock() if entered and began - timed[2] >= DATA_CPU_EVERY_S else None
            try:
                batch = orig_next(it)
            except StopIteration:
                boundary("loader_end")  # this fetch found the epoch over: it starts no step
                began_pass = passes.pop(id(it), None)
                trained = (stats["optimizer_steps"], stats["grad_enabled_forwards"])
                if began_pass is not None and began_pass[1:] == trained:  # trained nothing: an evaluation
                    evaluation.seen(began_pass[0])
                raise
            except BaseException as e:
                drop_own_frame(e)
                raise
            finally:
                if entered:
                    rec.exit()
                    if cpu is not None:
                        on_cpu, waiting = thread_clock()
                        timed[0] += on_cpu - cpu[0]
                        timed[1] += perf_counter() - began
                        timed[2], timed[3] = began, timed[3] + waiting - cpu[1]
                        t = now()
                        add_sample(THREAD_DATA_CPU, t, timed[0])
                        add_sample(THREAD_DATA_TIMED, t, timed[1])
                        add_sample(THREAD_DATA_WAIT, t, timed[3])
            stats["batches"] += 1
            size = batch_size(batch, Tensor)
            if size is not None:
                t = perf_counter() - origin
                counted[0] += size[0]
                if not appends_samples:
                    appends_samples.extend(rec.timeline.sample_appenders(THREAD_SAMPLES))
                appends_samples[0](t)
                appends_samples[1](counted[0])
                if size[1]:
                    counted[1] += size[1]
                    add_sample(THREAD_TOKENS, t, counted[1])
            return batch

        p.set(dl._BaseDataLoaderIter, "__next__", next_batch)
        p.set(dl.DataLoader, "__iter__", self._start_iter(orig_iter, data_id, passes))

    def _start_iter(
        self, orig_iter: Callable[[Any], Any], data_id: int, passes: dict[int, tuple[float, int, int]]
    ) -> Callable[[Any], Any]:
        """``DataLoader.__iter__``: its worker start-up as ``data``, and when each pass began (``passes``)."""
        rec, stats, now = self.recorder, self.stats, self._now

        def start_iter(loader: Any) -> Any:
            self._record_once(self._record_loader, loader)
            entered = rec.enter(data_id)
            try:
                it = orig_iter(loader)
            except BaseException as e:
                drop_own_frame(e)
                raise
            finally:
                if entered:
                    rec.exit()
            passes[id(it)] = (now(), stats["optimizer_steps"], stats["grad_enabled_forwards"])
            return it

        return start_iter

    def _record_loader(self, loader: Any) -> None:
        settings = loader_settings(loader, self._torch, sys._getframe(2))  # 2: the loop's `for`, or above
        self.recorder.timeline.add_mark(self._now(), "dataloader", **settings)

    # -- forward ---------------------------------------------------------

    def _install_forward(self, torch: Any, rec: StageRecorder, p: Patcher) -> None:
        forward_id = rec.stage_id("forward")
        orig_call = torch.nn.Module.__call__
        stats = self.stats
        is_autocast, autocast_dtype = _autocast_queries(torch)
        # one call where most forwards have no autocast (torch >= 2.4), else each device asked
        any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
        autocast_devices = ("cuda", "cpu")
        grad_enabled = torch.is_grad_enabled
        is_compiling = _is_compiling(torch)
        seen = self._seen
        active = rec.active

        def call(module: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                # a module inside the forward pass (most calls): one list read and on
                if active[forward_id] or is_compiling() or not rec.enter(forward_id):
                    return orig_call(module, *args, **kwargs)
                try:
                    stats["forwards"] += 1
                    if grad_enabled():
                        stats["grad_enabled_forwards"] += 1
                    for device in autocast_devices if any_autocast() else ():
                        if is_autocast(device):
                            stats["autocast_forwards"] += 1
                            dtype = str(autocast_dtype(device)).replace("torch.", "")
                            key = f"{device}:{dtype}"
                            stats["autocast_dtypes"][key] = stats["autocast_dtypes"].get(key, 0) + 1
                            break
                    result = orig_call(module, *args, **kwargs)
                    if id(module) not in seen:  # after the call: a lazy module's parameters exist
                        self._record_once(self._record_model, module)
                    if self.keep_inputs:
                        self.inputs[id(module)] = (weakref.ref(module), args, kwargs)
                    return result
                finally:
                    rec.exit()
            except BaseException as e:
                drop_own_frame(e)
                raise

        p.set(torch.nn.Module, "__call__", call)

    def _record_model(self, module: Any) -> None:
        torch = self._torch
        params = [q for q in module.parameters() if not torch.nn.parameter.is_lazy(q)]
        first = params[0] if params else None
        name = type(module).__name__
        self.recorder.timeline.add_mark(
            self._now(),
            "model",
            cls=name,
            parameters=sum(int(q.numel()) for q in params),
            param_dtype=str(first.dtype).replace("torch.", "") if first is not None else None,
            device=str(first.device) if first is not None else None,
            data_parallel=isinstance(module, torch.nn.DataParallel),
            ddp=isinstance(module, torch.nn.parallel.DistributedDataParallel),
            compiled=name == "OptimizedModule" or hasattr(module, "_orig_mod"),
            training=bool(module.training),
            call_site=call_site(sys._getframe(1)),  # where perfmagic.step() goes if nothing marks steps
        )

    # -- tensor methods: h2d and syncs -----------------------------------

    def _install_tensor_methods(self, torch: Any, rec: StageRecorder, p: Patcher) -> None:
        h2d_id = rec.stage_id("h2d")
        logging_id = rec.stage_id("logging")
        optimizer_id = rec.stage_id("optimizer")
        is_compiling = _is_compiling(torch)
        stats = self.stats
        Tensor = torch.Tensor
        device_cls = torch.device
        now = self._now
        add_mark = rec.timeline.add_mark
        parameter_cls = torch.nn.Parameter

        def copy_to_device(orig: Any, always_cuda: bool) -> Any:
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
                        self._maybe_start_device_clock()
                except BaseException as e:
                    drop_own_frame(e)
                    raise

            return copy

        def sync(orig: Any, name: str) -> Any:
            def synced(t: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    # A sync inside the optimizer step (GradScaler's inf check) is the optimizer's time.
                    if (
                        not t.is_cuda
                        or is_compiling()
                        or rec.is_open(optimizer_id)
                        or not rec.enter(logging_id)
                    ):
                        return orig(t, *args, **kwargs)
                    try:
                        stats["syncs"] += 1
                        add_mark(now(), "sync", op=name)
                        return orig(t, *args, **kwargs)
                    finally:
                        rec.exit()
                except BaseException as e:
                    drop_own_frame(e)
                    raise

            return synced

        p.set(Tensor, "to", copy_to_device(Tensor.to, always_cuda=False))
        p.set(Tensor, "cuda", copy_to_device(Tensor.cuda, always_cuda=True))
        for name in _SYNC_METHODS:
            p.set(Tensor, name, sync(getattr(Tensor, name), name))
        if torch.cuda.is_available():
            p.set(torch.cuda, "synchronize", rec.wrap(torch.cuda.synchronize, "logging"))

    # -- optimizer -------------------------------------------------------

    def _install_optimizer(self, torch: Any, rec: StageRecorder, p: Patcher) -> None:
        from torch.optim import optimizer as opt_mod

        optimizer_id = rec.stage_id("optimizer")
        open_steps: list[bool] = []
        stats = self.stats
        guarded: set[type] = set()

        def guard(cls: type) -> None:
            """Close what a ``step`` that raised left open (its post hook never runs)."""
            step = cls.__dict__["step"]

            def guarded_step(*args: Any, **kwargs: Any) -> Any:
                depth = len(open_steps)
                try:
                    return step(*args, **kwargs)
                except BaseException as e:
                    drop_own_frame(e)
                    raise
                finally:
                    while len(open_steps) > depth:
                        if open_steps.pop():
                            rec.exit()

            guarded_step.hooked = True  # type: ignore[attr-defined]  # torch must not wrap it again
            guarded_step.__wrapped__ = step  # type: ignore[attr-defined]
            p.set(cls, "step", guarded_step)
            guarded.add(cls)

        stepped = self._stepped
        other_id = rec.stage_id("other")

        seen = self._seen
        maybe_start_device_clock = self._maybe_start_device_clock if self._cuda_available else None

        def pre(optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, dict[str, Any]] | None:
            if id(optimizer) not in seen:
                self._record_once(self._record_optimizer, optimizer)
            cls = type(optimizer)
            if cls not in guarded and "step" in cls.__dict__:
                guard(cls)
            outermost = not open_steps
            open_steps.append(rec.enter(optimizer_id))
            if not outermost:
                return None
            # The last step ended is held back until now: another optimizer's step in the same
            # iteration (no batch fetched since) continues it; the same optimizer again starts a new one.
            if id(optimizer) in stepped:
                rec.release_held()
                stepped.clear()
            else:
                rec.drop_held()
            stepped.add(id(optimizer))
            # torch hands the hooks the step's own arguments: (optimizer, closure?, ...)
            if len(args) < 2 and not kwargs:  # no closure: most loops, every step
                return None
            return _with_timed_closure(args, kwargs, rec, other_id)

        def post(optimizer: Any, args: Any, kwargs: Any) -> None:
            if open_steps and open_steps.pop():
                rec.exit()
            if open_steps:
                # A step inside a step (a subclass calling super().step(), a wrapping optimizer):
                # the training step ends once, with the outermost.
                return
            stats["optimizer_steps"] += 1
            rec.boundary("optimizer", hold=True)
            if maybe_start_device_clock is not None:
                maybe_start_device_clock()

        # Classes torch already hooked (their instances exist): guard them before their first step.
        for cls in _subclasses(torch.optim.Optimizer):
            if getattr(cls.__dict__.get("step"), "hooked", False):
                guard(cls)
        self._handles.append(opt_mod.register_optimizer_step_pre_hook(pre))
        self._handles.append(opt_mod.register_optimizer_step_post_hook(post))
        p.set(torch.optim.Optimizer, "zero_grad", rec.wrap(torch.optim.Optimizer.zero_grad, "optimizer"))
        p.set(torch.nn.Module, "zero_grad", rec.wrap(torch.nn.Module.zero_grad, "optimizer"))

    def _install_grad_scaler(self, torch: Any, rec: StageRecorder, p: Patcher) -> None:
        scaler_cls = getattr(torch.amp, "GradScaler", None)  # torch >= 2.3; torch.cuda.amp's subclasses it
        if scaler_cls is None:
            return
        optimizer_id = rec.stage_id("optimizer")
        orig_step = scaler_cls.step
        stats = self.stats

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

    def _record_optimizer(self, optimizer: Any) -> None:
        defaults = optimizer.defaults
        self.recorder.timeline.add_mark(
            self._now(),
            "optimizer",
            cls=type(optimizer).__name__,
            foreach=defaults.get("foreach"),
            fused=defaults.get("fused"),
            parameters=sum(int(q.numel()) for g in optimizer.param_groups for q in g["params"]),
        )

    # -- checkpoint ------------------------------------------------------

    def _install_checkpoint(self, torch: Any, rec: StageRecorder, p: Patcher) -> None:
        saves: dict[Any, Any] = {torch.save: self._timed_save(torch.save, "torch.save")}
        p.set(torch, "save", saves[torch.save])
        st = safetensors_torch()
        for name in ("save_file", "save_model") if st is not None else ():
            orig = getattr(st, name)
            saves[orig] = self._timed_save(orig, f"safetensors.torch.{name}")
            p.set(st, name, saves[orig])
        rebind_copies(saves, p)

    def _timed_save(self, orig: Any, label: str) -> Any:
        rec = self.recorder
        checkpoint_id = rec.stage_id("checkpoint")
        evaluation = self.evaluation

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

    def run_checkpoint_routine(
        self, orig: Callable[..., Any], label: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``orig(*args, **kwargs)``, a framework's whole checkpoint routine (model, optimizer, scheduler
        and RNG state, its own files, the rotation of old checkpoints), recorded as one ``checkpoint``;
        the size of a checkpoint is what the saves inside it wrote."""
        rec = self.recorder
        try:
            if not rec.enter(rec.stage_id("checkpoint")):
                return orig(*args, **kwargs)
            self.evaluation.checkpoint_starts()
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

    # -- logging ---------------------------------------------------------

    def _install_logging(self, rec: StageRecorder, p: Patcher) -> None:
        p.set(builtins, "print", rec.wrap(builtins.print, "logging"))
        p.set(logging.Logger, "handle", rec.wrap(logging.Logger.handle, "logging"))
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None:
                p.set(sys, name, _TimedStream(stream, rec))
        writers = []
        if "torch.utils.tensorboard" in sys.modules:
            writers.append(sys.modules["torch.utils.tensorboard"].SummaryWriter)
        if "tensorboardX" in sys.modules:
            writers.append(sys.modules["tensorboardX"].SummaryWriter)
        for cls in writers:
            for attr in dir(cls):
                if attr.startswith("add_") or attr == "flush":
                    p.set(cls, attr, rec.wrap(getattr(cls, attr), "logging"))
        # A progress bar made before profiling holds the original stderr: time its drawing itself.
        for module, cls_name in _PROGRESS_BARS:
            bar = getattr(sys.modules.get(module), cls_name, None)
            if bar is not None and "display" in vars(bar):
                p.set(bar, "display", rec.wrap(bar.display, "logging"))

    # -- comm ------------------------------------------------------------

    def _install_comm(self, torch: Any, rec: StageRecorder, p: Patcher) -> None:
        if not torch.distributed.is_available():
            return
        dist = torch.distributed
        for name in _COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None:
                p.set(dist, name, rec.wrap(fn, "comm"))
        init = dist.init_process_group

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            try:
                result = init(*args, **kwargs)
                _note_rank(dist, rec)
                return result
            except BaseException as e:
                drop_own_frame(e)
                raise

        p.set(dist, "init_process_group", functools.wraps(init)(init_process_group))


def _with_timed_closure(
    args: Any, kwargs: Any, rec: StageRecorder, other_id: int
) -> tuple[Any, dict[str, Any]] | None:
    """An optimizer step's arguments with its closure timed: a closure (Lightning runs ``training_step``
    in one, LBFGS re-evaluates the loss) is not the optimizer's time: inside it, what is no forward or
    backward is ``other``."""
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
    if closure is None or not callable(closure):
        return None
    enter, exit_ = rec.enter, rec.exit

    def timed_closure(*a: Any, **k: Any) -> Any:
        try:
            if not enter(other_id):
                return closure(*a, **k)
            try:
                return closure(*a, **k)
            finally:
                exit_()
        except BaseException as e:
            drop_own_frame(e)
            raise

    if "closure" in kwargs:
        return args, {**kwargs, "closure": timed_closure}
    return (args[0], timed_closure, *args[2:]), kwargs


def _note_rank(dist: Any, rec: StageRecorder) -> None:
    """The process's rank where its environment did not say (``torch.multiprocessing.spawn`` workers pass
    it to ``init_process_group``): the rank in the report is the job's, not an order of processes."""
    meta = rec.timeline.meta
    if meta.get("rank") is None and dist.is_initialized():
        meta["rank"], meta["world_size"] = dist.get_rank(), dist.get_world_size()


class _TimedStream:
    """A text stream proxy whose writes are recorded as the ``logging`` stage."""

    def __init__(self, stream: Any, recorder: StageRecorder) -> None:
        self._stream = stream
        self.write = recorder.wrap(stream.write, "logging")
        self.flush = recorder.wrap(stream.flush, "logging")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return list(dict.fromkeys(found))


class _Strong:
    """A reference called like a weak one."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


def batch_size(batch: Any, tensor_cls: Any) -> tuple[int, int] | None:
    """(samples, token ids) of a batch: the leading dimension of its ``input_ids`` or first tensor, and
    the ids in ``input_ids`` (or in its one 2-D integer tensor: a sequence batch); None without a tensor.

    Runs on every batch: one pass over the batch's values, the dtype asked of 2-D tensors only.
    """
    if isinstance(batch, dict):
        ids = batch.get("input_ids")
        if isinstance(ids, tensor_cls) and ids.dim() == 2:
            return int(ids.shape[0]), int(ids.numel())
        values: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        values = (batch,)
    first = None
    first_is_ids = False
    id_tensors = 0
    for v in values:
        if not isinstance(v, tensor_cls):
            continue
        shape = v.shape
        if not shape:
            continue
        is_ids = len(shape) == 2 and not v.is_floating_point() and not v.is_complex()
        id_tensors += is_ids
        if first is None:
            first, first_is_ids = v, is_ids
    if first is None:
        return None
    return int(first.shape[0]), int(first.numel()) if first_is_ids and id_tensors == 1 else 0


def _dataset_len(loader: Any) -> int:
    try:
        return len(loader.dataset)
    except Exception:  # no __len__, or one that raises
        return 0


def _autocast_queries(torch: Any) -> tuple[Callable[[str], bool], Callable[[str], Any]]:
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


def _not_compiled_alone(torch: Any, hooks: list[Any]) -> None:
    """Dynamo must never compile a hook as a frame of its own, only trace through it.

    A hook called while dynamo's frame callback is on (inside ``model.compile()``'s call, say)
    was compiled once per module type (its guards check ``type(module)``): graphs the user never
    had, recompiles, and no stage recorded in them. Skipped as a frame, like torch's own
    ``Module.__call__``, it runs as written and what it calls is compiled as without perfmagic.
    """
    skip_code = getattr(getattr(getattr(torch, "_dynamo", None), "eval_frame", None), "skip_code", None)
    if skip_code is None:
        return
    for hook in hooks:
        code = getattr(hook, "__code__", None)
        if code is not None:
            skip_code(code)


def _is_compiling(torch: Any) -> Callable[[], bool]:
    """True while dynamo traces: ``torch.compiler.is_dynamo_compiling`` (one call, where ``is_compiling``
    makes two: the forward hook asks it every step), else ``is_compiling``; before torch 2.3, dynamo's own."""
    compiler = getattr(torch, "compiler", None)
    dynamo = getattr(torch, "_dynamo", None)
    return (
        getattr(compiler, "is_dynamo_compiling", None)
        or getattr(compiler, "is_compiling", None)
        or getattr(dynamo, "is_compiling", None)
        or (lambda: False)
    )
