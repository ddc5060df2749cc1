"""Fix code in the user's own framework: ``TrainingArguments(...)`` for the Hugging Face Trainer,
``Trainer(...)``/``ModelCheckpoint(...)`` for Lightning, ``Accelerator(...)`` for Accelerate.

A user of a framework does not write the DataLoader, the autocast block or the
``step % N`` save: the framework's own settings do. Each function returns the
code for the trainer that drove the loop (``a.config.trainer``), or None for a
plain loop, where the plain PyTorch fix applies. The HF code carries over the
``TrainingArguments`` the user set (those that differ from the defaults), so that
it replaces theirs as it is.
"""

from __future__ import annotations

from typing import Any

from perfmagic.advise.calls import UserCall, find_call
from perfmagic.advise.fixes import dataloader_code, loader_site
from perfmagic.advise.tf_fixes import jax_jit_code, keras_jit_compile_code, keras_mixed_precision_code
from perfmagic.analyze import Analysis
from perfmagic.contract import LoaderConfig
from perfmagic.contract.code import FixSite

HF = "transformers.Trainer"
LIGHTNING = "lightning.Trainer"
FABRIC = "lightning.Fabric"
ACCELERATE = "accelerate"
KERAS = "keras.Model.fit"

_LOADER_ARGUMENTS = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
}
"""DataLoader arguments → the ``TrainingArguments`` that set them on the DataLoaders the Trainer builds."""


def trainer_name(a: Analysis) -> str | None:
    trainer = a.config.trainer
    return str(trainer["trainer"]) if trainer else None


def trainer_settings(a: Analysis) -> dict[str, Any]:
    """What the trainer was told (each framework's own keys, as the user's code set them); {} without one."""
    return a.config.trainer["settings"] if a.config.trainer else {}


def training_arguments_code(a: Analysis, changes: dict[str, Any]) -> str:
    """The user's ``TrainingArguments(...)`` statement with ``changes``, each commented with the old
    value; where their statement was not found, a call with the arguments that differ from the
    defaults (those :mod:`perfmagic.collect.frameworks` read)."""
    settings = trainer_settings(a)
    call = user_call(a)
    if call is not None:
        return call.rewritten(changes, settings["call"]["values"])
    current: dict[str, Any] = dict(settings.get("training_args") or {})
    cls = str(settings.get("training_args_class") or "TrainingArguments")
    lines = [f"args = {cls}("]
    for key, value in current.items():
        if key not in changes and value is not None:
            lines.append(f"    {key}={value!r},")
    for key, value in changes.items():
        old = current.get(key)
        note = f"  # was {old!r}" if key in current and old != value else ""
        lines.append(f"    {key}={value!r},{note}")
    lines += [
        ")",
        "trainer = Trainer(model=model, args=args)  # and the rest of your Trainer call, unchanged",
    ]
    return "\n".join(lines)


def user_call(a: Analysis, key: str = "call") -> UserCall | None:
    """The user's statement that built the trainer's settings object (``TrainingArguments``, Lightning's
    ``Trainer``, ...), or its checkpoint callback (``key="checkpoint_call"``)."""
    settings = trainer_settings(a)
    return find_call(settings.get(key))


def trainer_fix_site(a: Analysis, key: str = "call") -> FixSite | None:
    """The user's statement a framework fix rewrites (see :func:`user_call`), where it was found."""
    call = user_call(a, key)
    return call.site if call else None


def loader_fix_site(a: Analysis, ld: LoaderConfig | None) -> FixSite | None:
    """The user's statement :func:`loader_code` rewrites: their ``TrainingArguments`` under the HF
    Trainer, else their DataLoader call."""
    if trainer_name(a) == HF:
        call = user_call(a)
        return call.site if call else None
    return loader_site(ld)


def run_steps(a: Analysis) -> int | None:
    """The steps the whole run trains for, where the trainer was told (``max_steps``)."""
    settings = trainer_settings(a)
    known = settings.get("max_steps") or (settings.get("training_args") or {}).get("max_steps")
    return int(known) if isinstance(known, int) and known > 0 else None


