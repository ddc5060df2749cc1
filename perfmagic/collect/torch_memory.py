"""Where the memory goes, on one sampled training step: parameters, gradients, optimizer state,
activations saved for backward, and the peak with the stage it fell in.

Only one forward is sampled (the :data:`SAMPLE_FORWARD`-th with gradients, a steady step): it runs under
``torch.autograd.graph.saved_tensors_hooks`` that note each storage autograd keeps, and with the model's blocks
timed; every other call goes through untouched. From that forward until the step ends
(the optimizer's step; without one, the end of the step after it), a thread reads the memory in use about every
millisecond, with the stage the training thread is in: the caching allocator's bytes on a CUDA device,
on the CPU the process's USS (its RSS change added to a USS reading at the forward's start: USS itself
is too slow to read that often). Parameters, gradients and optimizer state are counted exactly, by
storage, from the model and its optimizer.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from perfmagic.collect.memory_readers import DeviceReader, readers_for
from perfmagic.contract.memory import HostEmbedding, MemoryBlock, MemoryDeviceMeta, MemoryMeta

if TYPE_CHECKING:
    from perfmagic.collect.torch_hooks import TorchStages

SAMPLE_FORWARD = 3
"""The forward with gradients sampled: the third, in the first steady step (the first is warm-up)."""

READ_EVERY_S = 0.001
"""How often the reading thread reads the memory in use through the sampled step."""

HOST_EMBEDDING_SHARE = 0.25
"""Share of the model's parameter bytes from which an embedding table left on the host is noted."""

MEMORY: Final = "memory"
"""The timeline's meta key the probe writes (``MemoryMeta``)."""


