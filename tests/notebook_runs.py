"""Run a notebook of code cells in a real kernel, as a user would, and read what its last cell printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run_cells(cells: list[str], cwd: Path, timeout: int = 300) -> Any:
    """The notebook of ``cells``, executed top to bottom in a fresh python3 kernel started in ``cwd``."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    NotebookClient(
        nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(cwd)}}
    ).execute()
    return nb


def printed_json(nb: Any) -> Any:
    """The JSON the notebook's last cell printed."""
    return json.loads("".join(o["text"] for o in nb.cells[-1].outputs if o.get("name") == "stdout"))
