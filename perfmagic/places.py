"""Code named as its user knows it: a notebook cell by its number, a file by its path.

ipykernel compiles each cell to a temporary file named by a hash of the cell's text
(``/tmp/ipykernel_4711/536531550.py``); IPython's compiler keeps the execution count each such
name was compiled under (``CachingCompiler._filename_map``), and IPython's tracebacks print the
cell as ``Cell In[2], line 29``. Here a line of a cell is ``In [2], line 29`` the same way, and a
line of a file ``train.py:12``: relative to the working directory where the file is under it, to
its site-packages or standard library for a library's file, else its absolute path.

The mapping lives in the kernel, so names are made in the process where the code ran (the
kernel, or a DataLoader worker forked from it, which has a copy) and stored as plain strings.
IPython is never imported here: a process that has not imported it runs no cells.

IPython numbers a cell's lines after dropping its leading blank lines, which the user's cell still
shows: they are added back. ``%%gpuprofile`` compiles its cell's body at the lines IPython gives them
in the cell (``perfmagic.cells``): a body is named as any cell is.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfmagic.contract import CodePlace


_LIBRARY_ROOTS = tuple(
    sorted(
        {
            os.path.normcase(resolve(p)) + os.sep
            for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
            for resolve in (os.path.abspath, os.path.realpath)
        },
        key=len,
        reverse=True,  # the innermost first: site-packages lies under the standard library's lib/
    )
)
"""Where libraries live, as code objects name them and with links resolved (a venv's links)."""

_PACKAGE_DIRS = tuple(
    {
        os.path.normcase(resolve(os.path.dirname(os.path.abspath(__file__)))) + os.sep
        for resolve in (os.path.abspath, os.path.realpath)
    }
)

LIBRARY_DIRS = _LIBRARY_ROOTS + _PACKAGE_DIRS
"""Directories whose code is not the user's: the standard library, installed packages, perfmagic."""

STAND_IN_FILES = frozenset(os.path.join(d, "demo.py") for d in _PACKAGE_DIRS)
"""perfmagic's files that count as the user's code though under :data:`LIBRARY_DIRS`: ``perfmagic
demo``'s training job stands for the user's, so its report names the demo's dataset and loop where a
user's would name theirs (as perfmagic's own code it was skipped, and the report named the console
script's line that started it)."""


def code_place(filename: str, line: int, function: str) -> CodePlace:
    """The line ``line`` of the code compiled as ``filename``, in ``function``, as its user knows it."""
    cell = _cell(filename)
    if cell is None:
        file, number = shown_path(filename), None
    else:
        number, offset = cell
        file, line = f"In [{number}]", line + offset
    return {
        "function": function,
        "file": file,
        "line": line,
        "cell": number,
        "where": f"{function} ({line_name(file, line, number)})",
    }


def line_name(file: str, line: int, cell: int | None) -> str:
    """``In [2], line 29`` for a cell (as Jupyter numbers cells), ``train.py:12`` for a file."""
    return f"{file}, line {line}" if cell is not None else f"{file}:{line}"


def shown_path(filename: str) -> str:
    """A file's path as its user would write it: relative to the working directory or a library root
    where it is under one, else absolute; names that are no file (``<string>``) as they are."""
    if not filename or filename.startswith("<"):
        return filename
    # few calls: the torch hooks name the line that calls each model, on the training thread
    path = filename if filename.startswith(os.sep) else os.path.abspath(filename)
    norm = os.path.normcase(path)
    if norm.startswith(_LIBRARY_ROOTS):
        for root in _LIBRARY_ROOTS:
            if norm.startswith(root):
                return path[len(root) :]
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was removed
        return path
    under = os.path.normcase(cwd if cwd.endswith(os.sep) else cwd + os.sep)
    return path[len(under) :] if norm.startswith(under) else path


def _cell(filename: str) -> tuple[int, int] | None:
    """(execution count, lines to add) of the cell compiled as ``filename``; None: it is no cell."""
    shell = _shell()
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = names.get(filename) if isinstance(names, dict) else None
    if not isinstance(number, int):
        return None
    try:
        raw = shell.history_manager.input_hist_raw[number]
    except (AttributeError, IndexError, TypeError):  # no history kept: IPython's own numbering
        raw = None
    return number, _blank_lines_on_top(raw if isinstance(raw, str) else "")


def _blank_lines_on_top(raw: str) -> int:
    """Lines of the user's cell ``raw`` above the first one IPython numbered: its leading blank lines
    (none where no history of the cell is kept: IPython's numbering)."""
    lines = raw.splitlines()
    return next((i for i, line in enumerate(lines) if line.strip()), 0)


def _shell() -> Any:
    """The IPython shell of this process (a kernel's), if one runs."""
    module = sys.modules.get("IPython.core.interactiveshell")
    return getattr(getattr(module, "InteractiveShell", None), "_instance", None)
