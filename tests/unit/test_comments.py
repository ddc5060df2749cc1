"""Comments and docstrings say why, in words that stay true.

A date, a driver version or an issue number in a comment ages: the measurement it
dates is redone, the driver moves on, the issue is closed. Each is read here from the
tokens (``tokenize``), so strings in code (a library's version, a message) are not
checked, only comments and docstrings.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

import perfmagic

PACKAGE = Path(perfmagic.__file__).resolve().parent
ROOT = PACKAGE.parent

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
AGEING = {
    "a date": re.compile(rf"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b{_MONTH} (?:[0-3]?\d, )?(?:19|20)\d\d\b"),
    "a driver version": re.compile(r"\bdrivers?\s+(?:version\s+)?R?\d{3}\b|\b[3-9]\d\d\.\d\d(?:\.\d\d)?\b"),
    "an issue number": re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),
}
"""What a comment may not say, by name."""

_SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT}


def prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and each docstring (a statement that is only a string)."""
    line: list[tokenize.TokenInfo] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
        if tok.type not in _SKIP:
            line.append(tok)
        elif tok.type == tokenize.NEWLINE:
            if line and all(t.type == tokenize.STRING for t in line):
                yield from ((t.start[0], t.string) for t in line)
            line = []


def offenders(source: str) -> list[str]:
    """``line: what`` for each comment or docstring that dates itself."""
    found = []
    for lineno, text in prose(source):
        for what, pattern in AGEING.items():
            match = pattern.search(text)
            if match:
                at = lineno + text.count("\n", 0, match.start())
                found.append(f"{at}: {what} ({match.group()!r})")
    return found


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("# measured 2025-03-01 on the test box\nx = 1\n", True),
        ('def f():\n    """Slow since Mar 2025."""\n', True),
        ("x = 1  # took 4.3 ms on an H200 (driver 580)\n", True),
        ('"""Fails on 580.65.06."""\n', True),
        ("# see issue 12\n", True),
        ('class A:\n    """Split off in issues 7-17."""\n', True),
        ('x = "torch 2.13.0, driver 580.65"  # a message, not a comment\n', False),
        ("# compute capability 9.0 and newer; drivers before R535 lack the new name\n", False),
        ('x = "2025-03-01"\n', False),
    ],
)
def test_the_lint_tells_ageing_comments_from_code(source: str, bad: bool) -> None:
    assert bool(offenders(source)) == bad, offenders(source)


def test_comments_and_docstrings_do_not_date_themselves() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{where}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for where in offenders(path.read_text(encoding="utf-8"))
    ]
    assert not found, "say why, not when (no dates, driver versions, issue numbers):\n" + "\n".join(found)