class MemoryProbe:
    """Samples one training step's memory; :meth:`close` writes ``meta["memory"]``."""

    def __init__(self, stages: TorchStages, read_every_s: float | None = READ_EVERY_S) -> None:
        self._stages = stages
        self._read_every_s = read_every_s
        self.done = False
        self._record: MemoryMeta | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._readers: dict[str, DeviceReader] = {}
        self._peaks: dict[str, tuple[int, str | None, int | None]] = {}  # device: (bytes, stage, reserved)
        self._marks: dict[str, dict[str, int | None]] = {}  # "forward_start"/"backward_start": device: bytes
        self._saved: dict[tuple[str, int], int] = {}  # (device, data_ptr): nbytes
        self._hooks: list[Any] = []
        self._blocks: _Blocks | None = None
        self._tables: list[tuple[str, Any]] = []  # embedding tables on the host of a model on a GPU
        self._embeddings: _Blocks | None = None  # ...timed on the sampled forward
        self._module: Any = None
        self._optimizer: Any = None
        self._grads: dict[str, int] | None = None
        self._state: dict[str, int] = {}
        self._meta: dict[str, Any] = {}
        self._step = 0
        self._params: set[tuple[str, int]] = set()
        self._param_list: list[Any] = []

    # -- the sampled forward (training thread) ------------------------------------------------

    def forward(
        self, call: Callable[..., Any], module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run the sampled forward ``call(module, *args, **kwargs)`` with its memory noted."""
        self.done = True
        torch = self._stages.torch
        if _compiled(module):  # saved-tensor hooks would make dynamo recompile the user's model
            return call(module, *args, **kwargs)
        try:
            blocks = self._begin(module, args, kwargs)
        except Exception as e:  # never break the training: this step is just not sampled
            self._stages.warnings.append(f"memory breakdown not measured ({e!r})")
            self._stop.set()
            for wrapped in (self._blocks, self._embeddings):
                if wrapped is not None:
                    wrapped.unwrap()
            self._module = None
            return call(module, *args, **kwargs)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack(blocks), _unpack):
                result = call(module, *args, **kwargs)
        finally:
            blocks.unwrap()
            if self._embeddings is not None:
                self._embeddings.unwrap()
        self._meta["blocks"] = blocks.finished()
        self._read("forward")
        self._after_forward(result)
        return result

    def _begin(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Blocks:
        torch = self._stages.torch
        self._module = module
        self._step = SAMPLE_FORWARD
        path, found, params = find_blocks(module, torch)
        self._param_list = params
        self._params = {(str(p.device), p.untyped_storage().data_ptr()) for p in params}
        param_devices = {str(p.device) for p in params}
        devices = sorted((param_devices or {"cpu"}) | _cuda_in_use(torch.cuda))
        self._readers = readers_for(devices, torch)
        self._read("forward", mark="forward_start")
        blocks = self._blocks = _Blocks(found, self._stages.now)
        # host tables of a model on a GPU (one more walk of its modules, there only), timed apart from the
        # blocks: a table on the host is no block to checkpoint
        self._tables = host_tables(module, torch) if any(d.startswith("cuda") for d in param_devices) else []
        self._embeddings = _Blocks(self._tables, self._stages.now) if self._tables else None
        self._meta.update(
            model=type(module).__name__,
            model_name=name_in_caller(module, sys._getframe(2)),
            hf_checkpointing=callable(getattr(module, "gradient_checkpointing_enable", None)),
            param_dtype=str(params[0].dtype).replace("torch.", "") if params else None,
            alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            batch_size=_batch_size([*args, *kwargs.values()], torch),
            blocks_path=path,
        )
        if self._read_every_s:
            self._thread = threading.Thread(target=self._reading, name="perfmagic-memory", daemon=True)
            self._thread.start()
        return blocks

    def _pack(self, blocks: _Blocks) -> Callable[[Any], Any]:
        saved, params = self._saved, self._params

        def pack(t: Any) -> Any:
            try:
                storage = t.untyped_storage()
                key = (str(t.device), int(storage.data_ptr()))
                if key[1] and key not in params and key not in saved:
                    saved[key] = nbytes = int(storage.nbytes())
                    blocks.saved(nbytes)
            except Exception:  # a tensor without storage (a subclass, meta): nothing held
                pass
            return t

        return pack

    def _after_forward(self, result: Any) -> None:
        from torch.optim import optimizer as opt_mod

        out = next(iter(_tensors([result], self._stages.torch, grad=True)), None)
        if out is not None:
            self._hooks.append(out.register_hook(self._backward_starts))
        self._hooks.append(opt_mod.register_optimizer_step_pre_hook(self._optimizer_starts))
        self._hooks.append(opt_mod.register_optimizer_step_post_hook(self._optimizer_ends))

    def _backward_starts(self, grad: Any) -> None:
        self._read("backward", mark="backward_start")

    def _optimizer_starts(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._optimizer is None and _steps_model(optimizer, self._params):
            self._optimizer = optimizer
            self._meta["optimizer_name"] = name_in_caller(optimizer, sys._getframe(1))
            self._grads = _grad_bytes(self._param_list)
            self._state = _state_bytes(optimizer, self._stages.torch)
            self._read("optimizer")

    def _optimizer_ends(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer is self._optimizer:
            self._read("optimizer")
            self.finish()

    # -- the readings (either thread) ------------------------------------------------------------

    def _read(self, stage: str | None, mark: str | None = None) -> None:
        for device, reader in self._readers.items():
            try:
                used, reserved = reader.read()
            except Exception:  # a reading that fails leaves the peak as it was
                continue
            with self._lock:
                if mark is not None:
                    self._marks.setdefault(mark, {})[device] = used
                if used > self._peaks.get(device, (-1, None, None))[0]:
                    self._peaks[device] = (used, stage, reserved)

    def _reading(self) -> None:
        rec, wait = self._stages.recorder, self._read_every_s or READ_EVERY_S
        start = rec.step_count
        while not self._stop.wait(wait):
            self._read(rec.current_stage)
            # An optimizer's post-hook ends the reading; without one, the step after the sampled one
            # has ended (an optimizer's boundary is counted only as the next step starts)
            if rec.step_count - start >= 2:
                break

    # -- the record ---------------------------------------------------------------------------------

    def finish(self) -> None:
        """End the sampled step: stop reading, take the figures (the grads now, without an optimizer)."""
        if self._record is not None or self._module is None:
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        try:
            self._record = self._build()
            self._stages.recorder.timeline.meta[MEMORY] = self._record
        except Exception as e:
            self._stages.warnings.append(f"memory breakdown not recorded ({e!r})")
        self._module = self._optimizer = None  # the user's objects are not held past the step
        self._param_list, self._tables = [], []

    def _build(self) -> MemoryMeta:
        grads = self._grads if self._grads is not None else _grad_bytes(self._param_list)
        params = _bytes_by_device(self._param_list)
        activations: dict[str, int] = {}
        for (device, _), n in self._saved.items():
            activations[device] = activations.get(device, 0) + n
        devices: list[MemoryDeviceMeta] = []
        for device in sorted({*params, *grads, *self._state, *activations, *self._readers}):
            reader = self._readers.get(device)
            peak, stage, reserved = self._peaks.get(device, (None, None, None))
            retries, ooms = reader.failures() if reader is not None else (None, None)
            devices.append(
                {
                    "device": device,
                    "parameters_bytes": params.get(device, 0),
                    "gradients_bytes": grads.get(device, 0),
                    "optimizer_state_bytes": self._state.get(device, 0),
                    "activations_bytes": activations.get(device, 0),
                    "peak_bytes": peak,
                    "peak_stage": stage,
                    "peak_source": "process_uss" if device == "cpu" else "cuda_allocator",
                    "reserved_at_peak_bytes": reserved,
                    "forward_start_bytes": self._marks.get("forward_start", {}).get(device),
                    "backward_start_bytes": self._marks.get("backward_start", {}).get(device),
                    "total_bytes": reader.total() if reader is not None else None,
                    "alloc_retries": retries,
                    "ooms": ooms,
                }
            )
        m = self._meta
        return {
            "step": self._step,
            "model": m["model"],
            "model_name": m["model_name"],
            "hf_checkpointing": m["hf_checkpointing"],
            "param_dtype": m["param_dtype"],
            "alloc_conf": m["alloc_conf"],
            "optimizer": type(self._optimizer).__name__ if self._optimizer is not None else None,
            "optimizer_name": m.get("optimizer_name"),
            "batch_size": m["batch_size"],
            "blocks_path": m["blocks_path"],
            "blocks": m.get("blocks", []),
            "devices": devices,
            "host_embeddings": host_embeddings(self._tables, params, self._embeddings.figures)
            if self._embeddings is not None
            else [],
        }

    def close(self) -> None:
        """Profiling ends: a step still sampled ends here."""
        self.finish()
        self._stop.set()


class _Blocks:
    """The model's blocks on the sampled forward: the activations first saved inside each, its input's
    bytes and its forward time.

    Each block's ``forward`` is wrapped on the instance for that one forward, then put back: module
    hooks would cost a handle's calls each to add and remove.
    """

    def __init__(self, blocks: list[tuple[str, Any]], now: Callable[[], float]) -> None:
        self._now = now
        self._open: list[tuple[str, float]] = []
        self.figures: dict[str, MemoryBlock] = {}
        self._wrapped: list[tuple[Any, Any]] = []  # (block, its own instance forward or None)
        try:
            for path, block in blocks:
                self._wrap(path, block)
        except BaseException:  # a block that takes no attribute (a scripted one): none stays wrapped
            self.unwrap()
            raise

    def _wrap(self, path: str, block: Any) -> None:
        own = block.__dict__.get("forward")  # a forward set on the instance (a checkpoint wrapper)
        forward = block.forward

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.enter(path, args)
            try:
                return forward(*args, **kwargs)
            finally:
                self.exit()

        object.__setattr__(block, "forward", timed)
        self._wrapped.append((block, own))

    def unwrap(self) -> None:
        """Put each block's forward back as it was."""
        for block, own in self._wrapped:
            if own is None:
                block.__dict__.pop("forward", None)
            else:
                object.__setattr__(block, "forward", own)
        self._wrapped = []

    def enter(self, path: str, args: tuple[Any, ...]) -> None:
        fig = self.figures.setdefault(
            path, {"path": path, "activations_bytes": 0, "input_bytes": 0, "forward_s": 0.0}
        )
        seen: set[int] = set()
        for t in args:
            storage = getattr(t, "untyped_storage", None)
            if storage is not None and (s := storage()).data_ptr() not in seen:
                seen.add(s.data_ptr())
                fig["input_bytes"] += int(s.nbytes())
        self._open.append((path, self._now()))

    def exit(self) -> None:
        if self._open:
            path, t0 = self._open.pop()
            self.figures[path]["forward_s"] += self._now() - t0

    def saved(self, nbytes: int) -> None:
        if self._open:
            self.figures[self._open[-1][0]]["activations_bytes"] += nbytes

    def finished(self) -> list[MemoryBlock]:
        return list(self.figures.values())


def host_tables(model: Any, torch: Any) -> list[tuple[str, Any]]:
    """The model's embedding modules whose table is on the CPU, by attribute path (asked where the model
    trains on a GPU)."""
    out: list[tuple[str, Any]] = []
    for name, m in model.named_modules():
        weight = getattr(m, "weight", None)
        on_cpu = weight is not None and weight.device.type == "cpu"
        if on_cpu and isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag):
            out.append((attribute_path(name), m))
    return out


