"""A lesson module as learners get it: every Part's check hidden, and what only they used left out.

:func:`prune_lesson` rewrites ``autograder/lessons/lessonNN.py`` so that each ``Part``'s check
becomes :func:`autograder.lessons.kit.HIDDEN_CHECK`, then drops, round after round, every
top-level definition and import nothing kept uses any more (the self-checks and what they
use stay); :data:`INIT_DOCSTRING` and :data:`GRADING_DOCSTRING` are the released packages' docstrings.
"""

from __future__ import annotations

import ast
import re

from .rules import ROOT_NAMES, STUB, ReleaseError

__all__ = ["prune_lesson", "with_docstring", "INIT_DOCSTRING", "GRADING_DOCSTRING"]


def _offsets(source: str) -> list[int]:
    """Byte offset of the start of every line (1-based index), for the AST's byte columns."""
    starts, total = [0, 0], 0
    for line in source.encode().splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def _edit(source: str, edits: list[tuple[tuple[int, int], tuple[int, int], str]]) -> str:
    """Apply ``((line, col), (end_line, end_col), text)`` replacements (AST positions) to ``source``."""
    starts, data = _offsets(source), source.encode()
    spans = sorted(((starts[a] + ca, starts[b] + cb, text) for (a, ca), (b, cb), text in edits), reverse=True)
    for begin, end, text in spans:
        data = data[:begin] + text.encode() + data[end:]
    return data.decode()


