"""The user's own call that built an object, found in their source and rewritten with a change.

A fix is pasted in place of the user's statement, so it must be that statement: the same target,
the same callable as they spelled it (``torch.utils.data.DataLoader(``), every argument they
passed as they wrote it, and only the change added. The collector noted where to look
(:class:`~perfmagic.contract.code.CallHint`); this module reads the source with ``linecache``
(files on disk, and the notebook cells IPython keeps there) and picks the call:

1. a statement that assigns a call of the class to a name the object was bound to, in the scope
   of the frame that held it (a module's or a cell's top level: any cell);
2. else the only call of the class in the user's files whose literal arguments agree with the
   object (``batch_size=64`` where its batch size is 64).

Where neither is certain, there is no call, and the fix says what to change in words and code of
its own.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import sys
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from perfmagic.collect.stacks import is_user_file
from perfmagic.contract.code import Binding, CallHint, FixSite
from perfmagic.places import code_place, line_name


@dataclass(frozen=True)
class Drop:
    """A change that removes the argument, saying ``why``; written as one of ``harmless`` it stays."""

    why: str
    harmless: tuple[str, ...] = ("None", "False")


WITHOUT_WORKERS = Drop("DataLoader rejects it without workers")
"""``persistent_workers`` and ``prefetch_factor`` once there are no workers."""


class Source(str):
    """A change given as source text, an expression written as it is (``Preprocessed(ds, transform)``)."""

    def __repr__(self) -> str:
        return str(self)


_SIMPLE = (ast.Assign, ast.AnnAssign, ast.Expr, ast.Return)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass(frozen=True)
class UserCall:
    """One statement of the user's that calls the class, and that call's arguments as written."""

    file: str
    line: int
    end_line: int
    statement: str  # dedented
    callees: tuple[str, ...]
    params: tuple[str, ...]  # positional parameter names of the class

    @property
    def site(self) -> FixSite:
        return FixSite(file=self.file, line=self.line, end_line=self.end_line, where=self.where)

    @property
    def where(self) -> str:
        """The statement's first line as its user knows it: ``In [2], line 5``, ``train.py:12``."""
        place = code_place(self.file, self.line, "")
        return line_name(place["file"], place["line"], place["cell"])

    def passed(self) -> dict[str, str]:
        """The arguments the user passed by name (positional ones by their parameter's), as written."""
        return {name: text for name, text, _ in self._arguments() if name}

    def rewritten(self, changes: Mapping[str, Any], was: Mapping[str, Any]) -> str:
        """The statement with ``changes`` made (a :class:`Drop` removes an argument), each commented with
        what it was: the user's text, else ``was[name]`` (the value in effect, a default)."""
        tree = ast.parse(self.statement)
        call = _matching_calls(tree, self.callees)[0]
        passed = self._arguments(call)
        lines = [f"{ast.get_source_segment(self.statement, call.func)}("]
        lines += [_argument_line(name, text, positional, changes, was) for name, text, positional in passed]
        named = {name for name, _, _ in passed}
        for name, value in changes.items():
            if name not in named and not isinstance(value, Drop) and not (name in was and was[name] == value):
                note = f"  # was {was[name]!r}" if name in was else ""
                lines.append(f"    {name}={value!r},{note}")
        lines.append(")")
        return f"# in place of {self.where}:\n" + _splice(self.statement, call, "\n".join(lines))

    def _arguments(self, call: ast.Call | None = None) -> list[tuple[str | None, str, bool]]:
        """(parameter name or None, source text, passed by position) of each argument, in order."""
        call = call or _matching_calls(ast.parse(self.statement), self.callees)[0]
        out: list[tuple[str | None, str, bool]] = []
        for i, arg in enumerate(call.args):
            name = self.params[i] if i < len(self.params) and not isinstance(arg, ast.Starred) else None
            out.append((name, _text(self.statement, arg), True))
        for kw in call.keywords:
            text = _text(self.statement, kw.value)
            out.append((kw.arg, f"**{text}" if kw.arg is None else text, False))
        return out


def _argument_line(
    name: str | None, text: str, positional: bool, changes: Mapping[str, Any], was: Mapping[str, Any]
) -> str:
    """One argument of the rewritten call: as the user wrote it, changed (with what it was), or removed."""
    written = text if positional or name is None else f"{name}={text}"
    if name is None or name not in changes or _same(text, changes[name]):
        return f"    {written},"
    change = changes[name]
    if name in was and type(was[name]) is type(change) and was[name] == change:
        return f"    {written},"  # an expression already worth the change: the user's text stays
    if isinstance(change, Drop):
        return f"    {written}," if text in change.harmless else f"    # {written} removed: {change.why}"
    old = text
    if name in was and not _same(text, was[name]):  # an expression: say what it was worth
        old = f"{was[name]!r} ({text})"
    return f"    {change!r},  # {name}, was {old}" if positional else f"    {name}={change!r},  # was {old}"


