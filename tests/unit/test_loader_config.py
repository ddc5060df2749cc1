"""The DataLoader's settings are read once, into :class:`LoaderConfig`, and by attribute after that.

A ``.get("num_workers")`` on the settings would bring back a dict's reading: a default at each
call, and a misspelt key that mypy cannot see. The advice and the renderers hold none (found in
their syntax trees), the mark the hooks write has exactly the dataclass's fields, and a mark an
older perfmagic saved, with fewer keys, still reads.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import perfmagic
from perfmagic.collect.loaders import loader_settings
from perfmagic.contract import LoaderConfig

PACKAGE = Path(perfmagic.__file__).resolve().parent
READERS = ("advise", "render")
LOADER_NAMES = ("ld", "loader")


def _is_loader(node: ast.expr) -> bool:
    """``ld``, ``loader``, or an attribute access ending in ``.loader`` (``a.config.loader``)."""
    if isinstance(node, ast.Name):
        return node.id in LOADER_NAMES
    return isinstance(node, ast.Attribute) and node.attr == "loader"


def loader_gets(source: str) -> list[int]:
    """The lines of the ``.get(...)`` calls on the loader's settings in ``source``."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and _is_loader(node.func.value)
    ]


def test_the_advice_and_the_renderers_read_the_loader_by_attribute() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for package in READERS
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for line in loader_gets(path.read_text(encoding="utf-8"))
    ]
    assert not found, "the loader's settings read as a dict:\n" + "\n".join(found)


def test_the_check_finds_a_get_on_each_receiver() -> None:
    source = 'ld.get("x")\nloader.get("y")\na.config.loader.get("z")\na.get("w")\nld.num_workers\n'
    assert loader_gets(source) == [1, 2, 3]


def test_the_mark_has_exactly_the_settings_fields() -> None:
    dataset = [0] * 10
    loader = SimpleNamespace(
        dataset=dataset,
        num_workers=2,
        pin_memory=True,
        prefetch_factor=4,
        persistent_workers=True,
        batch_size=5,
        drop_last=True,
    )
    torch = SimpleNamespace(
        utils=SimpleNamespace(data=SimpleNamespace(IterableDataset=type("IterableDataset", (), {})))
    )
    mark = loader_settings(loader, torch, sys._getframe())
    assert set(mark) == {f.name for f in dataclasses.fields(LoaderConfig)}
    settings = LoaderConfig.from_mark(mark)
    assert (settings.num_workers, settings.pin_memory, settings.prefetch_factor) == (2, True, 4)
    assert (settings.batch_size, settings.drop_last, settings.dataset, settings.dataset_len) == (
        5,
        True,
        "list",
        10,
    )
    assert settings.call is not None and settings.call["callees"][0] == "SimpleNamespace"


def test_an_older_mark_reads_with_the_dataloaders_defaults() -> None:
    settings = LoaderConfig.from_mark({"num_workers": None, "batch_size": 32})
    assert settings == LoaderConfig(batch_size=32)
    assert (settings.num_workers, settings.pin_memory, settings.persistent_workers, settings.call) == (
        0,
        False,
        False,
        None,
    )
