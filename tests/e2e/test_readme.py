"""Every example of the README and of docs/*.md runs as pasted.

Fences, in each file: ``python`` blocks run as one script, ``ipython`` blocks as notebook cells (a
blank line between cells) in a real kernel after that file's Python, ``sh`` blocks line by line in
bash, in a directory holding a ``train.py`` and a ``.venv`` that is this environment. Unmarked blocks
are output samples, diagrams and the ``make`` commands, which CI runs itself. A block right after a
``<!-- skip: reason -->`` line (one that needs a GPU or a cluster, or never ends) is not run: it is a
skipped case of its own, with the reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import nbformat
import pytest
from paths import REPO

pytestmark = pytest.mark.slow

FENCE = re.compile(r"^(?:<!-- skip: (?P<skip>.+?) -->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.M | re.S)
RUN = ("python", "ipython", "sh")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# What each file's examples leave behind, beside running without an error.
WRITES = {
    "README.md": {"notebook": ["after.html"], "sh": ["report.json", "traced.json"]},
    "guide.md": {"notebook": ["report.html", "trace.json.gz", "large.json"], "sh": ["run.json", "job.json"]},
}


class Block(NamedTuple):
    lang: str
    body: str
    skip: str | None
    line: int


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(m["lang"], m["body"], m["skip"], text.count("\n", 0, m.start("body")) + 1)
        for m in FENCE.finditer(text)
    ]


def runnable(path: Path, *langs: str) -> list[str]:
    return [b.body for b in blocks(path) if b.lang in langs and b.skip is None]


def name(path: Path) -> str:
    return str(path.relative_to(REPO))


def with_blocks(*langs: str) -> list[Path]:
    return [p for p in DOCS if runnable(p, *langs)]


SKIPPED = [(p, b) for p in DOCS for b in blocks(p) if b.skip is not None]


def test_the_readme_has_examples_of_each_kind() -> None:
    for lang in RUN:
        assert runnable(REPO / "README.md", lang), lang


@pytest.mark.parametrize("path", DOCS, ids=name)
def test_every_fence_is_known(path: Path) -> None:
    """A typo in a fence's language would silently make an example a sample."""
    unknown = [(b.line, b.lang) for b in blocks(path) if b.lang not in ("", *RUN)]
    assert not unknown, f"{name(path)}: fences of unknown language (line, language): {unknown}"


@pytest.mark.parametrize("path", with_blocks("python", "ipython"), ids=name)
def test_python_and_notebook_examples_run(path: Path, tmp_path: Path) -> None:
    from nbclient import NotebookClient

    cells = ["\n".join(runnable(path, "python"))]
    cells += [cell.strip() for block in runnable(path, "ipython") for cell in re.split(r"\n\s*\n", block)]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells if c])
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{name(path)}: {errors}"
    shown = " ".join(str(o.get("data", {}).get("text/plain", "")) for c in nb.cells for o in c.outputs)
    shown += " ".join(str(o.get("text", "")) for c in nb.cells for o in c.outputs)
    assert "perfmagic" in shown, f"{name(path)}: no report shown"
    for written in WRITES.get(path.name, {}).get("notebook", []):
        assert (tmp_path / written).exists(), f"{name(path)}: {written} not written"


@pytest.mark.parametrize("path", with_blocks("sh"), ids=name)
def test_shell_examples_run(path: Path, tmp_path: Path) -> None:
    shutil.copy(REPO / "tests" / "scripts" / "train_plain.py", tmp_path / "train.py")
    (tmp_path / ".venv").symlink_to(sys.prefix)  # `source .venv/bin/activate`: this environment
    for block in runnable(path, "sh"):  # -x: the failing line is the last one bash echoes
        done = subprocess.run(
            ["bash", "-exc", block], cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{name(path)}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    for written in WRITES.get(path.name, {}).get("sh", []):
        assert (tmp_path / written).is_file(), f"{name(path)}: {written} not written"


@pytest.mark.parametrize("path, block", SKIPPED, ids=[f"{name(p)}:{b.line}" for p, b in SKIPPED] or None)
def test_examples_marked_skip(path: Path, block: Block) -> None:
    assert block.lang in RUN, f"{name(path)}:{block.line}: a skip mark on a sample block"
    pytest.skip(f"{name(path)}:{block.line}: {block.skip}")
