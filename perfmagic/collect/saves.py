"""The save functions the ``checkpoint`` stage times: where they are bound, and what each save wrote."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from perfmagic.collect.patching import Patcher


def safetensors_torch() -> Any:
    """``safetensors.torch`` where installed (importing it is cheap), else None."""
    if importlib.util.find_spec("safetensors") is None:
        return None
    try:
        import safetensors.torch as st
    except ImportError:
        return None
    return st


_BINDS_COPIES = (
    "transformers",
    "accelerate",
    "diffusers",
    "peft",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "timm",
    "sentence_transformers",
    "huggingface_hub",
)
"""Packages whose modules bind copies of save functions (``from safetensors.torch import save_file as
safe_save_file``). Only their modules are searched: every module of a big environment would cost the
start of each profile ~10 ms (3,000 modules with transformers and Lightning loaded), ~2 ms here."""


def rebind_copies(saves: dict[Any, Any], p: Patcher) -> None:
    """Patch the copies of save functions that the frameworks' modules bound before profiling began.

    ``from safetensors.torch import save_file as safe_save_file`` (transformers does)
    copies the function into the importing module: patching ``safetensors.torch`` alone
    leaves those calls unseen. Modules imported while profiling bind the patched ones.
    """
    by_id = {id(orig): wrapped for orig, wrapped in saves.items()}  # by identity: no user __eq__ runs
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(_BINDS_COPIES):
            continue
        try:
            namespace = vars(module)
            if by_id.keys().isdisjoint(map(id, namespace.values())):
                continue
            found = [(attr, by_id[id(v)]) for attr, v in list(namespace.items()) if id(v) in by_id]
        except (TypeError, RuntimeError):  # no __dict__ (a lazy proxy), or one changing under us
            continue
        for attr, wrapped in found:
            p.set(module, attr, wrapped)


def saved_what(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What a save wrote: ``state_dict`` (tensors by name), a checkpoint dict's top-level keys, or its type."""
    obj = kwargs.get("obj", kwargs.get("tensors", kwargs.get("model", args[0] if args else None)))
    if isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj):
        if all(type(v).__name__ in ("Tensor", "Parameter") for v in obj.values()):
            return {"what": "state_dict"}
        return {"what": "dict", "keys": list(obj)[:32]}
    return {"what": type(obj).__name__}


def saved_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Size of what a save wrote: the file's size, or a file object's position after it (None if unknown)."""
    target = kwargs.get("f", kwargs.get("filename", args[1] if len(args) > 1 else None))
    try:
        if isinstance(target, (str, os.PathLike)):
            return os.path.getsize(target)
        tell = getattr(target, "tell", None)
        return int(tell()) if callable(tell) else None
    except Exception:  # a closed or unseekable stream, a file-like whose tell() is odd: size unknown
        return None
