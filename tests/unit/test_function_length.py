"""No function or method in perfmagic/ is longer than 80 lines, decorators aside.

A longer one does several things at once; splitting it by meaning gives each of them a name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import perfmagic

PACKAGE = Path(perfmagic.__file__).resolve().parent
MAX_LINES = 80


def long_functions(path: Path) -> list[str]:
    """The functions of ``path`` over ``MAX_LINES``: ``file:line name (lines)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(PACKAGE.parent)
    return [
        f"{where}:{node.lineno} {node.name} ({length} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and (length := node.end_lineno - node.lineno + 1) > MAX_LINES
    ]


def test_no_function_over_80_lines() -> None:
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in long_functions(path)]
    assert not found, f"functions over {MAX_LINES} lines:\n" + "\n".join(found)
