"""tests/unit runs on the fake clock (``tests/fakeclock.py``): no test here reads, waits for or spins on
real time, so none can flip on a busy machine. Tests that need real time live in tests/e2e."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent

CLOCK_MODULES = {"time", "timeit"}
"""Modules a unit test has no use for: every clock and sleep of the standard library is in them."""

CLOCK_CALLS = {
    f"{name}{ns}"
    for name in ("sleep", "perf_counter", "monotonic", "time", "thread_time", "process_time")
    for ns in ("", "_ns")
}
"""Clock reads and sleeps, however they were imported (``time.x()``, ``from time import x``)."""

WORDS = re.compile(r"time\.sleep|perf_counter\(\)")
"""What the repository's checks grep tests/unit for: not even in a comment or a string."""


def real_time_uses(path: Path) -> list[str]:
    """Where ``path`` reads, waits for or spins on real time: ``file:line: what``."""
    text = path.read_text(encoding="utf-8")
    found = [
        f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()!r}" for m in WORDS.finditer(text)
    ]
    clocks: set[str] = set()  # names bound to a clock function or module in this file
    for node in ast.walk(ast.parse(text, filename=str(path))):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in CLOCK_MODULES:
                    found.append(f"{where}: import {alias.name}")
                    clocks.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in CLOCK_MODULES:
            found.append(f"{where}: from {node.module} import ...")
            clocks.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Call):
            found += _clock_call(node, where)
    return found


def _clock_call(call: ast.Call, where: str) -> list[str]:
    """A sleep, a clock read or a real wait: ``asyncio.sleep``, a read of ``x.perf_counter``, ``event.wait(0.5)``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in CLOCK_CALLS:
        return [f"{where}: {name}()"]
    timed = [a for a in (*call.args, *(k.value for k in call.keywords if k.arg == "timeout"))]
    if name in ("wait", "join", "wait_for") and any(
        isinstance(a, ast.Constant) and isinstance(a.value, (int, float)) and a.value > 0 for a in timed
    ):
        return [f"{where}: {name}() with a real timeout"]
    return []


def test_no_unit_test_reads_or_waits_for_real_time() -> None:
    files = sorted(UNIT.glob("*.py"))
    assert len(files) > 10
    found = [use for path in files for use in real_time_uses(path)]
    assert not found, (
        "real time in tests/unit (use the fake_clock fixture, or move the test to tests/e2e):\n"
        + ("\n".join(found))
    )


SLEEPS = "ti" + "me.sle" + "ep"
"""Written in two halves: the repository's checks grep this folder for the whole word."""


@pytest.mark.parametrize(
    ("planted", "what"),
    [
        (f"import time\n\ndef test_x():\n    {SLEEPS}(0.1)\n", "import time"),
        ("from time import monotonic\n\ndef test_x():\n    t = monotonic()\n", "monotonic()"),
        (
            "import time as t\n\ndef test_x():\n    assert t.perf_" + "counter() - 1 < 0.5\n",
            "perf_" + "counter()",
        ),
        ("def test_x(clock):\n    while clock.thread_time() < 1:\n        pass\n", "thread_time()"),
        ("import asyncio\n\nasync def test_x():\n    await asyncio.sleep(1)\n", "sleep()"),
        ("def test_x(event):\n    assert event.wait(timeout=2.5)\n", "wait() with a real timeout"),
        ("def test_x():\n    pass  # no " + SLEEPS + " here\n", repr(SLEEPS)),
    ],
)
def test_the_check_finds_a_planted_use_of_real_time(tmp_path: Path, planted: str, what: str) -> None:
    path = tmp_path / "test_planted.py"
    path.write_text(planted, encoding="utf-8")
    found = real_time_uses(path)
    assert any(use.endswith(what) for use in found), found


def test_the_check_leaves_fake_time_alone(tmp_path: Path) -> None:
    path = tmp_path / "test_fake.py"
    path.write_text(
        "def test_x(fake_clock):\n    fake_clock.advance(0.5)\n    assert fake_clock.now() == 1000.5\n"
        "    thread.join()\n",
        encoding="utf-8",
    )
    assert real_time_uses(path) == []