def _whole_lines(source: str, first: int, last: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The span of lines ``first``..``last`` (1-based), with the comment lines right above them."""
    lines = source.splitlines()
    while first > 1 and lines[first - 2].startswith("#"):
        first -= 1
    return (first, 0), (last + 1, 0)


def _binds(stmt: ast.stmt) -> set[str]:
    """Every name a top-level statement binds (definitions and assignments; imports aside)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _defined(stmt: ast.stmt) -> set[str] | None:
    """The names a top-level statement defines, when it may be dropped; None when it must stay.

    Definitions and assignments to plain names may go; anything else (``if``, a call, an
    assignment to an attribute or item), ``EXERCISES`` and ``__all__`` stay.
    """
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        parts = [p for t in targets for p in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
        if not all(isinstance(p, ast.Name) for p in parts):
            return None
    elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return None
    names = _binds(stmt)
    return names if names and not names & {*ROOT_NAMES, "__all__"} else None


def _used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _bound_by_import(alias: ast.alias, stmt: ast.stmt) -> str:
    return alias.asname or (alias.name.split(".")[0] if isinstance(stmt, ast.Import) else alias.name)


def _format_import(stmt: ast.ImportFrom | ast.Import, names: list[ast.alias]) -> str:
    """One import statement with only ``names``, wrapped in parentheses when it runs long."""
    if isinstance(stmt, ast.Import):
        return ast.unparse(ast.Import(names=names))
    line = ast.unparse(ast.ImportFrom(module=stmt.module, names=names, level=stmt.level))
    if len(line) <= 110:
        return line
    head, _, tail = line.partition(" import ")
    wrapped, row = [], f"{head} import ("
    for i, name in enumerate(tail.split(", ")):
        piece = name + (", " if i < len(names) - 1 else ")")
        if len(row) + len(piece.rstrip()) > 110:
            wrapped.append(row.rstrip())
            row = " " * (len(head) + 9)
        row += piece
    return "\n".join([*wrapped, row])


def _replace_checks(source: str, module: str) -> str:
    """Every ``Part(...)``'s check (4th argument or ``check=``) becomes :data:`STUB`."""
    edits = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Part"):
            continue
        check = next((k.value for k in node.keywords if k.arg == "check"), node.args[3] if len(node.args) > 3 else None)
        if check is None:
            raise ReleaseError(f"autograder/lessons/{module}.py line {node.lineno}: a Part(...) without its check (the 4th "
                               "argument, or check=...), so the release cannot tell what to replace. Declare each "
                               "part as Part(name, points, says, check).")
        if not (isinstance(check, ast.Name) and check.id == STUB):
            edits.append(((check.lineno, check.col_offset), (check.end_lineno, check.end_col_offset), STUB))
    if not edits:
        raise ReleaseError(f"autograder/lessons/{module}.py declares no Part(...) with a check to hide; a lesson module "
                           "declares its graded exercises as Exercise(..., parts=(Part(...), ...)).")
    return _edit(source, edits)


def _prune_once(source: str) -> str:
    """Drop the top-level definitions nothing kept reaches, and imports nothing uses; fix ``__all__``."""
    tree = ast.parse(source)
    body = [s for s in tree.body if not (s is tree.body[0] and _is_docstring(s))]
    imports = [s for s in body
               if isinstance(s, (ast.Import, ast.ImportFrom)) and getattr(s, "module", "") != "__future__"]
    droppable = {id(s): _defined(s) for s in body if s not in imports}
    exported = [s for s in body
                if isinstance(s, ast.Assign) and [getattr(t, "id", "") for t in s.targets] == ["__all__"]]
    todo = set().union(*(_used(s) for s in body if droppable.get(id(s)) is None and s not in imports + exported))
    live: set[str] = set()
    while todo:
        name = todo.pop()
        if name in live:
            continue
        live.add(name)
        todo |= set().union(*(_used(s) for s in body if name in (droppable.get(id(s)) or ())))
    dropped = [s for s in body if droppable.get(id(s)) and not droppable[id(s)] & live]
    kept_uses = set().union(*(_used(s) for s in body if s not in dropped and s not in imports + exported))
    edits = []
    for stmt in dropped:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        edits.append((*_whole_lines(source, first, stmt.end_lineno), ""))
    bound = set().union(*(_binds(s) for s in body if s not in dropped and s not in imports))
    for stmt in imports:
        names = [a for a in stmt.names if _bound_by_import(a, stmt) in kept_uses or a.name == "*"]
        bound |= {_bound_by_import(a, stmt) for a in names}
        if len(names) != len(stmt.names):
            text = _format_import(stmt, names) + "\n" if names else ""
            edits.append(((stmt.lineno, 0), (stmt.end_lineno + 1, 0), text))
    for stmt in exported:
        if not isinstance(stmt.value, (ast.List, ast.Tuple)):
            continue
        names = [e for e in stmt.value.elts if not (isinstance(e, ast.Constant) and e.value not in bound)]
        if len(names) != len(stmt.value.elts):
            value = stmt.value
            edits.append(((value.lineno, value.col_offset), (value.end_lineno, value.end_col_offset),
                          "[" + ", ".join(ast.unparse(e).replace("'", '"') for e in names) + "]"))
    return _edit(source, edits)


def _with_stub_import(source: str, module: str) -> str:
    """Add :data:`STUB` to the module's ``from .kit import ...`` line (or add such a line)."""
    tree = ast.parse(source)
    from_kit = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.level == 1 and s.module == "kit"]
    if from_kit and any(a.name == STUB for a in from_kit[0].names):
        return source
    if from_kit:
        stmt = from_kit[0]
        names = sorted([*stmt.names, ast.alias(name=STUB)], key=lambda a: a.name)
        return _edit(source, [((stmt.lineno, 0), (stmt.end_lineno + 1, 0), _format_import(stmt, names) + "\n")])
    imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    last = max(imports, key=lambda s: s.end_lineno, default=None)
    if last is None:
        raise ReleaseError(f"autograder/lessons/{module}.py imports nothing from autograder.lessons.kit; a lesson module declares "
                           "its exercises with kit's Exercise and Part.")
    return _edit(source, [((last.end_lineno + 1, 0), (last.end_lineno + 1, 0), f"from .kit import {STUB}\n")])


def _lesson_docstring(tree: ast.Module, module: str) -> str:
    """The generated docstring of a pruned lesson module: its exercises and how to check them."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Exercise":
            args = {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)}
            if "number" in args and "function" in args:
                found.append((args["number"], args["function"]))
    if not found:
        raise ReleaseError(f"autograder/lessons/{module}.py declares no Exercise(number=..., function=..., ...); every "
                           "lessonNN.py that ships must declare its exercises so learners' self-checks find them.")
    found.sort(key=lambda e: tuple(int(x) for x in e[0].split(".")))
    examples = "\n".join(f'    exercise("{number}").self_check({function})' for number, function in found)
    return (f'"""Lesson {module[-2:]}\'s exercises as learners get them: the visible self-checks, no hidden tests.\n\n'
            "Written by ``python -m autograder release`` from the instructor's copy of this module: the\n"
            "visible self-checks are the same, each graded part's hidden test is replaced by\n"
            "``autograder.lessons.kit.HIDDEN_CHECK``, and what only the hidden tests used is left out.\n"
            "Notebook cells run the self-checks::\n\n"
            f"    from autograder import exercise\n{examples}\n"
            '"""\n')


