"""Does any module of helpers/, autograder/ or devtools/ import itself back through others,
or a package it stands below?

The imports are read with :mod:`ast`, without running anything: every ``import`` and
``from ... import`` in a file counts, also those inside functions and under
``if TYPE_CHECKING:`` (a lazy import hides a circle, it does not remove it), and relative
imports are resolved against the file's package. ``from pkg import name`` is an arrow to
``pkg/name.py`` when that module exists, else to ``pkg/__init__.py``. A parent package's
``__init__.py`` that Python runs on the way to a submodule is not counted as an arrow:
only what a file names.

Run alone: ``pytest tests/test_structure.py -q`` (well under a second).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("helpers", "autograder", "devtools")
#: Who may import whom among the packages: the course's runtime stands alone, the grading
#: tools use it, and the developers' tools (not shipped) may use both.
LAYERS = {"helpers": set(), "autograder": {"helpers"}, "devtools": {"helpers", "autograder"}}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of PACKAGES."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The modules of ``modules`` that ``name`` (the file ``path``) imports -> first line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _package_of(name, path)
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        # `import a.b.c` or `from a.b import c`: the deepest of these that is one of ours.
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                child = f"{origin}.{alias.name}"
                add(child if child in modules else origin, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(group: list[str], graph: dict[str, dict[str, int]]) -> str:
    modules = _modules()
    rel = {m: modules[m].relative_to(ROOT).as_posix() for m in group}
    lines = [f"import circle among {len(group)} files: {', '.join(rel[m] for m in group)}"]
    for a in group:
        for b, line in sorted(graph[a].items()):
            if b in group:
                lines.append(f"  {rel[a]}:{line} imports {rel[b]}")
    return "\n".join(lines)


def test_no_import_circles():
    """Do helpers/ and autograder/ import one way only (no file imports itself back)?"""
    graph = import_graph()
    found = circles(graph)
    assert not found, "\n".join(_describe(g, graph) for g in found) + (
        "\nMove what both sides need into a module below them, so the imports run one way."
    )


def test_packages_import_downward_only():
    """Does helpers/ import nothing of autograder/ or devtools/, and autograder/ nothing of devtools/?"""
    graph = import_graph()
    modules = _modules()
    wrong = [
        f"{modules[a].relative_to(ROOT).as_posix()}:{line} imports {b}"
        for a, targets in sorted(graph.items())
        for b, line in sorted(targets.items())
        if b.split(".")[0] != a.split(".")[0] and b.split(".")[0] not in LAYERS[a.split(".")[0]]
    ]
    assert not wrong, "imports against the packages' order (helpers <- autograder <- devtools):\n" + "\n".join(wrong)


#: Who may import whom inside autograder/, arranged by who gets each room. Learners get the exercise kit
#: (kit/), every lesson's declarations and self-checks (lessons/) and their own commands (learner/); only
#: the instructor has the hidden checks (hidden/), the answers (answers/), grading a class (grading/),
#: building the notebooks (notebooks/), the release (release/) and the website (site/). The package's own
#: __init__ and __main__ (the command) stand above them all; the ground below them all (AUTOGRADER_GROUND)
#: says where the course is.
AUTOGRADER_LAYERS = {
    "kit": set(),
    "lessons": {"kit"},
    "learner": {"kit", "lessons"},
    "hidden": {"kit", "lessons"},
    "answers": {"lessons"},  # the statements an answer uses (lesson 04's chunk bounds, lesson 06's bucket rule)
    "notebooks": {"kit", "lessons"},
    "grading": {"kit", "lessons", "hidden", "learner", "notebooks"},
    "release": {"kit", "lessons", "notebooks"},
    "site": {"notebooks", "release"},  # the website: the Colab links of notebooks/, the clone folder of the release
}
#: What learners get of autograder/ (autograder.release.rules.SHIPPED, as module names).
SHIPPED = {"autograder", "autograder.paths", "kit", "lessons", "learner"}
#: Top-level modules of autograder/ that every room may import, since they import nothing of autograder/.
AUTOGRADER_GROUND = {"autograder.paths"}


def _room(module: str) -> str | None:
    """``kit`` for ``autograder.kit.exercise``; None for the package's own top-level modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in AUTOGRADER_LAYERS) else None


def test_autograder_rooms_import_downward_only():
    """Does every room of autograder/ import only the rooms below it (kit <- lessons <- hidden <- grading, ...)?"""
    graph = import_graph()
    modules = _modules()
    rooms = {m.split(".")[1] for m in modules if m.startswith("autograder.") and _room(m)}
    assert rooms == set(AUTOGRADER_LAYERS), f"autograder/ has rooms {sorted(rooms)}; give each its place in AUTOGRADER_LAYERS"
    wrong = [
        f"{modules[a].relative_to(ROOT).as_posix()}:{line} imports {b}"
        for a, targets in sorted(graph.items()) if a.startswith("autograder.") and _room(a)
        for b, line in sorted(targets.items())
        if b.split(".")[0] == "autograder" and _room(b) != _room(a) and b not in AUTOGRADER_GROUND
        and (_room(b) is None or _room(b) not in AUTOGRADER_LAYERS[_room(a)])
    ]
    assert not wrong, ("imports against autograder/'s order (AUTOGRADER_LAYERS):\n" + "\n".join(wrong))


def _ships(module: str) -> bool:
    return module in SHIPPED or _room(module) in SHIPPED


