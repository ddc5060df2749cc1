"""Imports follow the pipeline: no module imports a layer above its own, and none imports itself
through others (an import circle, within a package or among the top modules).

Layers, lowest first: names and units, the timeline, collectors (trace readers
among them), the analysis, advice, the comparison of two reports (by the advice's
problems), renderers; the front doors on top may import
anything. A module may import a lower layer, or a module of its own package
(``perfmagic.collect.x`` → ``perfmagic.collect.y``); ``collect`` and ``traces`` are
siblings and import neither each other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import perfmagic

PACKAGE = Path(perfmagic.__file__).resolve().parent
ROOT = PACKAGE.parent

TOP = 7
LAYERS = {
    "perfmagic.schema": 0,
    "perfmagic.units": 0,
    "perfmagic.intervals": 0,
    "perfmagic.clock": 0,
    "perfmagic.heap": 0,
    "perfmagic.contract": 0,
    "perfmagic.step_policy": 1,
    "perfmagic.places": 1,
    "perfmagic.timeline": 1,
    "perfmagic.collect": 2,
    "perfmagic.traces": 2,
    "perfmagic.tuning": 2,
    "perfmagic.analyze": 3,
    "perfmagic.advise": 4,
    "perfmagic.compare": 5,
    "perfmagic.render": 6,
    "perfmagic": TOP,
    "perfmagic.report": TOP,
    "perfmagic.session": TOP,
    "perfmagic.price": TOP,
    "perfmagic.active": TOP,
    "perfmagic.session_options": TOP,
    "perfmagic.tick_listeners": TOP,
    "perfmagic.magic": TOP,
    "perfmagic.cells": TOP,
    "perfmagic.cli": TOP,
    "perfmagic.server": TOP,
    "perfmagic.bootstrap": TOP,
    "perfmagic.children": TOP,
    "perfmagic.records": TOP,
    "perfmagic.upkeep": TOP,
    "perfmagic.training_hooks": TOP,
    "perfmagic.demo": TOP,
    "perfmagic.monitor": TOP,
    "perfmagic.exporter": TOP,
    "perfmagic.registry": TOP,
    "perfmagic.process_meta": TOP,
    "perfmagic.user_marks": TOP,
    "perfmagic.trace_report": TOP,
    "perfmagic.merge": TOP,
    "perfmagic.__main__": TOP,
}
"""Layer of each module or package (a package's layer covers all its modules)."""

LAYER_NAMES = {
    0: "base",
    1: "timeline",
    2: "collect",
    3: "analyze",
    4: "advise",
    5: "compare",
    6: "render",
    TOP: "top",
}


def package_modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = package_modules()


def unit(module: str) -> str:
    """The module or package a layer is given to: the first two dotted components."""
    return ".".join(module.split(".")[:2])


def layer(module: str) -> int | None:
    return LAYERS.get(unit(module))


def imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, module) of every perfmagic module imported anywhere in ``tree``.

    ``from X import n`` imports the module ``X.n`` where that is a module, else ``X``.
    """
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in dict.fromkeys(names):
            if name == "perfmagic" or name.startswith("perfmagic."):
                yield node.lineno, name


def violations(label: str, module: str, source: str, is_package: bool = False) -> list[str]:
    """The imports in ``source`` (module ``module``, shown as ``label``) against the layers."""
    own = layer(module)
    if own is None:
        return [f"{label}: module {module} has no layer: add it to the map"]
    out = []
    for line, name in imports(ast.parse(source), module, is_package):
        other = layer(name)
        if other is None:
            out.append(f"{label}:{line}: imports {name}, which has no layer: add it to the map")
        elif own != TOP and other >= own and unit(name) != unit(module):
            out.append(f"{label}:{line}: {module} ({LAYER_NAMES[own]}) imports {name} ({LAYER_NAMES[other]})")
    return out


@pytest.mark.parametrize(
    ("module", "source", "imported"),
    [
        ("perfmagic.collect.x", "from perfmagic.render.text import render_text\n", "perfmagic.render.text"),
        ("perfmagic.collect.x", "from ..render import text\n", "perfmagic.render.text"),
        ("perfmagic.collect.x", "def f():\n    import perfmagic.analyze\n", "perfmagic.analyze"),
        (
            "perfmagic.collect.x",
            "from perfmagic.traces.kineto import read_trace\n",
            "perfmagic.traces.kineto",
        ),
        ("perfmagic.traces", "from perfmagic.collect import recorder\n", "perfmagic.collect.recorder"),
        (
            "perfmagic.timeline",
            "if TYPE_CHECKING:\n    from perfmagic.collect import recorder\n",
            "perfmagic.collect.recorder",
        ),
        ("perfmagic.schema", "from perfmagic import timeline\n", "perfmagic.timeline"),
        ("perfmagic.units", "from perfmagic import schema\n", "perfmagic.schema"),
        ("perfmagic.analyze.x", "from perfmagic import stage\n", "perfmagic"),
        ("perfmagic.advise.x", "import perfmagic.compare\n", "perfmagic.compare"),
    ],
)
def test_the_checker_finds_an_import_against_the_pipeline(module: str, source: str, imported: str) -> None:
    (found,) = violations("x.py", module, source, is_package=module == "perfmagic.traces")
    assert found.startswith("x.py:") and f"imports {imported} (" in found


def test_the_checker_allows_lower_layers_and_the_own_package() -> None:
    source = (
        "from perfmagic.schema import STAGES\n"
        "from perfmagic.timeline import Timeline\n"
        "from . import sampler\n"
        "from .stages import StageRecorder\n"
        "import numpy\n"
    )
    assert violations("x.py", "perfmagic.collect.x", source) == []
    assert violations("x.py", "perfmagic.cli", "from perfmagic.magic import PerfMagics\n") == []


def test_the_checker_wants_every_module_in_the_map() -> None:
    assert violations("x.py", "perfmagic.shiny", "") == [
        "x.py: module perfmagic.shiny has no layer: add it to the map"
    ]
    (found,) = violations("x.py", "perfmagic.render.x", "import perfmagic.shiny.thing\n")
    assert "perfmagic.shiny.thing, which has no layer" in found


def test_imports_follow_the_pipeline() -> None:
    assert len(MODULES) > 40
    found = []
    for module, path in MODULES.items():
        label = str(path.relative_to(ROOT))
        found += violations(label, module, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    assert not found, "imports against the pipeline:\n" + "\n".join(found)


def runtime_imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The perfmagic modules ``tree`` imports when it runs (``if TYPE_CHECKING:`` blocks left out)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            node.body = []
    return {name for _, name in imports(tree, module, is_package) if name in MODULES and name != module}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each strongly connected set of two or more modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_circle_finder_finds_a_circle_within_a_package_and_among_top_modules() -> None:
    graph = {
        "perfmagic.render.html": {"perfmagic.render.ranks"},
        "perfmagic.render.ranks": {"perfmagic.render.html", "perfmagic.units"},
        "perfmagic.session": {"perfmagic.bootstrap"},
        "perfmagic.bootstrap": {"perfmagic.children", "perfmagic.session"},
        "perfmagic.children": set(),
    }
    assert circles(graph) == [
        ["perfmagic.bootstrap", "perfmagic.session"],
        ["perfmagic.render.html", "perfmagic.render.ranks"],
    ]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from perfmagic.session import Session\n"
    )
    assert runtime_imports(tree, "perfmagic.bootstrap", False) == set()


def test_no_module_imports_itself_through_others() -> None:
    graph = {
        module: runtime_imports(
            ast.parse(path.read_text(encoding="utf-8")), module, path.name == "__init__.py"
        )
        for module, path in MODULES.items()
    }
    assert sum(map(len, graph.values())) > 300  # the graph is read, not empty
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)
