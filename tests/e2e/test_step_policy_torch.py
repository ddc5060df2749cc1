"""The step policy on real torch loops: every iteration is a step, whatever marks it."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import perfmagic

torch = pytest.importorskip("torch")

LOOPS = """\
import torch

model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Flatten(), torch.nn.Linear(16 * 8, 50))
criterion = torch.nn.CrossEntropyLoss()
data = torch.randint(0, 50, (36 * 4, 8))


def get_batch(i):
    return data[i * 4 : (i + 1) * 4], data[i * 4 : (i + 1) * 4, 0]


def train_by_hand(iterations):  # pytorch/examples word_language_model: no optimizer, no DataLoader
    model.train()
    for i in range(iterations):
        x, y = get_batch(i)
        model.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)


def infer(iterations):  # no backward, no optimizer, no DataLoader: nothing marks a step
    with torch.no_grad():
        for i in range(iterations):
            x, _ = get_batch(i)
            out = model(x)
            out.argmax(dim=1)
"""


@pytest.fixture
def loops(tmp_path: Path) -> ModuleType:
    """The loops as a module in a file of its own (the report reads its lines back)."""
    path = tmp_path / "loops.py"
    path.write_text(LOOPS)
    spec = importlib.util.spec_from_file_location("loops", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_loop_that_updates_by_hand_gets_every_step(loops: ModuleType, tmp_path: Path) -> None:
    with perfmagic.profile(outdir=tmp_path / "out") as session:
        loops.train_by_hand(35)
    report = session.report.to_dict()
    assert report["steps"]["count"] == 35 and report["steps"]["boundary"] == "backward"
    shares = {s: v["fraction"] for s, v in report["stages"].items()}
    assert shares["forward"] > 0 and shares["backward"] > 0 and shares["optimizer"] > 0, shares


def test_an_optimizer_loop_is_delimited_by_its_optimizer_steps(loops: ModuleType, tmp_path: Path) -> None:
    optimizer = torch.optim.SGD(loops.model.parameters(), lr=0.1)
    with perfmagic.profile(outdir=tmp_path / "out") as session:
        for i in range(12):
            x, y = loops.get_batch(i)
            optimizer.zero_grad()
            loops.criterion(loops.model(x), y).backward()
            optimizer.step()
    steps = session.report.to_dict()["steps"]
    assert (steps["count"], steps["boundary"]) == (12, "optimizer")


def test_a_loop_with_no_rhythm_is_told_where_to_call_step(
    loops: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the user's directory: the file is named relative to it
    with perfmagic.profile(outdir=tmp_path / "out") as session:
        loops.infer(10)
    report = session.report
    steps = report.to_dict()["steps"]
    lines = LOOPS.splitlines()
    infer = next(i for i, line in enumerate(lines) if line.startswith("def infer("))
    loop_line = lines.index("        for i in range(iterations):", infer) + 1
    last_line = lines.index("            out.argmax(dim=1)") + 1
    call_line = lines.index("            out = model(x)") + 1
    assert steps["count"] == 0
    assert steps["hint"] == (
        f"add perfmagic.step() as the last line of the body of the loop at loops.py:{loop_line} "
        f"(after line {last_line}): that loop calls the model at line {call_line}"
    )
    assert steps["hint"] in str(report) and steps["hint"] in " ".join(report.to_dict()["warnings"])


def test_the_hint_is_right_when_pasted(loops: ModuleType, tmp_path: Path) -> None:
    """perfmagic.step() placed where the hint says gives one step per iteration."""
    source = Path(loops.__file__).read_text().splitlines()
    with perfmagic.profile(outdir=tmp_path / "first") as session:
        loops.infer(3)
    hint = session.report.to_dict()["steps"]["hint"]
    after = int(hint.split("(after line ")[1].split(")")[0])
    indent = source[after - 1][: len(source[after - 1]) - len(source[after - 1].lstrip())]
    source.insert(after, f"{indent}perfmagic.step()")
    fixed = tmp_path / "fixed.py"
    fixed.write_text("import perfmagic\n" + "\n".join(source) + "\n")
    namespace: dict[str, object] = {}
    exec(compile(fixed.read_text(), str(fixed), "exec"), namespace)
    with perfmagic.profile(outdir=tmp_path / "second") as session:
        namespace["infer"](10)  # type: ignore[operator]
    assert session.report.to_dict()["steps"]["count"] == 10
    assert textwrap.dedent(source[after]).strip() == "perfmagic.step()"
