"""Build the learner notebooks (course/) from the instructor notebooks (solutions/).

``make course`` (or ``python -m autograder build``) runs nbgrader's generate_assignment
for every lesson: solutions are replaced by stubs that name their exercise, hidden
tests are removed, outputs are cleared, and the result lands in course/<lesson>/.
``python -m autograder check`` rebuilds into a temporary folder and reports every
lesson whose committed course/ notebook differs (the test suite runs the same check).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..paths import ROOT

__all__ = ["tool_env", "course_directory", "nbgrader_api", "lessons", "build", "stale_lessons", "strip_outputs"]


def tool_env() -> dict[str, str]:
    """The environment for nbgrader's subprocesses: it calls `alembic` by name, so the
    virtual environment's bin folder must be on PATH even when it is not activated."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def lessons(root: Path = ROOT) -> list[str]:
    """Lesson names: folders solutions/<name>/ holding <name>.ipynb."""
    src = root / "solutions"
    return sorted(p.name for p in src.iterdir() if (p / f"{p.name}.ipynb").is_file()) if src.is_dir() else []


def nbgrader_api(root: Path | None = None, **settings: Any) -> Any:
    """nbgrader's API over the course at ``root`` (default: :data:`ROOT`), in this process.

    ``settings`` are ``{"Class.trait": value}`` on top of the course's nbgrader_config.py.
    One process can run many nbgrader commands this way, paying for nbgrader's imports
    once instead of starting ``python -m nbgrader`` for each.
    """
    from nbgrader.apps.api import NbGraderAPI

    from .imports import alembic_head_in_process

    os.environ["PATH"] = tool_env()["PATH"]  # nbgrader runs `alembic` by name
    alembic_head_in_process()  # a new gradebook's schema revision without that command (2 s of CPU)
    coursedir = course_directory(root, **settings)
    return NbGraderAPI(coursedir=coursedir, config=coursedir.config)


def course_directory(root: Path | None = None, **settings: Any) -> Any:
    """nbgrader's ``CourseDirectory`` of the course at ``root`` (default: :data:`ROOT`): its folders as the course's
    nbgrader_config.py names them, with ``settings`` (``{"Class.trait": value}``) on top.

    >>> course_directory().release_directory
    'course'
    """
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root or ROOT)).load_config()
    extra = Config()
    for dotted, value in settings.items():
        section, name = dotted.split(".")
        extra[section][name] = value
    config.merge(extra)
    return CourseDirectory(config=config)


def build(names: list[str] | None = None, release_dir: Path | None = None, db_path: Path | None = None) -> None:
    """Generate the learner notebooks (nbgrader's generate_assignment); into course/ unless ``release_dir`` is given.

    Every lesson is also recorded in the gradebook (``db_path``, default the course's).
    """
    settings: dict[str, Any] = {}
    if release_dir is not None:
        settings["CourseDirectory.release_directory"] = str(release_dir)
    if db_path is not None:
        settings["CourseDirectory.db_url"] = f"sqlite:///{db_path}"
    api = nbgrader_api(**settings)
    for name in names or lessons():
        done = api.generate_assignment(name, force=True, create=True)
        if not done["success"]:
            raise RuntimeError(f"nbgrader generate_assignment {name} failed:\n{done.get('log', '')}\n"
                               f"{done.get('error', '')}")


def _cells(path: Path) -> list[tuple]:
    nb = json.loads(path.read_text())
    return [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"],
             json.dumps(c.get("metadata", {}).get("nbgrader", {}), sort_keys=True)) for c in nb["cells"]]


def stale_lessons(root: Path = ROOT) -> list[str]:
    """Lessons whose course/ notebook is missing or differs from a fresh build."""
    with tempfile.TemporaryDirectory() as tmp:
        build(release_dir=Path(tmp) / "release", db_path=Path(tmp) / "gradebook.db")
        stale = []
        for name in lessons(root):
            fresh = Path(tmp) / "release" / name / f"{name}.ipynb"
            committed = root / "course" / name / f"{name}.ipynb"
            if not committed.is_file() or _cells(fresh) != _cells(committed):
                stale.append(name)
        return stale


def strip_outputs(path: Path) -> bool:
    """Remove outputs and execution counts from a notebook in place; True if it changed."""
    nb = json.loads(path.read_text())
    changed = False
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count")):
            cell["outputs"], cell["execution_count"] = [], None
            changed = True
    if changed:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        stale = stale_lessons()
        if stale:
            print("Out of date in course/: " + ", ".join(stale) + ". Run `make course` and commit course/.")
            return 1
        print(f"course/ matches solutions/ ({len(lessons())} lessons).")
        return 0
    names = argv or lessons()
    unknown = sorted(set(names) - set(lessons()))
    if unknown:
        print(f"No lesson named {', '.join(unknown)} in solutions/ (have: {', '.join(lessons())}).")
        return 2
    for name in names:
        nb = ROOT / "solutions" / name / f"{name}.ipynb"
        if strip_outputs(nb):
            print(f"stripped outputs from {nb.relative_to(ROOT)}")
    build(names)
    print(f"Built course/ from solutions/: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
