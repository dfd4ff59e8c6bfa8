"""Checks on what ships: no kept module imports one left out, no notebook has outputs or markup."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from .rules import KEPT_MODULES, MARKUP, ReleaseError

__all__ = ["check_imports", "check_notebook", "check_no_markup"]


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


def check_imports(out: Path, root: Path) -> None:
    """Fail when a shipped file of ``autograder`` or ``helpers`` imports one of their modules that does not ship."""

    def module_in(folder: Path, parts: list[str]) -> bool:
        here = folder.joinpath(*parts)
        return here.with_suffix(".py").is_file() or (here / "__init__.py").is_file()

    def deepest_module(folder: Path, parts: list[str]) -> list[str]:
        """The longest start of ``parts`` that is a module or package in ``folder`` (``[]`` if none)."""
        for end in range(len(parts), 0, -1):
            if module_in(folder, parts[:end]):
                return parts[:end]
        return []

    for path in sorted(out.rglob("*.py")):
        rel = path.relative_to(out)
        for line, name, surely in _imported_modules(path, ".".join(rel.parts[:-1])):
            parts = name.split(".")
            if parts[0] not in ("autograder", "helpers") or len(parts) < 2:
                continue
            shipped = deepest_module(out, parts)
            if shipped == parts or (not surely and len(shipped) == len(parts) - 1):
                continue  # the module ships (or a name of a module that ships)
            if surely or len(deepest_module(root, parts)) > len(shipped):
                kept = ", ".join(f"autograder/{m}.py" for m in KEPT_MODULES)
                raise ReleaseError(
                    f"{rel} line {line} imports {name}, which the learner distribution leaves out (of autograder/ "
                    f"it ships __init__.py, {kept} and the lessons/lessonNN.py modules). Learners would get an "
                    "ImportError. Move what the import is for into a module that ships (as lesson06.py holds "
                    "bucket_layout), or stop importing it there."
                )


def check_notebook(path: Path, rel: str) -> None:
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
            raise ReleaseError(f"{rel} cell {i} has outputs or an execution count; learners get the notebooks as "
                               "committed, without outputs. Run `make course` to regenerate course/ and commit it.")


def check_no_markup(out: Path) -> None:
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        text = path.read_text(errors="replace")
        hit = next((m for m in MARKUP if m in text), None)
        if hit:
            raise ReleaseError(f"{path.relative_to(out)} contains {hit!r}: solution or hidden-test markup must never "
                               "reach learners. Regenerate course/ with `make course`, or remove the text.")
