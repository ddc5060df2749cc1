"""A failing training loop shows the traceback it shows without perfmagic: in a notebook cell under
``%%gpuprofile`` (a real kernel) and in a script under ``perfmagic run`` (real subprocesses).

The same loop fails four ways: in the innermost of modules within modules, in its Dataset's
``__getitem__``, by a syntax error, and by Ctrl-C (a SIGINT the loop sends itself from the innermost
forward: where it lands does not depend on timing).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

DEFINITIONS = '''\
import os, signal
import torch
from torch.utils.data import DataLoader, Dataset

FAIL_AT = 3  # steps trained before the failure


class Innermost(torch.nn.Module):
    """The innermost of modules within modules: fails, or presses Ctrl-C, after FAIL_AT steps."""

    def __init__(self, failure):
        super().__init__()
        self.failure, self.calls = failure, 0

    def forward(self, x):
        self.calls += 1
        if self.calls > FAIL_AT and self.failure == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)
        if self.calls > FAIL_AT and self.failure == "raise":
            raise ValueError("the innermost forward failed")
        return torch.relu(x)


class Block(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.linear, self.inner = torch.nn.Linear(8, 8), inner

    def forward(self, x):
        return self.inner(self.linear(x))


def model_of(failure):
    model = Innermost(failure)
    for _ in range(3):
        model = Block(model)
    return model


class Samples(Dataset):
    """Samples whose __getitem__ fails from the batch after FAIL_AT on, if asked."""

    def __init__(self, fail):
        self.fail = fail

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if self.fail and i >= FAIL_AT * 4:
            raise KeyError(f"no sample {i}")
        return torch.randn(8), torch.randn(8)


def train(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

LOOPS = {
    "nested modules": ('"raise"', "False"),
    "DataLoader": ("None", "True"),
    "Ctrl-C": ('"interrupt"', "False"),
}
"""How the loop fails: the model's failure, and whether the Dataset fails."""

SYNTAX_ERROR = "train(model, loader\n"


def loop(failure: str, head: str = "", workers: int = 0) -> str:
    """The failing training loop, its call on line 6 (below the lines IPython shows around it), its
    DataLoader with ``workers`` worker processes."""
    model, samples = LOOPS.get(failure, ("None", "False"))
    return (
        f"{head}\n"
        f"model = model_of({model})\n"
        f"samples = Samples(fail={samples})\n"
        f"loader = DataLoader(samples, batch_size=4, num_workers={workers})\n"
        "# then the loop itself\n" + (SYNTAX_ERROR if failure == "SyntaxError" else "train(model, loader)\n")
    )


FAILURES = [*LOOPS, "SyntaxError"]
MAGIC = "%%gpuprofile"
PERFMAGIC_RUN = [sys.executable, "-m", "perfmagic.cli", "run"]
PLAIN = "# the same cell, without the magic"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_notebook(cells: list[str], path: Path) -> Any:
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    NotebookClient(
        nb, kernel_name="python3", timeout=300, allow_errors=True, resources={"metadata": {"path": str(path)}}
    ).execute()
    return nb


def error_text(cell: Any) -> str:
    (error,) = [o for o in cell.outputs if o.output_type == "error"]
    return ANSI.sub("", "\n".join(error.traceback))


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    """The failing cells run plain, then under the magic, each in its own kernel (so that their cells
    have the same numbers); the magic's kernel then runs the cells of the test of a failure before
    training."""
    path = tmp_path_factory.mktemp("tracebacks")
    setup = "%load_ext perfmagic\n" + DEFINITIONS
    plain = run_notebook([setup, *(loop(f, PLAIN) for f in FAILURES)], path)
    before_training = [
        "after = 'kept'",
        f"%%gpuprofile -v after --json {path / 'after.json'}\nundefined_name\n"
        "train(model_of(None), DataLoader(Samples(fail=False), batch_size=4))\n",
        "print(repr(after))",
    ]
    magic = run_notebook([setup, *(loop(f, MAGIC) for f in FAILURES), *before_training], path)
    return plain, magic, path


@pytest.mark.parametrize("failure", FAILURES)
def test_a_cells_traceback_is_the_one_it_shows_without_the_magic(
    notebooks: tuple[Any, Any, Path], failure: str
) -> None:
    plain, magic = notebooks[0], notebooks[1]
    index = 1 + FAILURES.index(failure)
    shown, expected = error_text(magic.cells[index]), error_text(plain.cells[index])
    assert f"Cell In[{index + 1}], line 6" in expected  # the failing line, in this cell
    assert PLAIN not in expected, "the cell's first line is out of the traceback's view"
    assert shown == expected
    if failure != "SyntaxError":  # the loop trained FAIL_AT steps: the report of what ran is shown
        assert any("pm-report" in o.get("data", {}).get("text/html", "") for o in magic.cells[index].outputs)


def test_a_cell_failing_before_training_shows_its_traceback_and_keeps_v(
    notebooks: tuple[Any, Any, Path],
) -> None:
    magic, path = notebooks[1], notebooks[2]
    failed, printed = magic.cells[-2], magic.cells[-1]
    assert "NameError: name 'undefined_name' is not defined" in error_text(failed)
    assert "Cell In[" in error_text(failed) and "line 2" in error_text(failed)
    shown = [o for o in failed.outputs if o.output_type != "error"]
    lines = [line for o in shown for line in o.get("data", {}).get("text/plain", "").splitlines() if line]
    assert len(lines) <= 1, lines  # a one-line note at most
    assert not any("pm-report" in str(o) or "No training steps" in str(o) for o in shown)
    assert printed.outputs[0].text.strip() == "'kept'"  # -v left the variable as it was
    assert not (path / "after.json").exists()  # and --json wrote no empty report


@pytest.mark.parametrize("failure", FAILURES)
def test_a_scripts_traceback_under_perfmagic_run_is_the_plain_one(tmp_path: Path, failure: str) -> None:
    script = tmp_path / "train_failing.py"
    # DataLoader workers format their error in the worker: perfmagic times their fetches there
    script.write_text(DEFINITIONS + loop(failure, workers=2 if failure == "DataLoader" else 0))
    plain = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    profiled = subprocess.run(
        [*PERFMAGIC_RUN, "--outdir", str(tmp_path / "run"), "--", sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    expected = same_lines(plain.stderr.strip())
    name = {"nested modules": "ValueError", "DataLoader": "KeyError", "Ctrl-C": "KeyboardInterrupt"}
    assert expected.splitlines()[-1].startswith(name.get(failure, failure)), plain.stderr
    assert expected in same_lines(profiled.stderr), profiled.stderr


def same_lines(text: str) -> str:
    """``text`` with the line of torch's ``_next_data`` that ran left out: one line if the workers' batch
    was there when asked for, another if it had to be waited for (a race of torch's, with or without
    perfmagic)."""
    return re.sub(r"line \d+, in _next_data", "line …, in _next_data", text)
