"""What the learner release keeps and what it never ships, and the error a build stops with."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["ROOT", "DEFAULT_DIR", "KEPT_MODULES", "LESSON", "JUNK", "MARKUP", "STUB", "ROOT_NAMES", "ReleaseError"]


# The repository this module belongs to: it holds course/, helpers/, pyproject.toml, Makefile.
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = Path("dist") / "learner-course"

# The autograder modules learners get besides autograder/__init__.py and the lessons/lessonNN.py
# files (paths inside autograder/, without .py); every other module stays with the instructor.
# None of them holds an answer or a hidden test (tests/test_release.py looks for both).
KEPT_MODULES = (
    "lessons/__init__", "lessons/kit", "lessons/registry", "lessons/harness", "lessons/pieces", "lessons/ringcheck",
    "lessons/gradcheck", "lessons/torchrun", "lessons/torchrun_programs", "lessons/torchrun_feedback",
    "lessons/shardcheck",
    "lessons/tpcheck", "lessons/pipecheck", "lessons/cpcheck", "lessons/cpdata", "lessons/sealed", "lessons/plancheck",
    # The learner's commands: `make check` (selfcheck, reading the notebook with clean's reader)
    # and `make handin`; grading's __init__ ships with a docstring of its own (prune.GRADING_DOCSTRING).
    "grading/__init__", "grading/clean", "grading/selfcheck", "grading/handin",
)
LESSON = re.compile(r"lesson\d{2}$")
JUNK = re.compile(r"(^|/)(__pycache__|\.ipynb_checkpoints)(/|$)|\.py[cod]$")
MARKUP = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
STUB = "HIDDEN_CHECK"  # the name every Part's check becomes: autograder.lessons.kit.HIDDEN_CHECK
ROOT_NAMES = ("EXERCISES",)  # what kit's registry reads from a lesson module: kept, with all it uses


class ReleaseError(RuntimeError):
    """The learner distribution cannot be built as asked; the message says why and what to do."""
