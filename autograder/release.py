"""Build the learner distribution: the course as learners get it, without answers or hidden tests.

``make release`` (or ``python -m autograder release [DIR]``) writes a folder, by default
``dist/learner-course/``, and ``DIR.tar.gz`` next to it. An instructor publishes the folder
as a git repository of its own; learners clone that and run ``make lab``, and the Colab
set-up cell clones it (``REPOSITORY`` in :mod:`autograder.colab`). It holds:

- ``course/``: the learner notebooks, as committed (the build stops if one has outputs);
- ``helpers/``: the whole runtime package. That includes ``helpers/ring.py``, whose
  pipelined ring all-reduce lesson 08 prints and runs; with ``piece_bytes=None, ahead=0``
  it is a working plain ring, so it shows a learner one answer to Exercise 4.4. It ships anyway:
  lesson 08 cannot be taught without it, and it comes after lesson 04;
- ``autograder/``: ``__init__.py``, ``kit.py``, ``harness.py`` and every ``lessonNN.py``
  rewritten by :func:`prune_lesson`: each ``Part``'s check becomes
  :func:`autograder.kit.HIDDEN_CHECK`, and what only the hidden tests used is left out,
  so ``exercise("4.4").self_check(fn)`` works as in the instructor's copy while
  ``exercise("4.4").grade(fn, part)`` says the hidden test is not there. No other module
  of the package ships (``reference.py``, the grading and build tools);
- ``README.md``, ``pyproject.toml``, ``environment.yml``, ``Makefile`` (``venv``, ``lab``,
  ``clean-venv``) and ``.gitignore`` for learners, generated from the main ones, and
  ``MANIFEST.txt``, which lists every file.

A rebuild replaces an earlier release in the same folder but keeps its ``.git``, so the
folder can be the published repository's checkout.

The build fails, naming the file and the next step, when a kept module imports one that
is left out, when a lesson module declares no exercise, or when a learner notebook has
outputs or solution markup.

Example::

    >>> import tempfile, pathlib
    >>> out = build(pathlib.Path(tempfile.mkdtemp()) / "learner-course")
    >>> (out / "autograder" / "reference.py").exists(), (out / "autograder" / "lesson04.py").exists()
    (False, True)
    >>> shutil.rmtree(out.parent)
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

__all__ = ["ROOT", "DEFAULT_DIR", "ReleaseError", "build", "prune_lesson", "main"]

# The repository this module belongs to: it holds course/, helpers/, pyproject.toml, Makefile.
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = Path("dist") / "learner-course"

# The autograder modules learners get besides the lessonNN.py files; every other module stays.
KEPT_MODULES = ("__init__", "kit", "harness")
_LESSON = re.compile(r"lesson\d{2}$")
_JUNK = re.compile(r"(^|/)(__pycache__|\.ipynb_checkpoints)(/|$)|\.py[cod]$")
_MARKUP = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
STUB = "HIDDEN_CHECK"  # the name every Part's check becomes: autograder.kit.HIDDEN_CHECK
ROOT_NAMES = ("EXERCISES",)  # what kit's registry reads from a lesson module: kept, with all it uses


class ReleaseError(RuntimeError):
    """The learner distribution cannot be built as asked; the message says why and what to do."""


# -- pruning a lesson module ---------------------------------------------------------------


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
            raise ReleaseError(f"autograder/{module}.py line {node.lineno}: a Part(...) without its check (the 4th "
                               "argument, or check=...), so the release cannot tell what to replace. Declare each "
                               "part as Part(name, points, says, check).")
        if not (isinstance(check, ast.Name) and check.id == STUB):
            edits.append(((check.lineno, check.col_offset), (check.end_lineno, check.end_col_offset), STUB))
    if not edits:
        raise ReleaseError(f"autograder/{module}.py declares no Part(...) with a check to hide; a lesson module "
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
        raise ReleaseError(f"autograder/{module}.py imports nothing from autograder.kit; a lesson module declares "
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
        raise ReleaseError(f"autograder/{module}.py declares no Exercise(number=..., function=..., ...); every "
                           "lessonNN.py that ships must declare its exercises so learners' self-checks find them.")
    found.sort(key=lambda e: tuple(int(x) for x in e[0].split(".")))
    examples = "\n".join(f'    exercise("{number}").self_check({function})' for number, function in found)
    return (f'"""Lesson {module[-2:]}\'s exercises as learners get them: the visible self-checks, no hidden tests.\n\n'
            "Written by ``python -m autograder release`` from the instructor's copy of this module: the\n"
            "visible self-checks are the same, each graded part's hidden test is replaced by\n"
            "``autograder.kit.HIDDEN_CHECK``, and what only the hidden tests used is left out.\n"
            "Notebook cells run the self-checks::\n\n"
            f"    from autograder import exercise\n{examples}\n"
            '"""\n')


