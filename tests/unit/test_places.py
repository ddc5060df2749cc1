"""Code named as its user knows it: a kernel's temporary cell files as ``In [N], line L``, files by path.

The shell here is a stand-in for a kernel's: IPython's compiler maps each cell's file name to its
execution count (``_filename_map``), and its input history keeps each cell as the user typed it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from types import FrameType, SimpleNamespace

import pytest

from perfmagic import places
from perfmagic.places import code_place, line_name, shown_path

CELL_FILE = "/tmp/ipykernel_4711/536531550.py"
BODY_FILE = "/tmp/ipykernel_4711/977005114.py"


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A kernel's shell that ran three cells: the second with two blank lines on top, the third a
    ``%%gpuprofile`` cell with a blank line on top, whose body (compiled apart by the magic, at the lines
    IPython gives them in the cell) starts after a blank line."""
    history = [
        "",
        "%load_ext perfmagic",
        "\n\nimport numpy as np\n\ndef spectrum(x):\n    return np.fft.fft2(x)\n",
        "\n%%gpuprofile --quiet\n\nfor x, y in loader:\n    step(x, y)\n",
    ]
    shell = SimpleNamespace(
        compile=SimpleNamespace(_filename_map={CELL_FILE: 2, BODY_FILE: 3}),
        history_manager=SimpleNamespace(input_hist_raw=history),
    )
    module = SimpleNamespace(InteractiveShell=SimpleNamespace(_instance=shell))
    monkeypatch.setitem(sys.modules, "IPython.core.interactiveshell", module)
    return shell


def test_a_cell_is_named_by_its_number_and_the_line_the_user_sees(kernel: SimpleNamespace) -> None:
    # IPython compiled the cell without its two leading blank lines: its line 4 is the user's line 6
    place = code_place(CELL_FILE, 4, "spectrum")
    assert place == {
        "function": "spectrum",
        "file": "In [2]",
        "line": 6,
        "cell": 2,
        "where": "spectrum (In [2], line 6)",
    }


def test_a_magic_cells_body_is_named_as_any_cell(kernel: SimpleNamespace) -> None:
    # the body as compiled: "step(x, y)" is the cell's line 4 in IPython's numbering (the magic's line is
    # line 1), below the blank line the user's cell starts with
    assert code_place(BODY_FILE, 4, "<module>")["where"] == "<module> (In [3], line 5)"


def test_without_the_history_a_cell_keeps_ipythons_numbering(kernel: SimpleNamespace) -> None:
    kernel.history_manager = None
    assert code_place(CELL_FILE, 4, "spectrum")["where"] == "spectrum (In [2], line 4)"
    assert code_place(BODY_FILE, 4, "<module>")["where"] == "<module> (In [3], line 4)"


def test_a_cell_file_of_no_running_kernel_stays_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython.core.interactiveshell", raising=False)
    place = code_place(CELL_FILE, 29, "__getitem__")
    assert place["cell"] is None and place["where"] == f"__getitem__ ({CELL_FILE}:29)"


def test_files_are_named_relative_to_the_working_directory_or_their_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "sub" / "train.py"
    assert code_place(str(script), 12, "train")["where"] == f"train ({os.path.join('sub', 'train.py')}:12)"
    elsewhere = "/opt/elsewhere/data.py"
    assert shown_path(elsewhere) == elsewhere
    site = sysconfig.get_paths()["purelib"]
    assert shown_path(os.path.join(site, "torch", "utils", "data", "dataloader.py")) == os.path.join(
        "torch", "utils", "data", "dataloader.py"
    )
    assert shown_path("<string>") == "<string>"


def test_a_line_is_named_the_way_its_kind_is_read() -> None:
    assert line_name("In [7]", 3, 7) == "In [7], line 3"
    assert line_name("train.py", 3, None) == "train.py:3"


def test_the_demos_dataset_is_named_as_the_users_code_the_rest_of_perfmagic_is_not() -> None:
    """``perfmagic demo`` stands for a user's job: its data hot spot names its dataset's augmentation
    (perfmagic's own code is skipped, and the report named the console script's line instead)."""
    pytest.importorskip("torch")
    import numpy as np

    import perfmagic.demo
    from perfmagic.collect.stacks import is_user_file, line_place, sampled_line

    assert is_user_file(perfmagic.demo.__file__)
    assert not is_user_file(places.__file__) and not is_user_file(np.__file__)
    _, _, loader = perfmagic.demo.build_job(samples=1)
    seen = []

    def tick(frame: FrameType, event: str, arg: object) -> None:  # a sample taken inside numpy's roll
        if event == "call" and frame.f_code.co_name == "roll" and not seen:
            seen.append(line_place(sampled_line(frame)))

    sys.setprofile(tick)
    try:
        loader.dataset[0]
    finally:
        sys.setprofile(None)
    (where,) = seen
    assert where["function"] == "__getitem__" and where["file"].endswith(os.path.join("perfmagic", "demo.py"))
    source = Path(perfmagic.demo.__file__).read_text().splitlines()[where["line"] - 1]
    assert "np.roll(image" in source  # the augmentation's own line
