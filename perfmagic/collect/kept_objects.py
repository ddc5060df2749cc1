"""The user's torch objects the hooks met, kept for tuning to try its fixes on."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any


class KeptObjects:
    """The DataLoaders, models and optimizers met, by kind, and each top-level module's last inputs.

    Held weakly unless :attr:`hold` (a session that tunes): then strongly, with the inputs too, since
    ``for x in DataLoader(...)`` holds its loader nowhere once the loop is over.
    """

    def __init__(self) -> None:
        self.hold = False
        self.met: dict[str, list[Callable[[], Any]]] = {}
        self.inputs: dict[int, tuple[weakref.ref[Any], tuple[Any, ...], dict[str, Any]]] = {}

    def meet(self, kind: str, obj: Any) -> None:
        """Keep ``obj``, a ``loader``, ``model`` or ``optimizer`` met for the first time."""
        if self.hold:
            self.met.setdefault(kind, []).append(_Strong(obj))
        else:
            with contextlib.suppress(TypeError):  # an object without weak references is not kept
                self.met.setdefault(kind, []).append(weakref.ref(obj))

    def for_tuning(self) -> dict[str, Any]:
        """What tuning needs of what the window met: ``loader`` (the largest), ``model`` (the top-level
        module with the most parameters) with its last ``batch`` (args, kwargs), its ``optimizer``."""
        alive = {k: [o for r in refs if (o := r()) is not None] for k, refs in self.met.items()}
        found: dict[str, Any] = {}
        loaders = alive.get("loader", [])
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
                    for o in alive.get("optimizer", [])
                    if any(id(p) in own for g in o.param_groups for p in g["params"])
                ),
                None,
            )
        return found

    def clear(self) -> None:
        """Let go of everything kept (the batches among it): tuning is over."""
        self.inputs.clear()
        self.met.clear()


class _Strong:
    """A reference called like a weak one."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


def _dataset_len(loader: Any) -> int:
    try:
        return len(loader.dataset)
    except Exception:  # no __len__, or one that raises
        return 0