def test_nothing_that_ships_imports_what_does_not():
    """Does no module learners get (autograder/__init__, paths, kit/, lessons/, learner/) import the answers, the
    hidden checks or any other room only the instructor has, lazily or not?"""
    from autograder.release.rules import SHIPPED as RELEASED

    assert {f"autograder.{name.removesuffix('.py')}" if name.endswith(".py") else name for name in RELEASED} == \
        {"autograder.__init__", "autograder.paths"} | (SHIPPED - {"autograder", "autograder.paths"})
    graph = import_graph()
    modules = _modules()
    shipped = [m for m in graph if m.startswith("autograder") and _ships(m)]
    assert len(shipped) > 20 and "autograder.lessons.lesson04" in shipped
    wrong = [
        f"{modules[a].relative_to(ROOT).as_posix()}:{line} imports {b}"
        for a in sorted(shipped) for b, line in sorted(graph[a].items())
        if b.startswith("autograder") and not _ships(b)
    ]
    assert not wrong, "what learners get imports what they do not get:\n" + "\n".join(wrong)


def test_the_ground_of_autograder_imports_none_of_it():
    """Do the modules every room of autograder/ may import (where the course is) import nothing of autograder/?"""
    graph = import_graph()
    assert AUTOGRADER_GROUND <= set(graph), f"no such modules: {sorted(AUTOGRADER_GROUND - set(graph))}"
    wrong = {a: sorted(b for b in graph[a] if b.startswith("autograder")) for a in sorted(AUTOGRADER_GROUND)}
    assert not any(wrong.values()), f"the ground of autograder/ imports autograder/ modules: {wrong}"


#: What the rank machinery (helpers/_runtime/) may take from the public folder above it: the
#: exceptions it raises, the output router it feeds, the launch settings it is given, and the
#: course's ring (only to switch it off when an exercise forbids it). Anything else would tie the machinery to what learners call.
RUNTIME_MAY_USE = {"helpers.errors", "helpers.output", "helpers.ring", "helpers.settings"}


def test_the_runtime_does_not_import_what_learners_call():
    """Does helpers/_runtime/ import, from helpers/, only errors, output, settings and ring?"""
    graph = import_graph()
    modules = _modules()
    wrong = [
        f"{modules[a].relative_to(ROOT).as_posix()}:{line} imports {b}"
        for a, targets in sorted(graph.items()) if a.startswith("helpers._runtime")
        for b, line in sorted(targets.items())
        if b.startswith("helpers") and not b.startswith("helpers._runtime") and b not in RUNTIME_MAY_USE
    ]
    assert not wrong, "helpers/_runtime/ reaches up into the public helpers:\n" + "\n".join(wrong)


def test_reader_sees_lazy_relative_and_type_checking_imports(tmp_path: Path):
    """Does the reader count imports inside functions, under TYPE_CHECKING, and relative ones?"""
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .b import X\n"
        "def f():\n    from . import c\n"
        "from ..top import y\n"
    )
    modules = {"pkg.sub.a": a, "pkg.sub.b": a, "pkg.sub.c": a, "pkg.top": a}
    assert imports_of("pkg.sub.a", a, modules) == {"pkg.sub.b": 3, "pkg.sub.c": 5, "pkg.top": 6}
    assert circles({"x": {"y": 1}, "y": {"z": 1}, "z": {"x": 1}, "w": {"x": 1}}) == [["x", "y", "z"]]


def test_every_relative_import_resolves():
    """Does every relative import name a module (or a name of a package's __init__) that exists?

    A moved module leaves its lazy ``from .x import y`` behind; this finds it without running it.
    """
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        package = _package_of(name, path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            origin = ".".join(base + ([node.module] if node.module else []))
            if origin not in modules:
                wrong.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}: no module {origin}")
                continue
            if modules[origin].name == "__init__.py":
                for alias in node.names:
                    child = f"{origin}.{alias.name}"
                    if child not in modules and not _defines(modules[origin], alias.name):
                        wrong.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}: {origin} has no {alias.name}")
    assert not wrong, "\n".join(wrong)


def _defines(path: Path, name: str) -> bool:
    """Whether the module at ``path`` binds ``name`` at its top level (or serves it from ``__getattr__``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in (name, "__getattr__"):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


@pytest.mark.parametrize("package", ("helpers", "autograder"))
def test_every_package_is_read(package: str):
    """Does the reader find the package's modules (so an empty graph cannot pass unnoticed)?"""
    graph = import_graph()
    assert sum(1 for m in graph if m.split(".")[0] == package) > 5
    assert any(graph[m] for m in graph if m.split(".")[0] == package)


#: The longest a module and a class may grow before they are split (issue 26's rule of thumb).
MODULE_LINES, CLASS_LINES = 400, 250


def test_no_module_or_class_is_longer_than_a_reader_can_hold():
    """Is every module of helpers/, autograder/ and devtools/ at most 400 lines, and every class in them at most 250?"""
    long_modules, long_classes = [], []
    for name, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            long_modules.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LINES:
                long_classes.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long_modules, f"modules over {MODULE_LINES} lines (split them by what they do): {long_modules}"
    assert not long_classes, f"classes over {CLASS_LINES} lines (move a responsibility out): {long_classes}"
    assert len(_modules()) > 50  # the reader found the packages


def test_every_module_that_hands_in_to_the_graded_class_runs_on_its_worker():
    """Does every test module that uses the session's graded class run in the one pytest-xdist group that grades it?

    ``graded_class`` is a session fixture: a worker that asks for it grades every learner of the session again
    (six minutes of CI when tests/test_release_learner.py once landed on the other worker)."""
    from conftest import worker_group

    import re

    hands_in = re.compile(r"^HANDED_IN\s*=|^def hand_in\(|^def \w+\([^)]*\bgraded_(class|lesson)\b", re.MULTILINE)
    users = sorted(p.stem for p in (ROOT / "tests").glob("test_*.py") if hands_in.search(p.read_text(encoding="utf-8")))
    assert "test_release_learner" in users and "test_grading_e2e" in users, users
    assert {m: worker_group(m) for m in users if worker_group(m) != "graded-class"} == {}
