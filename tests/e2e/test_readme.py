"""Every README example runs as pasted.

Blocks fenced as ``python`` run as one script, ``ipython`` blocks as notebook cells (a blank line
between cells) in a real kernel after the Python, ``sh`` blocks line by line in bash, in a directory
holding a ``train.py`` and a ``.venv`` that is this environment. Unmarked blocks are output samples,
diagrams and the ``make`` commands, which CI runs itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from paths import REPO

pytestmark = pytest.mark.slow


FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall((REPO / "README.md").read_text()) if lang == language]


def test_the_readme_has_examples_of_each_kind() -> None:
    assert blocks("python") and blocks("ipython") and blocks("sh")


def test_python_and_notebook_examples_run(tmp_path: Path) -> None:
    from nbclient import NotebookClient

    cells = ["\n".join(blocks("python"))]
    cells += [cell.strip() for block in blocks("ipython") for cell in re.split(r"\n\s*\n", block)]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    shown = " ".join(str(o.get("data", {}).get("text/plain", "")) for c in nb.cells for o in c.outputs)
    assert "perfmagic report" in shown and (tmp_path / "after.html").is_file()


def test_shell_examples_run(tmp_path: Path) -> None:
    shutil.copy(REPO / "tests" / "scripts" / "train_plain.py", tmp_path / "train.py")
    (tmp_path / ".venv").symlink_to(sys.prefix)  # `source .venv/bin/activate`: this environment
    for block in blocks("sh"):  # -x: the failing line is the last one bash echoes
        done = subprocess.run(
            ["bash", "-exc", block], cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert (tmp_path / "report.json").is_file() and (tmp_path / "traced.json").is_file()
