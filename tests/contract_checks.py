"""Check a JSON-like value against a type of :mod:`perfmagic.contract`: every key declared, every
required key present, every value of its declared JSON type, at every level."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, is_typeddict


def mismatches(value: Any, tp: Any, path: str = "$") -> list[str]:
    """Where ``value`` departs from ``tp``: one line per place (empty when it conforms)."""
    if tp is Any:
        return _json_safe(value, path)
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        arms = [a for a in get_args(tp) if value is None or a is not type(None)]
        found = [mismatches(value, arm, path) for arm in arms]
        if any(not f for f in found):
            return []
        return found[0] if len(found) == 1 else [f"{path}: {_name(value)} is not {_type_name(tp)}"]
    if origin is Literal:
        return [] if value in get_args(tp) else [f"{path}: {value!r} is not one of {get_args(tp)}"]
    if is_typeddict(tp):
        return _typeddict(value, tp, path)
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {_name(value)} is not a list"]
        (item,) = get_args(tp)
        return [m for i, v in enumerate(value) for m in mismatches(v, item, f"{path}[{i}]")]
    if origin is tuple:  # a fixed-length pair or triple, a JSON array once written
        items = get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(items):
            return [f"{path}: {_name(value)} is not an array of {len(items)}"]
        return [
            m
            for i, (v, t) in enumerate(zip(value, items, strict=True))
            for m in mismatches(v, t, f"{path}[{i}]")
        ]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {_name(value)} is not a dict"]
        key, item = get_args(tp)
        out = [f"{path}: key {k!r} is not {key.__name__}" for k in value if not _key_ok(k, key)]
        return out + [m for k, v in value.items() for m in mismatches(v, item, f"{path}.{k}")]
    return [] if _scalar_ok(value, tp) else [f"{path}: {_name(value)} {value!r:.60} is not {_type_name(tp)}"]


def _typeddict(value: Any, tp: Any, path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: {_name(value)} is not a {tp.__name__}"]
    hints = typing.get_type_hints(tp, include_extras=True)
    out = [f"{path}.{k}: not a key of {tp.__name__}" for k in value if k not in hints]
    out += [
        f"{path}.{k}: missing (required by {tp.__name__})" for k in tp.__required_keys__ if k not in value
    ]
    return out + [m for k, v in value.items() if k in hints for m in mismatches(v, hints[k], f"{path}.{k}")]


def _key_ok(key: Any, tp: type) -> bool:
    if tp is int:  # a dict with int keys read back from JSON has them as text
        return (isinstance(key, int) and not isinstance(key, bool)) or (
            isinstance(key, str) and key.isdigit()
        )
    return isinstance(key, tp)


def _scalar_ok(value: Any, tp: Any) -> bool:
    if tp is type(None):
        return value is None
    if tp is float:  # JSON has numbers: an integral one may be read back as an int
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp in (str, bool):
        return isinstance(value, tp)
    raise TypeError(f"no check for {tp!r}")


def _json_safe(value: Any, path: str) -> list[str]:
    if value is None or isinstance(value, (str, bool, int, float)):
        return []
    if isinstance(value, list):
        return [m for i, v in enumerate(value) for m in _json_safe(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [m for k, v in value.items() for m in _json_safe(v, f"{path}.{k}")]
    return [f"{path}: {_name(value)} is not JSON"]


def _name(value: Any) -> str:
    return type(value).__name__


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
