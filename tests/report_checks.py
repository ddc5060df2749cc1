"""What every report must say of itself, checked on every report the tests build (see conftest)."""

from __future__ import annotations

import re
from typing import Any

SHELL = re.compile(
    r"^([A-Z_]+=\S+ )*(ps|numactl|python|renice|py-spy|nsys|nvidia-smi|torchrun|perfmagic|pip)\s"
)
"""Fix lines that are shell commands; every other line of a fix is Python and must compile."""
PLACEHOLDER = re.compile(r"\?|<[a-z][a-z ]*>|\bNone\b|\bnan\b")
"""What a fix must never show: an unknown (``?``, ``<cpus of node>``), or a value nobody measured."""


CHANGE = re.compile(r"([A-Za-z_][\w.]*)\s*[=(]\s*([^\s,()#]+)\)?,?\s*#\s*was\s+([^\s,;)]+)")
"""A fix line that changes a setting, with the value it had: ``num_workers=2,  # was 0``,
``torch.set_num_threads(1)  # was 2`` (the knob, the new value, the old one)."""


def knob_changes(fix: str) -> dict[str, tuple[str, str]]:
    """The settings a fix changes: knob -> (new value, the value it was)."""
    found = (CHANGE.search(line) for line in fix.splitlines())
    return {m.group(1): (m.group(2), m.group(3)) for m in found if m}


def assert_one_plan(cards: list[dict[str, Any]]) -> None:
    """No fix sets a knob to the value it already has, and no two cards set one knob to different values."""
    chosen: dict[str, tuple[str, str]] = {}
    for card in cards:
        for knob, (new, old) in knob_changes(card.get("fix") or "").items():
            assert new != old, f"{card['id']}: a fix that sets what already is ({knob}={new}, was {old})"
            other = chosen.setdefault(knob, (new, card["id"]))
            assert other[0] == new, f"{knob}: {other[1]} says {other[0]}, {card['id']} says {new}"


def assert_consistent(report: dict[str, Any]) -> None:
    """No saving larger than its step, no placeholder in a fix, a headline that agrees with the stage table,
    and the cards' fixes one plan (:func:`assert_one_plan`)."""
    assert_one_plan(report.get("advice") or [])
    for card in report.get("advice") or []:
        saving, step = card.get("saving_s"), (card.get("metrics") or {}).get("step_s")
        if saving is not None and step:
            assert 0 < saving < step, f"{card['id']}: saving {saving} of a {step} s step"
        code = "\n".join(line.split("#", 1)[0] for line in (card.get("fix") or "").splitlines())
        comments = "\n".join(line.partition("#")[2] for line in (card.get("fix") or "").splitlines())
        assert not PLACEHOLDER.search(code), f"{card['id']}: placeholder in the fix code:\n{card['fix']}"
        assert "?" not in comments, f"{card['id']}: unknown in the fix's comments:\n{card['fix']}"
        python = "\n".join(
            line for line in (card.get("fix") or "").splitlines() if not SHELL.match(line.strip())
        )
        try:
            compile(python, f"<fix of {card['id']}>", "exec")
        except SyntaxError as e:
            raise AssertionError(f"{card['id']}: the fix is not Python ({e.msg}):\n{card['fix']}") from e
    stages = report.get("stages") or {}
    if stages and sum(s["total_s"] for s in stages.values()) > 0:  # steps of no length have no shares
        assert abs(sum(s["fraction"] for s in stages.values()) - 1) < 1e-6, stages
        biggest = max(stages, key=lambda n: stages[n]["total_s"])
        bottleneck = report.get("bottleneck")
        straggler = report.get("straggler")  # the job waits for its stage, not for rank 0's largest
        assert (
            bottleneck == biggest
            or (straggler is not None and bottleneck == straggler["stage"])
            or stages[bottleneck]["total_s"] == stages[biggest]["total_s"]
        ), f"headline {bottleneck} but the largest stage is {biggest}"