def with_docstring(source: str, docstring: str) -> str:
    tree = ast.parse(source)
    if tree.body and _is_docstring(tree.body[0]):
        first = tree.body[0]
        return _edit(source, [((first.lineno, 0), (first.end_lineno + 1, 0), docstring)])
    return docstring + "\n" + source


def _tidy(source: str) -> str:
    """Section comments left with nothing under them removed, and at most two blank lines in a row."""
    pieces = re.split(r"(\n(?:[ \t]*\n)+)", source.strip("\n"))  # paragraphs, with what separates them
    paragraphs, gaps = pieces[::2], pieces[1::2] + ["\n"]

    def heading(i: int) -> bool:  # a top-level paragraph of comments only
        return i == len(paragraphs) or all(line.startswith("#") for line in paragraphs[i].splitlines())

    kept = [p + gap for i, (p, gap) in enumerate(zip(paragraphs, gaps)) if not (heading(i) and heading(i + 1))]
    return re.sub(r"\n{4,}", "\n\n\n", "".join(kept).rstrip("\n") + "\n")


def prune_lesson(source: str, module: str) -> str:
    """A lesson module as learners get it: hidden checks stubbed, what only they used dropped.

    Every ``Part(...)``'s check becomes ``HIDDEN_CHECK`` (imported from ``.kit``); then every
    top-level function, class and constant that nothing kept still uses is removed, with the
    comment lines right above it, and so on until nothing more goes; unused imports go too,
    ``__all__`` lists only what is left, and the module docstring (which describes the hidden
    tests) is replaced by a short generated one. ``EXERCISES`` and every statement that is
    not a plain definition stay, with all they use. The rest of the text is kept as written.

    >>> print(prune_lesson('''
    ... from .kit import Exercise, Part
    ... CASES = [1, 2, 3]
    ... def _hidden(attempt):
    ...     return CASES
    ... def _shared(attempt):
    ...     return 2
    ... def _self_check(attempt):
    ...     _shared(attempt)
    ...     return "Self-check passed"
    ... EXERCISES = (Exercise(number="9.1", function="f", title="t",
    ...                       parts=(Part("correct", 1, "works.", _hidden),), visible_check=_self_check),)
    ... ''', "lesson09").split('\"\"\"')[-1].strip())
    from .kit import Exercise, HIDDEN_CHECK, Part
    def _shared(attempt):
        return 2
    def _self_check(attempt):
        _shared(attempt)
        return "Self-check passed"
    EXERCISES = (Exercise(number="9.1", function="f", title="t",
                          parts=(Part("correct", 1, "works.", HIDDEN_CHECK),), visible_check=_self_check),)
    """
    pruned = _with_stub_import(_replace_checks(source, module), module)
    for _ in range(100):
        again = _prune_once(pruned)
        if again == pruned:
            break
        pruned = again
    else:  # each round removes at least one line, so this means a bug here, not in the lesson
        raise ReleaseError(f"pruning autograder/{module}.py did not settle after 100 rounds")
    return _tidy(with_docstring(pruned, _lesson_docstring(ast.parse(pruned), module)))


INIT_DOCSTRING = '''"""The course's exercise checks, as learners get them.

Notebook cells find an exercise by its number and run its visible self-check on fresh
ranks, with the same rules the grading uses::

    from autograder import exercise
    exercise("4.4").self_check(ring_allreduce)

The hidden tests are not in this copy: they run when your instructor grades the notebook
you hand in, and ``exercise(...).grade(...)`` says so. Written by
``python -m autograder release`` from the course's instructor package.
"""
'''


GRADING_DOCSTRING = '''"""The learner's commands, as learners get them (the instructor's grading tools stay behind).

- :mod:`~autograder.grading.selfcheck`: ``make check LESSON=05`` runs a lesson's visible
  self-checks on your saved notebook from the command line.
- :mod:`~autograder.grading.clean`: how grading reads a notebook: only its imports,
  functions, classes and constants count; ``make check`` reads it the same way.
- :mod:`~autograder.grading.handin`: ``make handin STUDENT=your-name`` packs your notebooks
  into one archive for your instructor.

Written by ``python -m autograder release`` from the course's instructor package.
"""
'''
