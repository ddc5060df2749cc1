"""Where to call ``perfmagic.step()`` when nothing in the window marked a step.

The torch hooks note the user's line that first called each model (the ``model``
mark's ``call_site``). A training loop calls its model inside the loop body: the
innermost ``for`` or ``while`` around that line, found in the source (scripts,
and notebook cells while their kernel runs), is where the call goes, as the
body's last statement.
"""

from __future__ import annotations

import ast
import linecache
import os
from collections.abc import Callable
from typing import Any

from perfmagic.places import line_name
from perfmagic.step_policy import MARK_STEP_HINT
from perfmagic.timeline import Timeline


def step_hint(timeline: Timeline) -> str | None:
    """A sentence naming the line after which to call ``perfmagic.step()``; None where no model was called."""
    site = next((m.data.get("call_site") for m in timeline.marks("model") if m.data.get("call_site")), None)
    if not isinstance(site, dict) or not site.get("file") or not isinstance(site.get("line"), int):
        return None
    file, line = str(site["file"]), int(site["line"])
    named = _named(site, file, line)
    loop = _enclosing_loop(file, line)
    if loop is None:
        return f"call {MARK_STEP_HINT} at the end of each training step; the model is called at {named(line)}"
    first, last = loop
    return (
        f"add {MARK_STEP_HINT} as the last line of the body of the loop at {named(first)} "
        f"(after line {named(last, bare=True)}): that loop calls the model at line {named(line, bare=True)}"
    )


def _named(site: dict[str, Any], file: str, line: int) -> Callable[..., str]:
    """Names for lines of the call site's cell or file, as its user knows them (``place``, resolved where
    the model was called: ``In [3], line 5``); a record without it names the file by its base name."""
    place = site.get("place")
    if isinstance(place, dict) and isinstance(place.get("line"), int):
        shown, cell, offset = str(place["file"]), place.get("cell"), int(place["line"]) - line
    else:
        shown, cell, offset = (os.path.basename(file) if not file.startswith("<") else file), None, 0

    def named(n: int, bare: bool = False) -> str:
        return str(n + offset) if bare else line_name(shown, n + offset, cell)

    return named


def _enclosing_loop(file: str, line: int) -> tuple[int, int] | None:
    """(first line, last line of the body) of the innermost loop around ``line`` in ``file``."""
    source = "".join(linecache.getlines(file))
    if not source:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    best: Any = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and node.body:
            end = node.body[-1].end_lineno or node.body[-1].lineno
            if node.lineno <= line <= end and (best is None or node.lineno > best.lineno):
                best = node
    if best is None:
        return None
    return best.lineno, best.body[-1].end_lineno or best.body[-1].lineno