def host_embeddings(
    tables: list[tuple[str, Any]], params: dict[str, int], timed: dict[str, MemoryBlock]
) -> list[HostEmbedding]:
    """Of ``tables`` (:func:`host_tables`), those of ``HOST_EMBEDDING_SHARE`` or more of the model's
    parameter bytes (``params``: bytes by device), with their lookups' time on the sampled forward
    (``timed``, by path; 0 where not called)."""
    whole = sum(params.values())
    out: list[HostEmbedding] = []
    for path, m in tables:
        size = m.weight.numel() * m.weight.element_size()
        if whole and size >= HOST_EMBEDDING_SHARE * whole:
            share = size / whole
            out.append(
                {
                    "path": path,
                    "bytes": size,
                    "parameter_share": share,
                    "forward_s": timed[path]["forward_s"] if path in timed else 0.0,
                }
            )
    return out


def _compiled(module: Any) -> bool:
    """``torch.compile(model)`` (an ``OptimizedModule``) or ``model.compile()``."""
    return hasattr(module, "_orig_mod") or getattr(module, "_compiled_call_impl", None) is not None


def _unpack(t: Any) -> Any:
    return t


def find_blocks(model: Any, torch: Any) -> tuple[str | None, list[tuple[str, Any]], list[Any]]:
    """The blocks checkpointing would wrap: the items of the model's longest module list (``ModuleList``
    or ``Sequential``, two items or more), as ``(path, module)``, else the model's children; and the
    model's parameters, each once.

    One walk of ``_modules``: ``named_modules`` and ``parameters`` resume a generator per module and
    per parameter, each a Python call on the sampled step.
    """
    lists = (torch.nn.ModuleList, torch.nn.Sequential)
    best: tuple[str, Any] | None = None
    stack: list[tuple[str, Any]] = [("", model)]
    seen: set[int] = set()
    params: dict[int, Any] = {}
    while stack:
        name, m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        for q in m._parameters.values():
            if q is not None:
                params[id(q)] = q
        if isinstance(m, lists) and len(m) >= 2 and (best is None or len(m) > len(best[1])):
            best = (name, m)
        children = [(f"{name}.{k}" if name else k, c) for k, c in m._modules.items() if c is not None]
        stack.extend(reversed(children))
    found = list(params.values())
    if best is not None:
        path = attribute_path(best[0])
        return path, [(f"{path}[{i}]", child) for i, child in enumerate(best[1])], found
    return None, [(attribute_path(k), c) for k, c in model._modules.items() if c is not None], found