def find_call(hint: CallHint | None, values: Mapping[str, Any] | None = None) -> UserCall | None:
    """The user's call that built the object ``hint`` describes (None: not found for certain).

    ``values``: the object's settings, to tell calls apart by their literal arguments (default: the
    ones the hint recorded)."""
    if not hint:
        return None
    values = hint["values"] if values is None else values
    callees, params = tuple(hint["callees"]), tuple(hint["params"])
    bound, agreeing = [], []
    for file in dict.fromkeys([*hint["files"], *_cells(), *_user_modules()]):
        for stmt, scope, targets in _statements(file):
            for call in _matching_calls(stmt, callees):
                if not _agrees(stmt, call, params, values):
                    continue
                found = _user_call(file, stmt, callees, params)
                agreeing.append(found)
                names = targets | _receiver(call)  # `loader = DataLoader(...)`, `model.compile(...)`
                if any(_binds(b, file, scope, names) for b in hint["bindings"]):
                    bound.append(found)
    if bound or hint["method"]:  # `.compile(` alone may be anyone's: a method's call is its receiver's
        return bound[0] if bound else None
    return agreeing[0] if len({(c.file, c.line) for c in agreeing}) == 1 else None


def _cells() -> list[str]:
    """Notebook cells IPython has compiled, the latest first (it keeps them in ``linecache``)."""
    return [
        name
        for name in reversed(list(linecache.cache))
        if is_user_file(name)
        and not os.path.exists(name)
        and (not name.startswith("<") or name.startswith("<ipython-input"))
    ]


def _user_modules() -> list[str]:
    """The user's modules loaded in this process (for ``perfmagic run``, the script and the files on the
    stack were listed by the hint)."""
    files = (getattr(m, "__file__", None) for m in list(sys.modules.values()))
    return [
        f for f in files if isinstance(f, str) and os.path.isabs(f) and f.endswith(".py") and is_user_file(f)
    ]


def _binds(binding: Binding, file: str, scope: int, targets: Collection[str]) -> bool:
    if binding["name"] not in targets:
        return False
    return binding["scope_line"] == scope == 0 or (binding["file"] == file and binding["scope_line"] == scope)


def _agrees(stmt: ast.stmt, call: ast.Call, params: tuple[str, ...], values: Mapping[str, Any]) -> bool:
    """No literal argument of the call says other than the object's settings."""
    named = [(params[i] if i < len(params) else None, a) for i, a in enumerate(call.args)]
    named += [(kw.arg, kw.value) for kw in call.keywords]
    for name, node in named:
        if name is None or name not in values:
            continue
        try:
            literal = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue  # an expression: it may have been anything
        if literal != values[name]:
            return False
    return True


def _user_call(file: str, stmt: ast.stmt, callees: tuple[str, ...], params: tuple[str, ...]) -> UserCall:
    end = stmt.end_lineno or stmt.lineno
    lines = linecache.getlines(file)[stmt.lineno - 1 : end]
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
    text = "".join(line[len(indent) :] if line.startswith(indent) else line for line in lines)
    return UserCall(file, stmt.lineno, end, text.rstrip("\n"), callees, params)


def _statements(file: str) -> Iterator[tuple[ast.stmt, int, frozenset[str]]]:
    """Each simple statement of the file that may call a class: (statement, its scope's first line, the
    names it assigns)."""
    tree = _parse("".join(linecache.getlines(file)))
    if tree is None:
        return
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, scope = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SCOPES):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                stack.append((child, first))
            elif isinstance(child, _SIMPLE):
                yield child, scope, _targets(child)
            elif isinstance(child, ast.stmt):
                stack.append((child, scope))


@functools.lru_cache(maxsize=256)
def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):  # IPython syntax (!cmd, %magic) in a cell, or not Python
        return None


def _targets(stmt: ast.stmt) -> frozenset[str]:
    nodes = (
        stmt.targets
        if isinstance(stmt, ast.Assign)
        else [stmt.target]
        if isinstance(stmt, ast.AnnAssign)
        else []
    )
    names = set()
    for node in nodes:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names.add(f"{node.value.id}.{node.attr}")
    return frozenset(names)


def _receiver(call: ast.Call) -> frozenset[str]:
    """The name a method is called on (``model`` of ``model.compile(...)``), if a plain one."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return frozenset({func.value.id})
    return frozenset()


def _matching_calls(node: ast.AST, callees: tuple[str, ...]) -> list[ast.Call]:
    """The calls of the class in ``node``, outermost first (``torch.utils.data.DataLoader(`` matches
    ``DataLoader``)."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else None
            )
            if name in callees:
                found.append(sub)
    return found


def _same(text: str, value: Any) -> bool:
    """Whether the argument as written is the literal ``value`` (``"steps"`` is ``'steps'``)."""
    try:
        return bool(ast.literal_eval(text) == value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _text(source: str, node: ast.AST) -> str:
    return ast.get_source_segment(source, node) or ast.unparse(node)


def _splice(source: str, node: ast.expr, replacement: str) -> str:
    """``source`` with ``node``'s text replaced."""
    lines = source.splitlines(keepends=True)

    def offset(line: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return sum(map(len, lines[: line - 1])) + len(lines[line - 1].encode()[:col].decode())

    start = offset(node.lineno, node.col_offset)
    end = offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
    return source[:start] + replacement + source[end:]
