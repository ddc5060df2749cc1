"""The report's ``hotspots``: per stage, the lines its time was sampled in most, with their shares.

The training thread's stack is sampled at each sampler tick (``collect.stacks``), so its lines
name what fills ``other`` and in-process ``data``. With DataLoader workers, the training thread
waits in the loop's ``for`` line while the workers run the dataset's code: where the workers
sampled their own stacks (``collect.worker_stacks``), ``data``'s lines are theirs. Workers that
did not sample themselves (started before the window, or spawned) leave ``data`` to the training
thread's lines, and the report says whose they are (``sampled``).
"""

from __future__ import annotations

import re
from typing import Literal

from perfmagic.contract import CodePlace, Hotspot, PlaceCount, StackSample
from perfmagic.schema import STACK_SAMPLES, WORKER_STACKS
from perfmagic.timeline import Timeline

TOP = 5
"""Lines kept per stage."""


def hotspots(timeline: Timeline, top: int = TOP) -> dict[str, list[Hotspot]]:
    """Per stage, the ``top`` lines sampled most: ``share`` of that stage's samples (the shares of the
    listed lines need not reach 1)."""
    by_stage: dict[str, list[StackSample]] = {}
    for row in timeline.meta.get(STACK_SAMPLES) or []:
        by_stage.setdefault(row["stage"], []).append(row)
    out = {
        stage: _ranked([(_place(r), r["count"]) for r in rows], "training thread", top)
        for stage, rows in by_stage.items()
    }
    workers = timeline.meta.get(WORKER_STACKS)
    if workers and workers["samples"]:
        places: list[PlaceCount] = workers["places"]
        out["data"] = _ranked([(_place(p), p["count"]) for p in places], "workers", top, workers["samples"])
    return out


def _ranked(
    counts: list[tuple[CodePlace, int]],
    sampled: Literal["training thread", "workers"],
    top: int,
    total: int | None = None,
) -> list[Hotspot]:
    """The ``top`` most sampled places, each with its share of ``total`` (default: of all counted)."""
    whole = total if total is not None else sum(n for _, n in counts)
    ranked = sorted(counts, key=lambda pc: -pc[1])[:top]
    return [{**place, "samples": n, "share": n / whole, "sampled": sampled} for place, n in ranked]


_OLD_WHERE = re.compile(r"(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)")


def _place(row: StackSample | PlaceCount) -> CodePlace:
    """A sampled row's place; a record made before places were stored names it only in ``where``."""
    if "function" in row:
        return {
            "function": row["function"],
            "file": row["file"],
            "line": row["line"],
            "cell": row["cell"],
            "where": row["where"],
        }
    old = _OLD_WHERE.fullmatch(row["where"])  # always of this form then: ``function (file:line)``
    function, file, line = (old["function"], old["file"], int(old["line"])) if old else (row["where"], "", 0)
    return {"function": function, "file": file, "line": line, "cell": None, "where": row["where"]}