def _with_docstring(source: str, docstring: str) -> str:
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
    return _tidy(_with_docstring(pruned, _lesson_docstring(ast.parse(pruned), module)))


_INIT_DOCSTRING = '''"""The course's exercise checks, as learners get them.

Notebook cells find an exercise by its number and run its visible self-check on fresh
ranks, with the same rules the grading uses::

    from autograder import exercise
    exercise("4.4").self_check(ring_allreduce)

The hidden tests are not in this copy: they run when your instructor grades the notebook
you hand in, and ``exercise(...).grade(...)`` says so. Written by
``python -m autograder release`` from the course's instructor package.
"""
'''


# -- checks on what ships -------------------------------------------------------------------


def _imported_modules(path: Path, package: str) -> list[tuple[int, str, bool]]:
    """(line, module, surely a module?) for every import in a file of ``package``, relative ones resolved.

    ``from pkg import name`` gives ``pkg.name`` as well, not surely a module (it may be a
    function of ``pkg``).
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, True) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            found.append((node.lineno, base, True))
            found += [(node.lineno, f"{base}.{a.name}", False) for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in
              ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, str(node.args[0].value), True))
    return found


def _check_imports(out: Path, root: Path) -> None:
    """Fail when a shipped file of ``autograder`` or ``helpers`` imports one of their modules that does not ship."""

    def module_in(folder: Path, parts: list[str]) -> bool:
        here = folder.joinpath(*parts)
        return here.with_suffix(".py").is_file() or (here / "__init__.py").is_file()

    for path in sorted(out.rglob("*.py")):
        rel = path.relative_to(out)
        for line, name, surely in _imported_modules(path, ".".join(rel.parts[:-1])):
            parts = name.split(".")
            if parts[0] not in ("autograder", "helpers") or len(parts) < 2 or module_in(out, parts[:2]):
                continue
            if surely or module_in(root, parts[:2]):
                raise ReleaseError(
                    f"{rel} line {line} imports {name}, which the learner distribution leaves out (of autograder/ "
                    f"it ships {', '.join(KEPT_MODULES)} and the lessonNN modules). Learners would get an "
                    "ImportError. Move what the import is for into a module that ships (as lesson06.py holds "
                    "bucket_layout), or stop importing it there."
                )


def _check_notebook(path: Path, rel: str) -> None:
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
            raise ReleaseError(f"{rel} cell {i} has outputs or an execution count; learners get the notebooks as "
                               "committed, without outputs. Run `make course` to regenerate course/ and commit it.")


def _check_no_markup(out: Path) -> None:
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        text = path.read_text(errors="replace")
        hit = next((m for m in _MARKUP if m in text), None)
        if hit:
            raise ReleaseError(f"{path.relative_to(out)} contains {hit!r}: solution or hidden-test markup must never "
                               "reach learners. Regenerate course/ with `make course`, or remove the text.")


# -- the learner's project files --------------------------------------------------------------


def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ReleaseError("reading pyproject.toml needs Python 3.11 or newer (tomllib), or the package "
                               "`tomli` on Python 3.10: `pip install tomli`, then run the release again.") from None
    with open(path, "rb") as f:
        return tomllib.load(f)


def _toml_list(items: list[str]) -> str:
    return "[\n" + "".join(f"    {json.dumps(i)},\n" for i in items) + "]"


def learner_pyproject(main: dict) -> str:
    """The learner's pyproject.toml: the main one's dependencies, its ``course`` extra, both packages.

    ``course`` (JupyterLab, the notebook server and nbgrader) is what ``make lab`` installs;
    nbgrader is in it because the notebook toolbar's Validate button, which lesson 00 tells
    learners to press before handing in, is nbgrader's. The test and dev extras stay behind.
    """
    project = main["project"]
    try:
        extra = project["optional-dependencies"]["course"]
    except KeyError:
        raise ReleaseError("pyproject.toml has no [project.optional-dependencies] course = [...] list; the learner "
                           "release installs it for `make lab` (JupyterLab, nbgrader).") from None
    build = main["build-system"]
    return (
        "# The learner course's package: the helpers and the exercises' self-checks.\n"
        "# Written by `python -m autograder release` from the course's main pyproject.toml.\n"
        f"[build-system]\nrequires = {json.dumps(build['requires'])}\n"
        f"build-backend = {json.dumps(build['build-backend'])}\n\n"
        f"[project]\nname = {json.dumps(project['name'])}\nversion = {json.dumps(project['version'])}\n"
        f"description = {json.dumps(project['description'])}\nreadme = \"README.md\"\n"
        f"requires-python = {json.dumps(project['requires-python'])}\n"
        f"dependencies = {_toml_list(project['dependencies'])}\n\n"
        "[project.optional-dependencies]\n"
        "# What `make lab` installs: JupyterLab, and nbgrader for its Validate button.\n"
        f"course = {_toml_list(extra)}\n\n"
        '[tool.setuptools.packages.find]\nwhere = ["."]\ninclude = ["helpers*", "autograder*"]\n'
    )


def learner_environment(main: dict, env_name: str) -> str:
    """The learner's environment.yml: conda's Python and pip, then the same pip packages as pyproject."""
    project = main["project"]
    floor = project["requires-python"].replace(" ", "")
    pip = "".join(f"      - {p}\n" for p in [*project["dependencies"], *project["optional-dependencies"]["course"]])
    return (
        "# Conda route: run from this folder\n"
        f"#   conda env create -f environment.yml && conda activate {env_name} && jupyter lab course/\n"
        "# The pip list is pyproject.toml's dependencies and its `course` extra; the last line installs\n"
        "# this folder's packages in editable mode. Written by `python -m autograder release`.\n"
        f"name: {env_name}\nchannels:\n  - conda-forge\ndependencies:\n  - python{floor}\n  - pip\n  - pip:\n"
        f"{pip}      - -e .\n"
    )


# The main Makefile's paragraphs the learner's one is made of, by how their first line starts.
_MAKE_PARAGRAPHS = ("PYTHON ", "VENV_PY :=", "venv:", "$(VENV_PY):", "$(STAMP):", "ALLOW_ROOT :=", "lab:",
                    "clean-venv:")
_MAKE_HEADER = """\
# The learner course. `make lab` opens it in JupyterLab, building the virtual environment
# in $(VENV) on first use; `make clean-venv` removes it. Overridable: PYTHON, VENV,
# TORCH_SPEC, LAB_ARGS, PIP_FLAGS (see README.md).
# Written by `python -m autograder release` from the course's main Makefile.
"""


def learner_makefile(main: str) -> str:
    """The learner's Makefile: the main Makefile's ``venv``, ``lab`` and ``clean-venv`` rules, copied.

    The paragraphs are taken as they are (the Python check, the torch install, the root
    handling of ``lab``), so the two cannot drift apart; the venv installs the ``course``
    extra instead of ``dev``.
    """
    paragraphs = re.split(r"\n[ \t]*\n", main)
    chosen = []
    for head in _MAKE_PARAGRAPHS:
        found = [p for p in paragraphs
                 if next((line for line in p.splitlines() if not line.startswith("#")), "").startswith(head)]
        if len(found) != 1:
            raise ReleaseError(f"the main Makefile has {len(found)} paragraphs starting with {head!r} (expected "
                               "one); autograder/release.py copies the learner's rules from it. Update "
                               "_MAKE_PARAGRAPHS there.")
        chosen.append(found[0].strip("\n"))
    lines = [line for line in chosen[0].splitlines() if not line.startswith("PYTEST_ARGS")]
    chosen[0] = "\n".join(lines)
    stamp = chosen[4]
    if stamp.count("'.[dev]'") != 1:
        raise ReleaseError("the main Makefile's $(STAMP) rule should install -e '.[dev]' once; the learner's installs "
                           "'.[course]' in its place. Update learner_makefile in autograder/release.py.")
    body = [line for line in stamp.replace("'.[dev]'", "'.[course]'").splitlines() if not line.startswith("#")]
    chosen[4] = "# Install torch (unless the venv has one) and this course with its `course` extra.\n" + "\n".join(body)
    chosen.insert(2, ".PHONY: venv lab clean-venv")
    return _MAKE_HEADER + "\n" + "\n\n".join(chosen) + "\n"


_README = """\
# Distributed training with PyTorch, in notebooks

