"""How grading reads a notebook: only what *defines* the learner's answers counts.

The hidden tests are decided in a clean process that holds only the learner's definitions
(:mod:`autograder.grading.clean`, the instructor's), and ``make check``
(:mod:`autograder.learner.selfcheck`) reads a saved notebook the same way:

1. :func:`exercise_code` reads the notebook's code cells, in order, and keeps only what
   *defines* the learner's answer: imports, functions, classes, and names bound to
   constants. Nothing a learner writes can run while these are defined: decorators,
   default values, annotations and base classes may only name imported or built-in
   things, and calls are allowed only to a few known decorators (``torch.no_grad()``,
   ``functools.lru_cache(...)``). Every other top-level statement is left out, and the
   feedback lists what was.
2. :func:`define` runs those in a fresh ``__main__`` namespace.

Example::

    >>> code, left_out = exercise_code_from_cells(["import math\\nprint('hi')\\ndef f(r, w):\\n    return r"])
    >>> [type(node).__name__ for node in code[0].nodes]
    ['Import', 'FunctionDef']
    >>> left_out
    ["cell 1, line 2: print('hi')"]
"""

from __future__ import annotations

import ast
import builtins
import json
import linecache
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

__all__ = ["Kept", "exercise_code", "exercise_code_from_cells", "define"]

#: Built-in names a decorator may be.
SAFE_BUILTINS = frozenset({"staticmethod", "classmethod", "property"})
#: Imported names (the last part of the dotted name) a decorator may call, with constant arguments.
SAFE_DECORATOR_CALLS = frozenset({"no_grad", "inference_mode", "enable_grad", "lru_cache", "cache", "dataclass",
                                  "record", "wraps", "total_ordering"})
#: Methods whose definition would run code when a class is made or subscripted.
HOOK_METHODS = frozenset({"__init_subclass__", "__set_name__", "__class_getitem__", "__mro_entries__", "__prepare__"})


@dataclass(frozen=True)
class Kept:
    """What is kept of one code cell: its number, its source (magics removed) and the statements kept."""

    number: int
    source: str
    nodes: tuple[ast.stmt, ...]
    label: str | None = None  # how feedback names the cell, for answer cells

    @property
    def filename(self) -> str:
        """The name its code is compiled under (``inspect.getsource`` finds it through linecache)."""
        return f"<exercise code, cell {self.number}>"


class _Unsafe(Exception):
    """A definition that could run code while it is being defined; ``why`` says how, for the feedback.

    ``plain`` marks a statement that is simply not a definition (a call, a loop): the feedback
    lists it without a reason, since the rule above the list already gives it.
    """

    def __init__(self, why: str, *, plain: bool = False) -> None:
        super().__init__(why)
        self.plain = plain


class _Checker:
    """Decides which top-level statements are pure definitions (see the module docstring)."""

    def __init__(self, trees: list[ast.Module]) -> None:
        self.imported: set[str] = set()
        self.rebound: set[str] = set()
        for tree in trees:
            for node in tree.body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    self.imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
                else:
                    self.rebound |= _bound_names(node)

    # -- expressions evaluated while a definition runs ----------------------------------

    def value(self, node: ast.AST | None) -> None:
        """An expression that may be evaluated at definition time: no calls, no learner code."""
        if node is None:
            return
        if isinstance(node, ast.Lambda):
            # A lambda's body runs only when it is called; its defaults run now.
            self.arguments(node.args)
            return
        if isinstance(node, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.ListComp, ast.SetComp,
                             ast.DictComp, ast.GeneratorExp, ast.Starred, ast.FormattedValue)):
            raise _Unsafe("it calls or computes something while it is defined")
        for child in ast.iter_child_nodes(node):
            self.value(child)

    def _trusted_name(self, node: ast.AST) -> bool:
        """``name`` or ``module.attr...`` rooted in an import (never rebound) or a safe built-in."""
        while isinstance(node, ast.Attribute):
            node = node.value
        if not isinstance(node, ast.Name) or node.id in self.rebound:
            return False
        return node.id in self.imported or node.id in SAFE_BUILTINS

    def decorator(self, node: ast.expr) -> None:
        if isinstance(node, ast.Call):
            last = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if not (self._trusted_name(node.func) and last in SAFE_DECORATOR_CALLS):
                raise _Unsafe(f"its decorator `{ast.unparse(node)}` would run code while it is defined")
            for arg in node.args + [k.value for k in node.keywords]:
                self.value(arg)
            return
        if not self._trusted_name(node):
            raise _Unsafe(f"its decorator `{ast.unparse(node)}` is not an imported or built-in one")

    def arguments(self, args: ast.arguments) -> None:
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.value(default)
        for arg in args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]:
            self.value(arg.annotation)

    # -- statements ---------------------------------------------------------------------

    def statement(self, node: ast.stmt, in_class: bool = False) -> None:
        """Return when ``node`` only defines things; raise _Unsafe (with the reason) otherwise."""
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not in_class:
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if in_class and node.name in HOOK_METHODS:
                raise _Unsafe(f"a class that defines {node.name} runs it while classes are made")
            for d in node.decorator_list:
                self.decorator(d)
            self.arguments(node.args)
            self.value(node.returns)
            return
        if isinstance(node, ast.ClassDef):
            if node.keywords:
                raise _Unsafe("class keywords (a metaclass) run code while the class is made")
            for d in node.decorator_list:
                self.decorator(d)
            for base in node.bases:
                self.value(base)
            for sub in node.body:
                self.statement(sub, in_class=True)
            return
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            if in_class and any(t.id in HOOK_METHODS for t in node.targets):
                raise _Unsafe("a class that sets a class-making hook runs it while classes are made")
            self.value(node.value)
            return
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if in_class and node.target.id in HOOK_METHODS:
                raise _Unsafe("a class that sets a class-making hook runs it while classes are made")
            self.value(node.annotation)
            self.value(node.value)
            return
        if isinstance(node, ast.Pass) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            return
        raise _Unsafe("only imports, functions, classes and names bound to constants are kept", plain=True)


