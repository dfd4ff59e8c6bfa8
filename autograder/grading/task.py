"""What one submission's grading is given (:class:`Task`) and what it gives back (:class:`Graded`).

Both are plain data: a task can travel to any worker that sees its paths, and a record comes
back to the one process that merges it into the gradebook.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Task", "Graded", "TRIES"]


#: Tries a submission gets when grading fails for a reason that is not the learner's.
TRIES = 2


@dataclass(frozen=True)
class Task:
    """Everything one submission's grading needs; it can travel to any worker that sees these paths."""

    student: str
    lesson: str
    submitted: Path  # the folder holding <lesson>.ipynb (and nbgrader's timestamp.txt)
    course: Path  # the course root: nbgrader_config.py, solutions/, course/
    template: Path  # a gradebook that knows every lesson and no submission
    sandboxed: bool = True
    attempt: int = 1


@dataclass
class Graded:
    """How grading one submission went; :meth:`record` is its entry in ``grading-run.json``."""

    student: str
    lesson: str
    folder: str  # the work folder: autograder/{autograded,feedback}/..., autograder/gradebook.db
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
    log: str = ""

    def record(self) -> dict[str, Any]:
        """Everything but the work folder and the log (which goes to a file of its own); ``attempt`` as ``tries``."""
        out = asdict(self)
        del out["folder"], out["log"]
        out["tries"] = out.pop("attempt")
        return out
