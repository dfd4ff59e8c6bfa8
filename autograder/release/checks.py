"""Checks on what ships: no shipped module imports one left out, no notebook has outputs or markup,
and the notebooks' Colab cells point at a published course."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from .rules import MARKUP, SHIPPED, ReleaseError

__all__ = ["check_imports", "check_notebook", "check_no_markup", "check_colab", "is_placeholder"]


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
                kept = ", ".join(f"autograder/{m}" for m in SHIPPED)
                raise ReleaseError(
                    f"{rel} line {line} imports {name}, which the learner distribution leaves out (of autograder/ "
                    f"it ships {kept}). Learners would get an ImportError. Move what the import is for into a "
                    "package that ships (as lessons/lesson06.py holds bucket_layout), or stop importing it there."
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


def _placeholder_refused(placeholder: str) -> ReleaseError:
    return ReleaseError(
        f"REPOSITORY in autograder/notebooks/colab.py is still the placeholder {placeholder}, which holds no course: "
        "every notebook's Open in Colab badge and set-up cell would point there, and learners on Colab could not "
        "start. Create the learner repository on GitHub (empty for now), set REPOSITORY to its address, run `make "
        "course` and commit, then build the release again (docs/instructors.md, Publishing the course). To build a "
        "draft to try out first, run `python -m autograder release --allow-colab-placeholder [DIR]`: its README then "
        "says at the top that the Colab badges do not work."
    )


def is_placeholder(repository: str) -> bool:
    """Whether ``repository`` is :data:`autograder.notebooks.colab.PLACEHOLDER`, the address no course is published at."""
    from ..notebooks.colab import PLACEHOLDER

    return repository.rstrip("/").removesuffix(".git") == PLACEHOLDER


def check_colab(notebooks: dict[str, Path], repository: str, allow_placeholder: bool = False) -> bool:
    """Fail unless every notebook's Colab badge and set-up cell point at ``repository``, and it is not the placeholder.

    ``notebooks`` maps each notebook's path in the release (``course/<lesson>/<lesson>.ipynb``) to
    its file. With ``allow_placeholder`` the placeholder passes (a draft); returns whether it is one.
    """
    from ..notebooks.colab import BADGE_ID, PLACEHOLDER, SETUP_ID, colab_url

    draft = is_placeholder(repository)
    if draft and not allow_placeholder:
        raise _placeholder_refused(PLACEHOLDER)
    for rel, path in sorted(notebooks.items()):
        cells = {c.get("id"): c["source"] if isinstance(c["source"], str) else "".join(c["source"])
                 for c in json.loads(path.read_text())["cells"]}
        lesson = Path(rel).parent.name
        try:
            badge = colab_url(lesson, repository)
        except ValueError as err:
            raise ReleaseError(str(err)) from None
        if badge not in cells.get(BADGE_ID, "") or f'"{repository}.git"' not in cells.get(SETUP_ID, ""):
            found = re.search(r"colab\.research\.google\.com/github/([^/\s)]+/[^/\s)]+)", cells.get(BADGE_ID, ""))
            where = f"github.com/{found[1]}" if found else f"no Colab badge (cell id {BADGE_ID!r})"
            raise ReleaseError(f"{rel} points learners on Colab at {where}, but REPOSITORY in "
                               f"autograder/notebooks/colab.py is {repository}. Run `make course` to write the current "
                               "REPOSITORY into every notebook, commit course/, and build the release again.")
    return draft
