"""Hooks for the training frameworks that drive the loop: Hugging Face Trainer, Lightning, Accelerate.

The torch hooks see the loop's tensors, modules and optimizers whoever drives
them; these add what only the framework knows, at the methods where the
framework defines them (patched on the class, so a trainer made before
profiling is covered, and installed when the framework's module is imported,
before or during profiling):

========== ==================================================================
trainer    which framework drives the loop (``trainer`` mark, with the
           settings its fixes are written in: the user's ``TrainingArguments``,
           the Lightning ``Trainer``'s precision, checkpoint callback, ...)
checkpoint the framework's whole checkpoint routine as one ``checkpoint``:
           HF ``Trainer._save_checkpoint`` (model, optimizer, scheduler, RNG,
           ``trainer_state.json``, rotation), Lightning ``ModelCheckpoint``'s
           save and removal and ``Trainer.save_checkpoint``, Fabric's and
           Accelerate's ``save``/``save_state``
evaluation evaluation passes kept out of the training steps: HF
           ``Trainer.evaluate``/``predict``, Lightning's evaluation loop
           (validation, test, sanity check) and prediction loop
========== ==================================================================

Every patch is put back by :meth:`FrameworkHooks.uninstall`.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from perfmagic.collect.call_hints import call_hint
from perfmagic.collect.imports import PostImportHook, when_imported
from perfmagic.collect.patching import Patcher
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.schema import TRAINER_MARK

if TYPE_CHECKING:
    from perfmagic.collect.evaluation import EvaluationPasses
    from perfmagic.collect.recorder import StageRecorder
    from perfmagic.collect.torch_hooks import TorchStages

Role = Literal["trainer", "checkpoint", "evaluation"]


@dataclass(frozen=True)
class FrameworkPatch:
    """One method of a framework class, and what perfmagic records around it."""

    module: str  # the module that defines the class
    owner: str  # the class
    attr: str  # the method
    role: Role
    label: str  # trainer: its name; checkpoint: the routine's name; evaluation: the pass's kind


def _lightning(ns: str) -> tuple[FrameworkPatch, ...]:
    trainer, callback = f"{ns}.trainer.trainer", f"{ns}.callbacks.model_checkpoint"
    return (
        *(
            FrameworkPatch(trainer, "Trainer", fn, "trainer", "lightning.Trainer")
            for fn in _LIGHTNING_ENTRIES
        ),
        FrameworkPatch(
            trainer, "Trainer", "save_checkpoint", "checkpoint", "lightning.Trainer.save_checkpoint"
        ),
        FrameworkPatch(callback, "ModelCheckpoint", "_save_checkpoint", "checkpoint", "ModelCheckpoint"),
        FrameworkPatch(callback, "ModelCheckpoint", "_remove_checkpoint", "checkpoint", "ModelCheckpoint"),
        FrameworkPatch(f"{ns}.loops.evaluation_loop", "_EvaluationLoop", "run", "evaluation", "validation"),
        FrameworkPatch(f"{ns}.loops.prediction_loop", "_PredictionLoop", "run", "evaluation", "predict"),
    )


_LIGHTNING_ENTRIES = ("fit", "validate", "test", "predict")

PATCHES: tuple[FrameworkPatch, ...] = (
    FrameworkPatch("transformers.trainer", "Trainer", "train", "trainer", "transformers.Trainer"),
    FrameworkPatch("transformers.trainer", "Trainer", "evaluate", "trainer", "transformers.Trainer"),
    # also per step: a ``trainer.train`` bound before profiling began still shows whose loop it is
    FrameworkPatch("transformers.trainer", "Trainer", "training_step", "trainer", "transformers.Trainer"),
    FrameworkPatch(
        "transformers.trainer",
        "Trainer",
        "_save_checkpoint",
        "checkpoint",
        "transformers.Trainer._save_checkpoint",
    ),
    FrameworkPatch(
        "transformers.trainer", "Trainer", "save_model", "checkpoint", "transformers.Trainer.save_model"
    ),
    FrameworkPatch("transformers.trainer", "Trainer", "evaluate", "evaluation", "evaluate"),
    FrameworkPatch("transformers.trainer", "Trainer", "predict", "evaluation", "predict"),
    *_lightning("lightning.pytorch"),
    *_lightning("pytorch_lightning"),
    FrameworkPatch("lightning.fabric.fabric", "Fabric", "backward", "trainer", "lightning.Fabric"),
    FrameworkPatch("lightning.fabric.fabric", "Fabric", "save", "checkpoint", "lightning.Fabric.save"),
    FrameworkPatch("accelerate.accelerator", "Accelerator", "prepare", "trainer", "accelerate"),
    FrameworkPatch("accelerate.accelerator", "Accelerator", "backward", "trainer", "accelerate"),
    FrameworkPatch(
        "accelerate.accelerator",
        "Accelerator",
        "save_state",
        "checkpoint",
        "accelerate.Accelerator.save_state",
    ),
)
"""Every framework method perfmagic wraps (a method may have several roles: they nest in this order)."""


class FrameworkHooks:
    """Installs the framework patches as the frameworks are imported; :meth:`uninstall` removes them."""

    def __init__(
        self,
        recorder: StageRecorder,
        evaluation: EvaluationPasses,
        torch_stages: Callable[[], TorchStages | None],
    ) -> None:
        # Installed when profiling starts, before torch is hooked (a framework imported inside the
        # profiled cell imports torch half-way through its own import): the torch hooks are looked up
        # when a wrapper runs, and without them the wrappers only call through.
        self._recorder = recorder
        self._evaluation = evaluation
        self._torch_stages = torch_stages
        self._patcher = Patcher()
        self._pending: list[PostImportHook] = []
        self._seen: set[tuple[int, str]] = set()
        self.warnings: list[str] = []

    def install(self) -> None:
        for module in dict.fromkeys(p.module for p in PATCHES):
            hook = when_imported(module, self._patch_module)
            if hook is not None:
                self._pending.append(hook)

    def uninstall(self) -> list[str]:
        for hook in self._pending:
            hook.remove()
        self._pending = []
        return [*self.warnings, *self._patcher.restore()]

    def _patch_module(self, module: ModuleType) -> None:
        """Wrap the methods this module defines (runs inside the import when it comes later)."""
        for patch in PATCHES:
            if patch.module != module.__name__:
                continue
            owner = getattr(module, patch.owner, None)
            method = getattr(owner, patch.attr, None) if owner is not None else None
            if method is None:  # another version of the framework: nothing of that name to time
                continue
            try:
                self._patcher.set(owner, patch.attr, self._wrap(patch, method))
            except Exception as e:
                self.warnings.append(f"could not hook {patch.owner}.{patch.attr} ({e!r})")

    def _wrap(self, patch: FrameworkPatch, method: Callable[..., Any]) -> Callable[..., Any]:
        if patch.role == "checkpoint":
            return self._checkpoint(method, patch.label)
        if patch.role == "evaluation":
            return self._evaluation_pass(method, patch.label)
        return self._trainer(method, patch.label)

    def _checkpoint(self, method: Callable[..., Any], label: str) -> Callable[..., Any]:
        def save(*args: Any, **kwargs: Any) -> Any:
            try:
                stages = self._torch_stages()
                if stages is None:
                    return method(*args, **kwargs)
                return stages.checkpoints.run_routine(method, label, args, kwargs)
            except BaseException as e:
                drop_own_frame(e)
                raise

        save.__wrapped__ = method  # type: ignore[attr-defined]
        return save

    def _evaluation_pass(self, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
        evaluation = self._evaluation

        def evaluate(obj: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if not evaluation.begin(_pass_kind(obj, kind)):
                    return method(obj, *args, **kwargs)
                try:
                    return method(obj, *args, **kwargs)
                finally:
                    evaluation.end()
            except BaseException as e:
                drop_own_frame(e)
                raise

        evaluate.__wrapped__ = method  # type: ignore[attr-defined]
        return evaluate

    def _trainer(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        def drive(obj: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                key = (id(obj), name)
                if key not in self._seen:
                    self._seen.add(key)
                    self._record_trainer(obj, name)
                return method(obj, *args, **kwargs)
            except BaseException as e:
                drop_own_frame(e)
                raise

        drive.__wrapped__ = method  # type: ignore[attr-defined]
        return drive

    def _record_trainer(self, obj: Any, name: str) -> None:
        try:
            settings = _SETTINGS[name](obj)
            frame = sys._getframe(1)  # the fit/train call, or above it: where the user's variables are
            settings["call"] = call_hint(
                getattr(obj, "args", obj) if name == "transformers.Trainer" else obj, frame
            )
            checkpoint = getattr(obj, "checkpoint_callback", None) if name == "lightning.Trainer" else None
            if checkpoint is not None:
                settings["checkpoint_call"] = call_hint(checkpoint, frame)
        except Exception as e:  # what we note of the user's trainer never raises into their code
            self.warnings.append(f"could not read the settings of {name} ({e!r})")
            settings = {}
        recorder = self._recorder
        recorder.timeline.add_mark(
            recorder.clock.now() - recorder.origin,
            TRAINER_MARK,
            trainer=name,
            version=_version(name),
            settings=settings,
        )


def _pass_kind(obj: Any, default: str) -> str:
    """A Lightning evaluation loop's pass: a sanity check, a test or a validation."""
    trainer = getattr(obj, "trainer", None)
    if trainer is None or default != "validation":
        return default
    if getattr(trainer, "sanity_checking", False):
        return "sanity_check"
    return "test" if getattr(trainer, "testing", False) else default


