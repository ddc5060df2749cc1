"""What every report must say of itself, checked on every report the tests build (see conftest)."""

from __future__ import annotations

import re
from typing import Any

from perfmagic.advise.plan import knob_changes

SHELL = re.compile(
    r"^([A-Z_]+=\S+ )*(ps|numactl|python|renice|py-spy|nsys|nvidia-smi|torchrun|perfmagic|pip)\s"
)
"""Fix lines that are shell commands; every other line of a fix is Python and must compile."""
PLACEHOLDER = re.compile(r"\?|<[a-z][a-z ]*>|\bNone\b|\bnan\b")
"""What a fix must never show: an unknown (``?``, ``<cpus of node>``), or a value nobody measured."""


def assert_one_plan(cards: list[dict[str, Any]]) -> None:
    """No fix sets a knob to the value it already has, and no two cards set one knob to different values."""
    chosen: dict[str, tuple[str, str]] = {}
    for card in cards:
        for knob, (new, old) in knob_changes(card.get("fix") or "").items():
            assert new != old, f"{card['id']}: a fix that sets what already is ({knob}={new}, was {old})"
            other = chosen.setdefault(knob, (new, card["id"]))
            assert other[0] == new, f"{knob}: {other[1]} says {other[0]}, {card['id']} says {new}"


def assert_plan_adds_up(report: dict[str, Any]) -> None:
    """Each card with a per-step saving is a change of the plan, with its marginal saving, and the
    changes' savings are the observed step less the predicted one."""
    plan = report.get("plan")
    if plan is None:
        return
    changes = {c["id"]: c for c in plan["changes"]}
    total = sum(c["saving_s"] for c in plan["changes"])
    assert abs(total - (plan["step_s"] - plan["predicted_step_s"])) < 1e-9, plan
    aside = {a["id"] for a in plan["set_aside"]}
    for card in [*(report.get("advice") or []), *(report.get("advice_minor") or [])]:
        assert card["id"] not in aside, f"{card['id']}: set aside from the plan, yet shown"
        if card["id"] in changes:  # a symptom the fixes before it saved wholly says no saving (None)
            assert (card["saving_s"] or 0.0) == changes[card["id"]]["saving_s"], (card, changes[card["id"]])


def assert_consistent(report: dict[str, Any]) -> None:
    """No saving larger than its step, no placeholder in a fix, a headline that agrees with the stage table,
    and the cards' fixes one plan (:func:`assert_one_plan`, :func:`assert_plan_adds_up`)."""
    assert_one_plan(report.get("advice") or [])
    assert_plan_adds_up(report)
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
