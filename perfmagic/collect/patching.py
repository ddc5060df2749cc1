"""Reversible attribute patches: every patch is undone, whatever happened in between."""

from __future__ import annotations

from typing import Any

_ABSENT = object()


class Patcher:
    """Sets attributes and puts back exactly what was there (or its absence)."""

    def __init__(self) -> None:
        # (owner, name, own value or _ABSENT, patch)
        self._saved: list[tuple[Any, str, Any, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Replace ``owner.name`` with ``value``; returns the value it had."""
        own = _own(owner, name)
        original = getattr(owner, name)
        setattr(owner, name, value)
        self._saved.append((owner, name, own, value))
        return original

    def restore(self) -> list[str]:
        """Undo all patches, newest first; returns warnings for what could not be undone."""
        warnings: list[str] = []
        while self._saved:
            warning = _undo(self._saved.pop())
            if warning is not None:
                warnings.append(warning)
        return warnings

    def values(self) -> list[Any]:
        """What the patches put in place, oldest first."""
        return [value for _, _, _, value in self._saved]

    def __len__(self) -> int:
        return len(self._saved)


def _own(owner: Any, name: str) -> Any:
    return vars(owner).get(name, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT


def _undo(entry: tuple[Any, str, Any, Any]) -> str | None:
    """Put back what one patch replaced; a warning where it cannot (or someone replaced the patch)."""
    owner, name, own, value = entry
    current = _own(owner, name)
    if current is not value and getattr(owner, name, _ABSENT) is not value:
        # Someone replaced our patch while profiling (e.g. redirect_stdout): keep theirs.
        return f"{_label(owner)}.{name} was replaced during profiling; left as it is now"
    try:
        if own is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, own)
    except (AttributeError, TypeError) as e:
        return f"could not restore {_label(owner)}.{name}: {e}"
    return None


def _label(owner: Any) -> str:
    return str(
        getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None) or type(owner).__name__
    )