def attribute_path(name: str) -> str:
    """``blocks.0.attn`` as Python reads it from the model: ``blocks[0].attn``."""
    out = ""
    for part in name.split(".") if name else []:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def name_in_caller(obj: Any, frame: Any, depth: int = 12) -> str | None:
    """The name the calling code binds ``obj`` to (its locals, then its globals), outside perfmagic and torch;
    never ``self``, which names it only inside its own class."""
    while frame is not None and depth > 0:
        if not frame.f_globals.get("__name__", "").startswith(("perfmagic", "torch")):
            for scope in (frame.f_locals, frame.f_globals):
                for name, value in scope.items():
                    if value is obj and name.isidentifier() and not name.startswith("_") and name != "self":
                        return str(name)
            return None
        frame, depth = frame.f_back, depth - 1
    return None


def _cuda_in_use(cuda: Any) -> set[str]:
    """The CUDA devices whose caching allocator holds memory (none before the code has used CUDA)."""
    if not (cuda.is_available() and cuda.is_initialized()):
        return set()
    return {f"cuda:{d}" for d in range(cuda.device_count()) if cuda.memory_reserved(d) > 0}


def _bytes_by_device(tensors: Iterable[Any]) -> dict[str, int]:
    """Bytes of the unique storages among ``tensors``, by device."""
    storages = {(str(t.device), (st := t.untyped_storage()).data_ptr()): st.nbytes() for t in tensors}
    out: dict[str, int] = {}
    for (device, ptr), n in storages.items():
        if ptr:
            out[device] = out.get(device, 0) + int(n)
    return out


def _grad_bytes(params: list[Any]) -> dict[str, int]:
    return _bytes_by_device([p.grad for p in params if p.grad is not None])


def _state_bytes(optimizer: Any, torch: Any) -> dict[str, int]:
    return _bytes_by_device(_tensors(list(optimizer.state.values()), torch))


def _steps_model(optimizer: Any, params: set[tuple[str, int]]) -> bool:
    stepped = {
        (str(p.device), p.untyped_storage().data_ptr()) for g in optimizer.param_groups for p in g["params"]
    }
    return not stepped.isdisjoint(params)


def _tensors(values: list[Any], torch: Any, grad: bool = False) -> Iterable[Any]:
    """The tensors in nested lists, tuples and dicts (a ModelOutput is a dict), depth first."""
    stack = list(reversed(values))
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if not grad or v.requires_grad:
                yield v
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, list | tuple):
            stack.extend(reversed(v))


def _batch_size(values: list[Any], torch: Any) -> int | None:
    first = next(iter(_tensors(values, torch)), None)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else None