def _scalar(value: Any) -> Any:
    """A JSON scalar for a setting, or ``_SKIP`` (objects, lists: not carried into fix code)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _SKIP


_SKIP = object()


def _training_arguments(trainer: Any) -> dict[str, Any]:
    """The user's ``TrainingArguments`` that differ from the defaults (simple values only)."""
    args = trainer.args
    out: dict[str, Any] = {}
    for f in dataclasses.fields(args):
        if f.name.startswith("_") or not f.init:
            continue
        value = _scalar(getattr(args, f.name, None))
        if value is _SKIP:
            continue
        default = f.default if f.default is not dataclasses.MISSING else _SKIP
        if f.name == "output_dir" or (default is not _SKIP and value != _scalar(default)):
            out[f.name] = value
    return {"training_args": out, "training_args_class": type(args).__name__}


def _lightning_trainer(trainer: Any) -> dict[str, Any]:
    """What a Lightning ``Trainer``'s fixes are written in: its precision, accumulation, checkpointing."""
    checkpoint = getattr(trainer, "checkpoint_callback", None)
    every = getattr(checkpoint, "_every_n_train_steps", None) if checkpoint is not None else None
    return {
        "precision": _scalar(getattr(trainer, "precision", None)),
        "accumulate_grad_batches": _scalar(getattr(trainer, "accumulate_grad_batches", None)),
        "max_steps": _scalar(getattr(trainer, "max_steps", None)),
        "val_check_interval": _scalar(getattr(trainer, "val_check_interval", None)),
        "checkpoint_every_n_train_steps": _scalar(every),
        "checkpoint_dirpath": _scalar(getattr(checkpoint, "dirpath", None))
        if checkpoint is not None
        else None,
    }


def _accelerator(accelerator: Any) -> dict[str, Any]:
    return {
        "mixed_precision": _scalar(getattr(accelerator, "mixed_precision", None)),
        "gradient_accumulation_steps": _scalar(getattr(accelerator, "gradient_accumulation_steps", None)),
    }


def _fabric(fabric: Any) -> dict[str, Any]:
    precision = getattr(getattr(fabric, "_precision", None), "precision", None)
    return {"precision": _scalar(precision)}


_SETTINGS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "transformers.Trainer": _training_arguments,
    "lightning.Trainer": _lightning_trainer,
    "lightning.Fabric": _fabric,
    "accelerate": _accelerator,
}


def _version(name: str) -> str | None:
    package = {"transformers.Trainer": "transformers", "accelerate": "accelerate"}.get(name, "lightning")
    module = sys.modules.get(package) or sys.modules.get("pytorch_lightning")
    return str(getattr(module, "__version__", "")) or None
