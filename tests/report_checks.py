"""What every report must say of itself, checked on every report the tests build (see conftest)."""

from __future__ import annotations

import ast
import builtins
import linecache
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

from perfmagic.advise.plan import knob_changes

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
        change = changes.get(card["id"])
        if change is not None and change["freed_bytes"] is not None:  # memory: frees bytes, costs step time
            assert card["saving_s"] is None and change["freed_bytes"] == card["metrics"]["freed_bytes"]
            assert change["saving_s"] == -card["metrics"]["step_cost_s"], (card, change)
        elif change is not None:  # a symptom the fixes before it saved wholly says no saving (None)
            assert (card["saving_s"] or 0.0) == change["saving_s"], (card, change)


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
        for written in _users_arguments(card):  # their own code may say None: what perfmagic wrote may not
            code = code.replace(written, "_")
        comments = "\n".join(line.partition("#")[2] for line in (card.get("fix") or "").splitlines())
        assert not PLACEHOLDER.search(code), f"{card['id']}: placeholder in the fix code:\n{card['fix']}"
        assert "?" not in comments, f"{card['id']}: unknown in the fix's comments:\n{card['fix']}"
        assert_fix_pastes(card)
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


def assert_fix_pastes(card: dict[str, Any]) -> None:
    """The fix is Python as it stands (shell commands are comments); where it takes the place of the
    user's statement, pasted there the file still compiles, every name it reads is bound in that file
    (or by the fix, or a builtin), and every argument the user passed is still passed, as written
    unless the fix says what it was (nothing else added)."""
    fix = card.get("fix") or ""
    try:  # as a function's body: a rewritten `return DataLoader(...)` is Python too
        compile("def fix():\n" + textwrap.indent(fix + "\npass", "    "), f"<fix of {card['id']}>", "exec")
    except SyntaxError as e:
        raise AssertionError(f"{card['id']}: the fix is not Python ({e.msg}):\n{fix}") from e
    site = card.get("replaces")
    pasted = _pasted_source(card)
    if site is None or pasted is None:  # no statement replaced, or its source is elsewhere (a kernel)
        return
    try:
        module = ast.parse(pasted)
    except SyntaxError as e:
        raise AssertionError(f"{card['id']}: pasted at {site}, the file does not compile ({e.msg})") from e
    unbound = _read_names(fix) - _bound_names(module) - set(dir(builtins))
    assert not unbound, f"{card['id']}: the fix reads {sorted(unbound)}, which {site['file']} never binds"
    _assert_arguments_kept(card["id"], textwrap.dedent(_users_statement(card)), fix)


def _users_statement(card: dict[str, Any]) -> str:
    """The user's statement the fix replaces, as they wrote it ("" where there is none)."""
    site = card.get("replaces")
    lines = linecache.getlines(site["file"]) if site else []
    return "".join(lines[site["line"] - 1 : site["end_line"]]) if site and lines else ""


def _users_arguments(card: dict[str, Any]) -> list[str]:
    """The arguments of the user's call the fix replaces, as they wrote them."""
    statement = textwrap.dedent(_users_statement(card))
    call = _outer_call(ast.parse(statement)) if statement else None
    if call is None:
        return []
    nodes = [*call.args, *(k.value for k in call.keywords)]
    return [text for n in nodes if (text := ast.get_source_segment(statement, n))]


def _pasted_source(card: dict[str, Any]) -> str | None:
    """The source of the file the fix goes into, with the fix in place of the statement it replaces."""
    site = card.get("replaces")
    lines = linecache.getlines(site["file"]) if site else []
    if not site or not lines:
        return None
    first = lines[site["line"] - 1]
    indent = first[: len(first) - len(first.lstrip())]
    fix = textwrap.indent(card["fix"], indent) + "\n"
    return "".join([*lines[: site["line"] - 1], fix, *lines[site["end_line"] :]])


def _read_names(code: str) -> set[str]:
    tree = ast.parse(textwrap.dedent(code))
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - _bound_names(tree)


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the code binds anywhere: assignments, imports, definitions, parameters."""
    bound: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            bound.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, ast.alias):
            bound.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
    return bound


def _assert_arguments_kept(card_id: str, original: str, fix: str) -> None:
    """The fix's call of the user's callable keeps each of their arguments; only changes are added."""
    before = _outer_call(ast.parse(original))
    if before is None:
        return
    func = ast.unparse(before.func)
    after = next(
        (c for c in ast.walk(ast.parse(fix)) if isinstance(c, ast.Call) and ast.unparse(c.func) == func), None
    )
    assert after is not None, f"{card_id}: the fix does not call {func} as the user did:\n{fix}"
    changed = set(knob_changes(fix))
    removed = set(re.findall(r"#\s*(\w+)=.*\bremoved\b", fix))
    kept = {k.arg: ast.unparse(k.value) for k in after.keywords}
    for k in before.keywords:
        name = k.arg or f"**{ast.unparse(k.value)}"
        if k.arg is None:
            assert any(
                x.arg is None and ast.unparse(x.value) == ast.unparse(k.value) for x in after.keywords
            ), name
        elif k.arg not in changed | removed:
            assert kept.get(k.arg) == ast.unparse(k.value), f"{card_id}: {name} not kept as written:\n{fix}"
    added = set(kept) - {k.arg for k in before.keywords}
    assert added <= changed, f"{card_id}: adds {sorted(added - changed)} the user did not set:\n{fix}"
    assert len(after.args) == len(before.args), f"{card_id}: positional arguments lost:\n{fix}"


def _outer_call(tree: ast.AST) -> ast.Call | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.Call)), None)


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
    from perfmagic.render.wording import hotspot_lines

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


def pasted_module(card: dict[str, Any]) -> types.ModuleType:
    """The user's module with the card's fix pasted in place of the statement it replaces, loaded anew
    beside the original (which stays as it was): call its functions to run the fixed loop."""
    site, source = card["replaces"], _pasted_source(card)
    assert site and source, f"{card['id']}: the fix replaces no statement of the user's that can be read"
    module = types.ModuleType(f"{Path(site['file']).stem}_fixed")
    module.__file__ = site["file"]
    sys.modules[module.__name__] = module  # as an import would: dataclasses look their module up
    exec(compile(source, site["file"], "exec"), module.__dict__)
    return module
