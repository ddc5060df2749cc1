"""Run a callback right after a module is first imported.

Lets a session hook a framework the profiled code imports later (a notebook
cell that starts with ``import torch``) without importing it eagerly in every
process that ``perfmagic run`` starts.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType


def installed(name: str) -> bool:
    """Whether module ``name`` is imported or could be, without importing it."""
    return name in sys.modules or importlib.util.find_spec(name) is not None


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, on_loaded: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._on_loaded = on_loaded

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
            module.__loader__ = self._loader
        self._on_loaded(module)


class PostImportHook(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once, after ``name`` finishes importing."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self._callback = callback
        self._resolving = False
        self._fired = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._resolving or self._fired:
            return None
        self._resolving = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._resolving = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _NotifyingLoader(spec.loader, self._fire)
        return spec

    def _fire(self, module: ModuleType) -> None:
        self._fired = True
        self.remove()
        self._callback(module)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> PostImportHook | None:
    """Call ``callback`` now if ``name`` is imported, else right after its import.

    Returns the pending hook (``remove()`` it to cancel), or None if it already ran.
    """
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return None
    hook = PostImportHook(name, callback)
    sys.meta_path.insert(0, hook)
    return hook