This course teaches `torch.distributed` by running it. Each lesson is a Jupyter notebook in
`course/`: you start several processes (ranks) from a cell, watch what they send each other,
and build the pieces yourself, from a ring all-reduce to a small DistributedDataParallel,
before launching jobs with `torchrun`. An ordinary CPU is enough; with GPUs the same cells
use NCCL.

## Getting started

Choose one of three ways.

**On your own Linux machine** (Python {python}, `make` and `git`):

```bash
git clone <the address your instructor gave you> distributed-course
cd distributed-course
make lab
```

The first `make lab` builds a virtual environment in `.venv/` (a few minutes: it installs
PyTorch), then opens JupyterLab; later runs start at once. To choose the PyTorch build, say
one for your CUDA version, give its pip arguments the first time, for example
`make lab TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"`.
`make clean-venv` deletes the environment so you can start again. Running as root (in a
container, say) is fine: `make lab` then tells JupyterLab it may.

**With conda**, from this folder:

```bash
conda env create -f environment.yml
conda activate {env_name}
jupyter lab course/
```

**On Google Colab**: open a lesson with the *Open in Colab* badge at its top and run its
first code cell before anything else. It downloads this course into the Colab runtime and
installs it; on your own machine that cell does nothing.

## Working through the lessons

Go in order, from `00-getting-started`. An exercise is a cell that starts with a comment
like `# Exercise 4.4: ...`; write your code in place of its `raise NotImplementedError`.
The cell after it runs a self-check on fresh ranks and prints `Self-check passed` or what
went wrong. More tests, hidden from you, run when your instructor grades your notebook.

