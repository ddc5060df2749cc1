"""Reversible attribute patches: every patch is undone, whatever happened in between.

A patcher's patches can also be taken out for a while and set again (``suspend`` / ``resume``):
the stage hooks recorded in windows (``collect.schedule``) that have no Python code to switch come
and go at step ends that way (``collect.windowed_hooks``), and an exit restores the same, suspended
or not.
"""

from __future__ import annotations

from typing import Any

_ABSENT = object()


class Patcher:
    """Sets attributes and puts back exactly what was there (or its absence)."""

    def __init__(self) -> None:
        # (owner, name, own value or _ABSENT, patch, what ``owner.name`` reads while suspended)
        self._saved: list[tuple[Any, str, Any, Any, Any]] = []
        self.suspended = False

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Replace ``owner.name`` with ``value``; returns the value it had."""
        own = _own(owner, name)
        original = getattr(owner, name)
        if not self.suspended:
            setattr(owner, name, value)
        self._saved.append((owner, name, own, value, original))
        return original

    def restore(self) -> list[str]:
        """Undo all patches, newest first; returns warnings for what could not be undone."""
        warnings: list[str] = []
        if self.suspended:  # none is in place
            self._saved.clear()
            self.suspended = False
            return warnings
        while self._saved:
            warning = _undo(self._saved.pop())
            if warning is not None:
                warnings.append(warning)
        return warnings

    def suspend(self) -> list[str]:
        """Put back what each patch replaced, keeping the patches to set again with :meth:`resume`.

        A patch someone replaced meanwhile (``redirect_stdout``) stays theirs and is dropped."""
        if self.suspended:
            return []
        warnings: list[str] = []
        kept: list[tuple[Any, str, Any, Any, Any]] = []
        for entry in reversed(self._saved):
            warning = _undo(entry)
            if warning is None:
                owner, name, own, value, _ = entry
                kept.append((owner, name, own, value, getattr(owner, name, _ABSENT)))
            else:
                warnings.append(warning)
        self._saved = kept[::-1]
        self.suspended = True
        return warnings

    def resume(self) -> list[str]:
        """Set again the patches :meth:`suspend` took out, where nobody has replaced the original since."""
        if not self.suspended:
            return []
        warnings: list[str] = []
        kept: list[tuple[Any, str, Any, Any, Any]] = []
        for entry in self._saved:
            owner, name, _own_value, value, unpatched = entry
            if getattr(owner, name, _ABSENT) is not unpatched:
                warnings.append(f"{_label(owner)}.{name} was replaced during profiling; left as it is now")
                continue
            setattr(owner, name, value)
            kept.append(entry)
        self._saved = kept
        self.suspended = False
        return warnings

    def values(self) -> list[Any]:
        """What the patches put in place, oldest first."""
        return [value for _, _, _, value, _ in self._saved]

    def __len__(self) -> int:
        return len(self._saved)


def _own(owner: Any, name: str) -> Any:
    return vars(owner).get(name, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT


def _undo(entry: tuple[Any, str, Any, Any, Any]) -> str | None:
    """Put back what one patch replaced; a warning where it cannot (or someone replaced the patch)."""
    owner, name, own, value, _ = entry
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
