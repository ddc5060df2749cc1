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
    assert_headline_agrees(report)
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


COMPUTE_STAGES = frozenset({"forward", "backward", "optimizer"})
"""The step's own work: a compute-bound headline names where a tuned step's time goes, not a fault,
and compute_bound's card is dropped beside any medium or high card by design."""


def assert_headline_agrees(report: dict[str, Any]) -> None:
    """The stage the headline names as bound is addressed, and no card about it says otherwise.

    Addressed: a card or minor card about that stage (``advise.about.addresses``: the catalog's
    stages, the straggler's stage), the stage's code listed (a hotspot line), a rule that failed (a
    warning says its card is missing), or the headline naming the card of its cause.
    """
    from perfmagic.advise.about import addresses
    from perfmagic.advise.headline import BOUND, headline
    from perfmagic.render.text import hotspot_lines

    name = report.get("bottleneck")
    if (
        not name
        or not (report.get("steps") or {}).get("count")
        or name in COMPUTE_STAGES
        or name not in BOUND
    ):
        return  # no verdict, the step's own work, or no bound named (untracked work, the user's own stage)
    cards = report.get("advice") or []
    fired = [*cards, *(report.get("advice_minor") or [])]
    about = [c for c in fired if addresses(c, name)]
    said = headline(report)  # type: ignore[arg-type]
    addressed = (
        about
        or any(line.startswith(f"{name} (") for line in hotspot_lines(report))  # type: ignore[arg-type]
        or any(c["title"] in said for c in cards)
        or any(w.startswith("advice rule ") and "failed" in w for w in report.get("warnings") or [])
    )
    ids = [c["id"] for c in fired]
    assert addressed, (
        f"headline {said!r}, but no card, minor card or listed explanation addresses {name}: {ids}"
    )
    if len(report.get("ranks") or []) > 1:
        return  # a job's cards weigh every rank; the headline's share is one rank's
    share = report["stages"][name]["fraction"]
    for card in (c for c in cards if addresses(c, name)):
        measured = (card.get("metrics") or {}).get(f"{name}_share")
        assert measured is None or abs(measured - share) < 5e-3, (
            f"headline {said!r}, but {card['id']} says {name} takes {measured:.1%} of the step"
        )
