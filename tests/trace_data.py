"""The real GPU traces in ``tests/data`` (HolisticTraceAnalysis's test data, MIT; see its README)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"


def real(name: str) -> Path:
    """The path of one of the real traces; a missing one is an error, not a skip."""
    path = DATA / name
    if not path.exists():
        raise FileNotFoundError(f"real trace {name} not found in {DATA}: it is part of the repository")
    return path


def raw(path: Path) -> dict[str, Any]:
    """A gzipped trace's JSON document, as the standard library reads it."""
    with gzip.open(path) as f:
        doc: dict[str, Any] = json.load(f)
    return doc