def loader_code(a: Analysis, ld: LoaderConfig, **changes: Any) -> str:
    """DataLoader changes where the user makes them: ``TrainingArguments`` under the HF Trainer (which
    builds the DataLoaders), the ``DataLoader`` call otherwise (Lightning: in ``train_dataloader``)."""
    name = trainer_name(a)
    if name == HF:
        workers = changes.get("num_workers", ld.num_workers)
        hf = {
            _LOADER_ARGUMENTS[k]: v
            for k, v in changes.items()
            if k in _LOADER_ARGUMENTS and (workers or k not in ("persistent_workers", "prefetch_factor"))
        }
        return training_arguments_code(a, hf)
    code = dataloader_code(ld, **changes)
    if name in (LIGHTNING, FABRIC):
        return "# in your LightningModule's train_dataloader() (or LightningDataModule):\n" + code
    return code


def checkpoint_interval_code(a: Analysis, every: int, now: str) -> str | None:
    """Save every ``every`` steps with the framework's own setting (None: a plain loop)."""
    name = trainer_name(a)
    if name == HF:
        total = run_steps(a)
        if total is not None and every >= total:  # fewer saves than one: save once, at the end
            return "\n".join(
                [
                    f"# checkpoints now {now}, in a {total}-step run: save once, after training",
                    training_arguments_code(a, {"save_strategy": "no"}),
                    "# and after trainer.train(): trainer.save_model()",
                ]
            )
        return f"# checkpoints now {now}\n" + training_arguments_code(
            a, {"save_strategy": "steps", "save_steps": every}
        )
    if name == LIGHTNING:
        settings = trainer_settings(a)
        checkpoint = user_call(a, "checkpoint_call")
        if checkpoint is not None:
            values = settings["checkpoint_call"]["values"]
            return f"# checkpoints now {now}\n" + checkpoint.rewritten({"every_n_train_steps": every}, values)
        dirpath = settings.get("checkpoint_dirpath")
        where = f"dirpath={dirpath!r}, " if dirpath else ""
        return "\n".join(
            [
                "from lightning.pytorch.callbacks import ModelCheckpoint",
                f"checkpoint = ModelCheckpoint({where}every_n_train_steps={every})  # now {now}",
                "trainer = Trainer(callbacks=[checkpoint])  # with your other Trainer arguments",
            ]
        )
    if name == ACCELERATE:
        return "\n".join(
            [
                f"CHECKPOINT_EVERY = {every}  # steps; now {now}",
                "if step % CHECKPOINT_EVERY == 0:",
                "    accelerator.save_state(output_dir)  # your save, unchanged",
            ]
        )
    return None


def mixed_precision_code(a: Analysis, bf16: bool) -> str | None:
    """Mixed precision switched on in the framework (None: a plain loop)."""
    name = trainer_name(a)
    if name == HF:
        return training_arguments_code(a, {"bf16": True} if bf16 else {"fp16": True})
    precision = "bf16-mixed" if bf16 else "16-mixed"
    call = user_call(a) if name in (LIGHTNING, FABRIC) else None
    if call is not None:
        return call.rewritten({"precision": precision}, trainer_settings(a)["call"]["values"])
    if name == LIGHTNING:
        return f"trainer = Trainer(precision={precision!r})  # with your other Trainer arguments"
    if name == FABRIC:
        return f"fabric = Fabric(precision={precision!r})  # with your other Fabric arguments"
    if name == KERAS:
        return keras_mixed_precision_code(bf16)
    if name == ACCELERATE:
        mode = "bf16" if bf16 else "fp16"
        return f"accelerator = Accelerator(mixed_precision={mode!r})  # with your other Accelerator arguments"
    return None


def compile_code(a: Analysis) -> str | None:
    """``torch.compile`` the way the framework applies it, XLA for Keras and JAX (None: a plain
    PyTorch loop; Keras already compiling with XLA)."""
    name = trainer_name(a)
    if name == KERAS:
        settings = trainer_settings(a)
        if settings.get("jit_compile") is True:
            return None
        call = user_call(a, "compile_call")  # their model.compile(...), with jit_compile=True
        return (
            call.rewritten({"jit_compile": True}, settings["compile_call"]["values"])
            if call
            else keras_jit_compile_code()
        )
    if name is None and a.framework == "jax":
        return jax_jit_code()
    if name == HF:
        return training_arguments_code(a, {"torch_compile": True})
    if name in (LIGHTNING, FABRIC):
        return "model = torch.compile(model)  # the LightningModule, before trainer.fit(model, ...)"
    if name == ACCELERATE:
        return "model = torch.compile(model)  # before accelerator.prepare(model, ...)"
    return None