## Handing in

1. Run *Kernel > Restart Kernel and Run All Cells* and check that every self-check passes.
2. In JupyterLab, press **Validate** in the notebook's toolbar: it runs the notebook afresh
   and lists anything that fails.
3. Hand in the notebook file, `course/<lesson>/<lesson>.ipynb`, the way your instructor
   asks. On Colab, use *File > Download > Download .ipynb*.

## What is in this folder

- `course/`: the lessons.
- `helpers/`: the package the notebooks use to start ranks, trace them and show the results.
- `autograder/`: the exercises' self-checks.
- `MANIFEST.txt`: every file of the course.
"""

_GITIGNORE = """\
.venv/
__pycache__/
*.py[cod]
*.egg-info/
.ipynb_checkpoints/
"""


# -- the build ---------------------------------------------------------------------------------


def _tracked(root: Path, folder: str) -> list[str]:
    """Files of ``folder`` that git knows or would add (nothing it ignores), as they are on disk."""
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", folder],
                              cwd=root, capture_output=True, text=True)
    except FileNotFoundError:
        raise ReleaseError("the release lists the course's files with git, which is not installed: install git "
                           "and run it from the course's checkout.") from None
    if done.returncode:
        raise ReleaseError(f"`git ls-files {folder}` failed in {root} ({done.stderr.strip()}); run the release "
                           "from the course's git checkout.")
    names = sorted(n for n in done.stdout.split("\0") if n and (root / n).is_file() and not _JUNK.search(n))
    if not names:
        raise ReleaseError(f"{root / folder} holds no files git knows; run the release from the course's checkout.")
    return names


def _contents(root: Path) -> dict[str, str | Path]:
    """Every file of the release: its path inside it, and either a source file or the text to write."""
    files: dict[str, str | Path] = {}
    for name in _tracked(root, "course"):
        if name == "course/README.md":  # a note for instructors on how course/ is made
            continue
        if name.endswith(".ipynb"):
            _check_notebook(root / name, name)
        files[name] = root / name
    for name in _tracked(root, "helpers"):
        files[name] = root / name
    package = root / "autograder"
    files["autograder/__init__.py"] = _with_docstring((package / "__init__.py").read_text(), _INIT_DOCSTRING)
    for module in KEPT_MODULES[1:]:
        files[f"autograder/{module}.py"] = package / f"{module}.py"
    for path in sorted(package.glob("lesson*.py")):
        if _LESSON.match(path.stem):
            files[f"autograder/{path.name}"] = prune_lesson(path.read_text(), path.stem)
    main = _load_toml(root / "pyproject.toml")
    env_name = re.search(r"^name:\s*(\S+)", (root / "environment.yml").read_text(), re.M)
    env_name = env_name[1] if env_name else "distributed-course"
    files["pyproject.toml"] = learner_pyproject(main)
    files["environment.yml"] = learner_environment(main, env_name)
    files["Makefile"] = learner_makefile((root / "Makefile").read_text())
    files["README.md"] = _README.format(python=main["project"]["requires-python"].replace(">=", "") + " or newer",
                                        env_name=env_name)
    files[".gitignore"] = _GITIGNORE
    return files


def _write(out: Path, files: dict[str, str | Path]) -> None:
    for name, what in files.items():
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(what, Path):
            shutil.copy2(what, target)
        else:
            target.write_text(what)
    names = sorted([*files, "MANIFEST.txt"])
    (out / "MANIFEST.txt").write_text("\n".join(names) + "\n")


def _replaceable(dest: Path, root: Path) -> None:
    """Refuse a place that is not new, empty or an earlier release, or that lies inside what ships."""
    if dest.exists() and not dest.is_dir():
        raise ReleaseError(f"{dest} exists and is not a folder; choose another place for the release.")
    if dest.is_dir() and any(p.name != ".git" for p in dest.iterdir()) and not (dest / "MANIFEST.txt").is_file():
        raise ReleaseError(f"{dest} holds files but no MANIFEST.txt, so it is not an earlier release, and building "
                           "there would delete them. Choose a new or empty folder (a git checkout with no files "
                           "besides .git will do).")
    for source in ("course", "helpers", "autograder"):
        if (root / source).resolve() in dest.resolve().parents:
            raise ReleaseError(f"{dest} is inside {root / source}, which the release copies from; build it "
                               f"elsewhere, for example into {root / DEFAULT_DIR}.")


def build(dest: Path, root: Path = ROOT) -> Path:
    """Build the learner distribution into ``dest`` (replacing an earlier release there) and ``dest.tar.gz``.

    A ``.git`` folder in ``dest`` is kept, so ``dest`` can stay a checkout of the published
    learner repository: build, then commit and push there. Returns ``dest``. Raises
    :class:`ReleaseError` when what would ship is not right.
    """
    dest = Path(dest).absolute()
    _replaceable(dest, root)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        _write(staging, _contents(root))
        _check_imports(staging, root)
        _check_no_markup(staging)
        if (dest / ".git").exists():
            (dest / ".git").rename(staging / ".git")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    archive = dest.parent / f"{dest.name}.tar.gz"

    def owned_by_nobody(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(archive, "w:gz") as tar:
        for name in (dest / "MANIFEST.txt").read_text().splitlines():
            tar.add(dest / name, arcname=f"{dest.name}/{name}", filter=owned_by_nobody)
    return dest


def main(argv: list[str]) -> int:
    """``python -m autograder release [DIR]``: build, then say where it went and how big it is."""
    if len(argv) > 1 or argv and argv[0].startswith("-"):
        print("usage: python -m autograder release [DIR]   (default: dist/learner-course)", file=sys.stderr)
        return 2
    dest = Path(argv[0]) if argv else ROOT / DEFAULT_DIR
    try:
        out = build(dest)
    except ReleaseError as err:
        print(f"release: {err}", file=sys.stderr)
        return 1
    names = (out / "MANIFEST.txt").read_text().splitlines()
    size = sum((out / n).stat().st_size for n in names)
    archive = out.parent / f"{out.name}.tar.gz"
    print(f"Learner course written to {out} ({len(names)} files, {size / 1e6:.1f} MB) and {archive} "
          f"({archive.stat().st_size / 1e6:.1f} MB).\nPublish the folder as its own git repository, set REPOSITORY "
          "in autograder/colab.py to its address and run `make course` (see docs/instructors.md, Publishing the "
          "course).")
    return 0
