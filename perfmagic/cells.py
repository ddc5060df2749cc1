"""A ``%%gpuprofile`` cell's errors, shown as IPython shows the same cell's without the magic.

IPython turns a cell that starts with a cell magic into one line,
``get_ipython().run_cell_magic('gpuprofile', line, body)``, and the magic compiles and runs the
body. Left at that, a traceback starts at that line (the whole cell printed as a string), goes
through IPython's frames and the magic's, and numbers the body's lines from 1 below the magic's;
a syntax error shows perfmagic's and IPython's frames. So:

- the body is compiled under the cell's execution count with its lines numbered as IPython
  numbers a cell's (the magic's line is line 1), and the cell's text is cached under that name
  with the magic's line on top: a traceback says ``Cell In[5], line 4`` and shows the lines around it;
- a syntax error is raised while IPython transforms the cell (:func:`syntax_check`, one of its
  cleanup input transformers), before anything runs, as IPython raises a plain cell's when it
  compiles it: shown the same way, the error alone;
- an exception raised in the body is shown from the body's frame down (:func:`shown_from_body`:
  IPython's ``_render_traceback_`` protocol), without the frames that ran the magic.

IPython is never imported here: the shell is the caller's.
"""

from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Callable
from types import CodeType, TracebackType
from typing import Any

MAGIC = "%%gpuprofile"
_MAGIC_LINE = re.compile(re.escape(MAGIC) + r"(\s|$)")


def compile_body(
    shell: Any, line: str, body: str, source: str, number: int
) -> tuple[CodeType, CodeType | None, str]:
    """The body of cell ``number`` (``%%gpuprofile line`` then ``body``; ``source``, the body as
    ``shell.transform_cell`` made it) as IPython would run the cell: its code less a last expression,
    that expression (or None), and the file name both were compiled under."""
    tree, filename = _parsed(shell, line, body, source, number)
    tree = shell.transform_ast(tree)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = shell.compile(ast.Expression(tree.body.pop().value), filename, "eval")
    return shell.compile(tree, filename, "exec"), last, filename


def _parsed(shell: Any, line: str, body: str, source: str, number: int) -> tuple[ast.Module, str]:
    """The body's syntax tree at the cell's own line numbers, and the name its cell text is cached under.

    IPython drops a cell's leading blank lines before numbering it: the magic's line is line 1, and
    the body's own leading blank lines (which ``transform_cell`` dropped) come between."""
    above = 1 + next((i for i, text in enumerate(body.splitlines()) if text.strip()), 0)
    header = f"{MAGIC} {line}".rstrip() + "\n" * above
    filename: str = shell.compile.cache(header + source, number, raw_code=body)
    tree: ast.Module = shell.compile.ast_parse("\n" * above + source, filename=filename)
    return tree, filename


def syntax_check(shell: Any) -> Callable[[list[str]], list[str]]:
    """An input transformer (for ``shell.input_transformers_cleanup``) that raises a ``%%gpuprofile``
    cell's syntax error as IPython transforms the cell, named and numbered as without the magic."""

    def check(lines: list[str]) -> list[str]:
        if lines and _MAGIC_LINE.match(lines[0]):
            body = "".join(lines[1:])
            line = lines[0][2:].rstrip().partition(" ")[2]  # what IPython hands the magic as its line
            try:  # the cell runs under the count the shell has now: it counts the cell once it runs it
                _parsed(shell, line, body, shell.transform_cell(body), int(shell.execution_count))
            except SyntaxError:
                raise
            except Exception:  # anything else is the magic's to report when it runs, as before
                pass
        return lines

    check.has_side_effects = True  # type: ignore[attr-defined]  # caches the cell: not for check_complete
    check.perfmagic = True  # type: ignore[attr-defined]
    return check


def shown_from_body(exc: BaseException, shell: Any, filename: str) -> None:
    """Have IPython show ``exc``, raised in the body compiled as ``filename``, from the body's frame down.

    The exception carries its rendering (IPython's ``_render_traceback_``), made when it is shown,
    in the shell's traceback mode then. One raised outside the body, or one whose class renders its
    own traceback, is left as it is."""
    if _body_entry(exc.__traceback__, filename) is None or hasattr(exc, "_render_traceback_"):
        return

    def render() -> list[str]:
        tb = _body_entry(exc.__traceback__, filename)
        formatter = shell.InteractiveTB
        if tb is None:  # re-raised from elsewhere since: its traceback as it is
            return list(formatter.structured_traceback(type(exc), exc, exc.__traceback__))
        return list(formatter.structured_traceback(type(exc), exc, tb, tb_offset=0))

    # an exception that takes no attributes keeps IPython's own display
    with contextlib.suppress(AttributeError, TypeError):
        exc._render_traceback_ = render  # type: ignore[attr-defined]


def _body_entry(tb: TracebackType | None, filename: str) -> TracebackType | None:
    """The first entry of ``tb`` in code compiled as ``filename``, if any."""
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    return tb