def _bound_names(node: ast.stmt) -> set[str]:
    """Names a top-level statement binds (other than by importing)."""
    names: set[str] = set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(node.name)
    for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else ():
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.add(sub.id)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
    return names


def _python_source(source: str) -> str:
    """A cell's source without IPython's magics and shell lines (they are never part of an answer)."""
    if source.lstrip().startswith("%%"):
        return ""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def exercise_code_from_cells(sources: Iterable[str], labels: dict[int, str] | None = None
                             ) -> tuple[list[Kept], list[str]]:
    """The definitions of each code cell (:class:`Kept`), and what was left out.

    Cells are numbered from 1 among the code cells given. A cell that does not parse is left
    out whole (it would have failed in the kernel too). ``labels`` names the cells whose
    left-out statements are reported (cell number -> how to name it); by default all are.
    """
    cells = list(sources)
    trees: list[ast.Module | None] = []
    left_out: list[str] = []
    for number, source in enumerate(cells, 1):
        try:
            trees.append(ast.parse(_python_source(source)))
        except SyntaxError as exc:
            trees.append(None)
            if labels is None or number in labels:
                where = labels[number] if labels else f"cell {number}"
                left_out.append(f"{where}: it does not parse ({exc.msg}, line {exc.lineno})")
    checker = _Checker([t for t in trees if t is not None])
    kept: list[Kept] = []
    for number, tree in enumerate(trees, 1):
        if tree is None:
            continue
        body = []
        for node in tree.body:
            try:
                checker.statement(node)
                body.append(node)
            except _Unsafe as why:
                reported = labels is None or number in labels
                if reported and not (isinstance(node, ast.Expr) and not isinstance(node.value, ast.Call)):
                    where = labels[number] if labels else f"cell {number}"
                    first = ast.get_source_segment(_python_source(cells[number - 1]), node) or ast.unparse(node)
                    shown = first.splitlines()[0][:80]
                    note = "" if why.plain else f" ({why})"
                    left_out.append(f"{where}, line {node.lineno}: {shown}{note}")
        if body:
            kept.append(Kept(number, _python_source(cells[number - 1]), tuple(body), (labels or {}).get(number)))
    return kept, left_out


def exercise_code(notebook: str | Path) -> tuple[list[Kept], list[str]]:
    """:func:`exercise_code_from_cells` over the code cells of ``notebook``.

    Only the answer cells (nbgrader's ``solution`` cells) report what was left out, named
    by their first line (``# Exercise 4.4: ring all-reduce``).
    """
    nb = json.loads(Path(notebook).read_text())
    code = [c for c in nb["cells"] if c.get("cell_type") == "code"]
    sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in code]
    labels = {}
    for number, (cell, source) in enumerate(zip(code, sources), 1):
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            first = source.strip().splitlines()[0].lstrip("# ").strip() if source.strip() else "an answer cell"
            labels[number] = f'your cell "{first[:60]}"'
    return exercise_code_from_cells(sources, labels)


def define(code: list[Kept]) -> tuple[dict[str, Any], list[str]]:
    """Run the kept definitions in a fresh ``__main__`` namespace (so the ranks receive them by value).

    Statements run one at a time, as compiled from the cell's own text (so
    ``inspect.getsource`` finds a function's lines); one that fails (a name bound to a
    result the clean run left out, a module a notebook cell wrote to its folder) is
    skipped. Returns the namespace and, for answer cells, what was skipped and why.
    """
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    skipped: list[str] = []
    for cell in code:
        linecache.cache[cell.filename] = (len(cell.source), None, cell.source.splitlines(True), cell.filename)
        for node in cell.nodes:
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), cell.filename, "exec"), namespace)  # noqa: S102
            except Exception as exc:  # noqa: BLE001 - pure definitions, see _Checker; failures are skipped
                if cell.label:
                    skipped.append(f"{cell.label}, line {node.lineno}: skipped ({type(exc).__name__}: {exc})")
    return namespace, skipped


