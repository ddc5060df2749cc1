"""TensorFlow, Keras and JAX: their hooks installed as each is imported, all removed together."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Protocol

from perfmagic.collect.imports import PostImportHook, when_imported
from perfmagic.collect.recorder import StageRecorder

MODULES = ("tensorflow", "keras", "jax")


class _Hooks(Protocol):
    def install(self) -> None: ...

    def uninstall(self) -> list[str]: ...


def available() -> bool:
    """Whether any of TensorFlow, Keras or JAX can be imported here."""
    return any(m in sys.modules or importlib.util.find_spec(m) is not None for m in MODULES)


class TfJaxHooks:
    """Hooks TensorFlow (tf.data loops), Keras (``fit``) and JAX (annotations) when they are imported.

    ``set_framework(name, override)`` names the report's ``framework``: Keras
    tells the backend that trains (``override``); the others only where none is named yet.
    """

    def __init__(self, recorder: StageRecorder, set_framework: Callable[[str, bool], None]) -> None:
        self._recorder = recorder
        self._set_framework = set_framework
        self._pending: list[PostImportHook] = []
        self._installed: list[_Hooks] = []
        self.warnings: list[str] = []

    def install(self) -> None:
        for name in MODULES:
            hook = when_imported(name, self._on_import)
            if hook is not None:
                self._pending.append(hook)

    def _on_import(self, module: ModuleType) -> None:
        hooks = self._hooks_for(module.__name__)
        try:
            hooks.install()
        except Exception as e:  # an unexpected version must not fail the user's import
            self.warnings += [*hooks.uninstall(), f"{module.__name__} hooks failed to install ({e!r})"]
        else:
            self._installed.append(hooks)

    def _hooks_for(self, name: str) -> _Hooks:
        recorder = self._recorder
        if name == "keras":
            from perfmagic.collect.keras import KerasHooks

            return KerasHooks(recorder, lambda backend: self._set_framework(backend, True))
        if name == "jax":
            from perfmagic.collect.jax import JaxHooks

            return JaxHooks(recorder, lambda framework: self._set_framework(framework, False))
        from perfmagic.collect.tfdata import TfDataLoop

        return TfDataLoop(recorder, lambda framework: self._set_framework(framework, False))

    def uninstall(self) -> list[str]:
        for hook in self._pending:
            hook.remove()
        self._pending = []
        warnings, self.warnings = self.warnings, []
        while self._installed:
            warnings += self._installed.pop().uninstall()
        return warnings
