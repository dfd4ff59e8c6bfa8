"""The cells a graded run can leave out: those that give the graded cells nothing.

``make grade`` decides every graded part in a fresh process from the learner's definitions
(:mod:`autograder.grading.clean`); the kernel run of the notebook only fills in the outputs of
the feedback page. A lesson's demonstrations (launching ranks, training, drawing) are most of
that run's time and none of its use, so :func:`cells_to_leave_out` finds the code cells that
bind no name a later kept cell reads, and :class:`autograder.grading.autograde.WatchedExecute`
writes :data:`NOT_RUN` into them instead of running them.

Read backwards from the last cell: a cell is kept when nbgrader marks it (an answer, a test
or a self-check cell), when it cannot be read as Python (then nothing is known of it), when it
imports with ``*``, or when it binds a name that a kept cell after it reads; a kept cell's
names are then needed in turn. Binding is read generously: an assignment, ``def``, ``class``,
``import``, a loop or ``with`` target, ``global`` inside a function, and a change made through a
name (``model.weight.data[0] = 1``, ``sys.path.insert(0, p)`` at top level) all bind that name.
IPython's magics are read as IPython runs them, and the course's ``%%distributed`` binds
``dist_trace``. A learner's own cells are read by the same rule.

Example::

    >>> import nbformat
    >>> nb = nbformat.v4.new_notebook(cells=[
    ...     nbformat.v4.new_code_cell("import torch\\nfrom helpers import run"),
    ...     nbformat.v4.new_code_cell("result = run(print, world_size=4)\\nresult.trace.plot()"),
    ...     nbformat.v4.new_code_cell("SIZE = 8"),
    ...     nbformat.v4.new_code_cell("def answer(x):\\n    return torch.ones(SIZE) * x"),
    ... ])
    >>> nb.cells[3].metadata["nbgrader"] = {"solution": True, "grade_id": "ex"}
    >>> sorted(cells_to_leave_out(nb))
    [1]
"""

from __future__ import annotations

import ast
import symtable
from typing import Any, Iterator

__all__ = ["cells_to_leave_out", "NOT_RUN"]

#: What a cell left out shows on the feedback page, in place of its output.
NOT_RUN = "(not run while your notebook was graded: no graded cell uses what this cell makes)\n"

_MAGIC_BINDS = {"dist_trace"}  # helpers.magics: %%distributed leaves the last run's trace there


def _python(source: str) -> ast.Module | None:
    """The cell as the Python IPython would run (magics turned into calls), or None when it is not Python."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        source = TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - IPython cannot read it: then neither can this
        return None
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _root(node: ast.AST) -> str | None:
    """The name at the root of ``a.b[c].d`` or ``a.b(...)``, if it is a name."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _top_level(tree: ast.Module) -> Iterator[ast.AST]:
    """The cell's statements and expressions outside any function, class or lambda body."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _tables(table: symtable.SymbolTable) -> Iterator[symtable.SymbolTable]:
    yield table
    for child in table.get_children():
        yield from _tables(child)


def _names(tree: ast.Module) -> tuple[set[str], set[str]] | None:
    """(the names the cell binds or changes, the global names it reads, inside its functions too); None when what
    it binds cannot be known (``import *``)."""
    if any(isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names)
           for node in ast.walk(tree)):
        return None
    try:
        module = symtable.symtable(ast.unparse(tree), "<cell>", "exec")
    except (SyntaxError, ValueError):
        return None
    bound: set[str] = set()
    reads: set[str] = set()
    for table in _tables(module):
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if table is module:
                if symbol.is_assigned() or symbol.is_imported():
                    bound.add(name)
                if symbol.is_referenced():
                    reads.add(name)
            elif symbol.is_global():  # a module name used inside a function, class or comprehension
                if symbol.is_referenced():
                    reads.add(name)
                if symbol.is_assigned():
                    bound.add(name)
    for node in _top_level(tree):  # a change made through a name: w.data[0] = 1, sys.path.insert(0, p)
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
            targets = [node.value.func]
        for target in targets:
            for part in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                root = _root(part)
                if root == "get_ipython":
                    bound |= _MAGIC_BINDS
                elif root:
                    bound.add(root)
    return bound, reads


def _marked(cell: Any) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("solution") or meta.get("grade") or meta.get("locked") or meta.get("task"))


def cells_to_leave_out(nb: Any) -> set[int]:
    """The indices of the code cells of ``nb`` whose names no kept cell after them reads (see the module)."""
    needed: set[str] = set()
    leave: set[int] = set()
    for index in range(len(nb.cells) - 1, -1, -1):
        cell = nb.cells[index]
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        tree = _python(cell.source)
        names = _names(tree) if tree is not None else None
        if names is None:  # not readable: whatever it needs is unknown, so every cell before it is kept
            return leave
        bound, reads = names
        if not _marked(cell) and not (bound & needed):
            leave.add(index)
        else:
            needed |= reads
    return leave
