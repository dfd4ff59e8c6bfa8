"""What one submission's grading is given (:class:`Task`) and what it gives back (:class:`Graded`).

Both are plain data, and both carry their files as bytes: a task holds everything a worker
needs (the lesson's grading files and the learner's notebook), and its record holds
everything the worker made (the graded notebook, the feedback page, the private gradebook's
rows, the log). So the same task can be graded in this process, in a worker process beside
it, or on another machine that shares no folder with the instructor's, and the one process
that merges results into the course needs nothing from the worker's disk.

Example::

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> write_files(folder, {"a/b.txt": b"hi", "c.txt": b"there"})
    >>> sorted(read_files(folder).items())
    [('a/b.txt', b'hi'), ('c.txt', b'there')]
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Dict

__all__ = ["Task", "Graded", "Unfinished", "Files", "TRIES", "read_files", "write_files", "lesson_files"]


#: Tries a submission gets when grading fails for a reason that is not the learner's (a worker
#: that died while grading it counts as one).
TRIES = 2

#: Files by their path relative to a folder (``/`` between parts), with their bytes.
Files = Dict[str, bytes]


def read_files(folder: Path, skip: tuple[str, ...] = ()) -> Files:
    """Every plain file under ``folder``, by relative path; names in ``skip`` (files or folders) are left out.

    Links are left out too: a learner's kernel may leave one in its folder, pointing at a file of
    the grading machine.
    """
    out: Files = {}
    for top, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in skip and not os.path.islink(os.path.join(top, d)))
        for name in sorted(names):
            path = Path(top) / name
            if name not in skip and not path.is_symlink() and path.is_file():
                out[path.relative_to(folder).as_posix()] = path.read_bytes()
    return out


def write_files(folder: Path, files: Files) -> None:
    """Write ``files`` under ``folder``; a path that would leave it (``..``, absolute) is an error."""
    for name, data in files.items():
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(f"refusing to write {name!r}: a task's files must stay inside their folder {folder}")
        target = folder.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def lesson_files(course: Path, lesson: str, template: Path) -> Files:
    """What grading any submission of ``lesson`` needs, laid out as in the course root.

    nbgrader's configuration; where it puts them, the lesson's instructor folder (nbgrader reads
    the graded cells from the gradebook, restores files from it, and the verdicts name the parts
    from it) and its released notebook (deleted graded cells are put back from it:
    :class:`autograder.notebooks.preprocessors.RestoreMissingCells`); and ``autograder/gradebook.db``:
    a gradebook that knows every lesson and no submission.
    """
    from ..notebooks.generate import course_directory

    coursedir = course_directory(course)

    def folder(step: str) -> Path:
        return Path(coursedir.format_path(step, ".", lesson))

    def inside(path: Path) -> str:
        return Path(os.path.relpath(path, coursedir.root)).as_posix()

    files = {"nbgrader_config.py": (course / "nbgrader_config.py").read_bytes(),
             "autograder/gradebook.db": template.read_bytes()}
    source = folder(coursedir.source_directory)
    for name, data in read_files(source, skip=(".ipynb_checkpoints", "__pycache__")).items():
        files[f"{inside(source)}/{name}"] = data
    released = folder(coursedir.release_directory) / f"{lesson}.ipynb"
    if released.is_file():  # else nbgrader's log says that deleted cells cannot be put back
        files[inside(released)] = released.read_bytes()
    return files


@dataclass(frozen=True)
class Task:
    """Everything one submission's grading needs, as bytes: it can travel to any worker."""

    student: str
    lesson: str
    course: Files  # :func:`lesson_files`: written into the work folder as it is
    submitted: Files  # the learner's folder: <lesson>.ipynb (and nbgrader's timestamp.txt)
    sandboxed: bool = True
    attempt: int = 1

    @property
    def name(self) -> str:
        return f"{self.student}/{self.lesson}"


@dataclass
class Graded:
    """How grading one submission went; :meth:`record` is its entry in ``grading-run.json``."""

    student: str
    lesson: str
    attempt: int = 1
    status: str = "failed"  # "ok" when scores and feedback were made
    failure: str | None = None  # whose failure: "infrastructure" or "learner" (None when ok)
    error: str | None = None  # the line that says what went wrong
    notes: list[str] = field(default_factory=list)  # what the learner should know (their kernel died)
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    cells: dict[str, Any] = field(default_factory=dict)  # the notebook's run: count, seconds, slowest
    parts: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    worker: str = ""  # where it was graded (a Dask worker's address, or host and process)
    log: str = ""
    #: What the worker made, under autograder/: autograded/<student>/<lesson>/..., feedback/<student>/<lesson>/...
    files: Files = field(default_factory=dict)
    #: The private gradebook's rows of this submission (:func:`autograder.grading.merge.rows`).
    gradebook: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """Everything but the files, the gradebook rows and the log (which goes to a file of its own);
        ``attempt`` as ``tries``."""
        out = asdict(self)
        for bulky in ("files", "gradebook", "log"):
            del out[bulky]
        out["tries"] = out.pop("attempt")
        return out


class Unfinished(Exception):
    """A step of grading found that the submission can be graded no further: whose failure that is
    (``"infrastructure"`` or ``"learner"``, as :attr:`Graded.failure`) and the line that says why."""

    def __init__(self, failure: str, error: str) -> None:
        super().__init__(error)
        self.failure, self.error = failure, error
