"""Advise and render read the report and the timeline's meta by their declared fields.

A report key is always written (``contract.ReportData``): read as ``report["steps"]["count"]`` it
fails loudly where a report or a test's hand-built one lacks it, where ``.get("count")`` would
quietly read None and render "no steps". A key the contract declares optional (``NotRequired``, a
``total=False`` meta section) is read with an ``in`` check. So no ``.get("...")`` with a literal key
is left in ``perfmagic/advise`` or ``perfmagic/render`` but on the dicts below, each named by its
module and the expression it is called on, with why it is not the report's or meta's.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import perfmagic

PACKAGE = Path(perfmagic.__file__).resolve().parent
READERS = ("advise", "render")

_METRICS = "a card's metrics: each rule's own evidence, open by design (Card.metrics is dict[str, Any])"
_TRAINER = "the trainer's settings as the user's code passed them (TrainingArguments, Trainer kwargs)"
_USER_CALL = "the arguments of the user's own call, as written in their code"
_BY_STAGE = "keyed by stage name: an absent stage is data, not a missing field"
_SNAPSHOT = (
    "the exporter's snapshot (typed in server.snapshot, which render may not import) and other "
    "processes' session files: neither report nor meta"
)

OPEN: dict[tuple[str, str], str] = {
    ("advise/about.py", "metrics"): _METRICS,
    ("advise/catalog.py", "card.metrics"): _METRICS,
    ("advise/plan.py", "card.metrics"): _METRICS,
    ("render/energy.py", "metrics"): _METRICS,
    ("render/wording.py", "metrics"): _METRICS,
    ("advise/trainer_fixes.py", "settings"): _TRAINER,
    ("advise/trainer_fixes.py", "settings.get('training_args') or {}"): _TRAINER,
    ("advise/data.py", "call.passed()"): _USER_CALL,
    ("advise/fixes.py", "call.passed()"): _USER_CALL,
    ("advise/fixes.py", "changes"): "the keyword changes a fix asks of the user's call (**changes)",
    ("advise/trainer_fixes.py", "changes"): "the keyword changes a fix asks of the user's call (**changes)",
    ("advise/loop.py", "a.disk_waits"): _BY_STAGE,
    ("advise/loop.py", "a.loop.calls_per_step"): _BY_STAGE,
    ("advise/sample_cost.py", "a.loop.calls_per_step"): _BY_STAGE,
    ("advise/sample_cost.py", "a.hotspots"): _BY_STAGE,
    ("render/prometheus.py", "g"): _SNAPSHOT,
    ("render/prometheus.py", "gpu"): _SNAPSHOT,
    ("render/prometheus.py", "p"): _SNAPSHOT,
    ("render/prometheus.py", "s"): _SNAPSHOT,
    ("render/prometheus.py", "session"): _SNAPSHOT,
}
"""The dicts ``.get("...")`` may read in advise and render, by (module, receiver), with why."""


def keyed_gets(source: str) -> Counter[str]:
    """The receivers of ``x.get("literal", ...)`` calls in ``source``, counted (``x`` as written)."""
    found: Counter[str] = Counter()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found[ast.unparse(node.func.value)] += 1
    return found


def readers_gets() -> dict[tuple[str, str], int]:
    """Every keyed ``.get`` in advise and render, by (module, receiver)."""
    out: dict[tuple[str, str], int] = {}
    for package in READERS:
        for path in sorted((PACKAGE / package).glob("*.py")):
            for receiver, n in keyed_gets(path.read_text(encoding="utf-8")).items():
                out[(f"{package}/{path.name}", receiver)] = n
    return out


def test_the_finder_sees_a_keyed_get_in_either_quote_and_not_a_variable_key() -> None:
    source = "a = report.get(\"steps\")\nb = meta.get('rank', None)\nc = stages.get(name)\nd = x.get()\n"
    assert keyed_gets(source) == Counter({"report": 1, "meta": 1})


def test_advise_and_render_read_no_report_or_meta_field_with_get() -> None:
    found = readers_gets()
    unexplained = sorted(
        f"{module}: {receiver}.get(...) x{n}"
        for (module, receiver), n in found.items()
        if (module, receiver) not in OPEN
    )
    assert not unexplained, "read the report's or meta's declared fields, not .get:\n" + "\n".join(
        unexplained
    )


def test_every_allowed_reader_is_still_there() -> None:
    stale = sorted(f"{m}: {r}" for m, r in OPEN if (m, r) not in readers_gets())
    assert not stale, "allowed .get readers no longer in the code (drop them from OPEN):\n" + "\n".join(stale)
