"""What the learner release ships of autograder/, and the error a build stops with."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DEFAULT_DIR", "SHIPPED", "INSTRUCTOR_ONLY", "JUNK", "MARKUP", "ReleaseError"]


DEFAULT_DIR = Path("dist") / "learner-course"

#: What learners get of autograder/, copied whole as it is in the instructor's checkout (paths inside
#: autograder/): the package's entry point, where the course lies, the exercise kit, every lesson's
#: declarations and self-checks, and the learner's own commands. None of them holds an answer or a hidden
#: check, and none imports a package that does not ship (tests/test_structure.py holds them to it).
SHIPPED = ("__init__.py", "paths.py", "kit", "lessons", "learner")
#: What stays with the instructor: the answers, the hidden checks, grading, the notebooks' build, the release,
#: the website, and the instructor's command line.
INSTRUCTOR_ONLY = ("answers", "hidden", "grading", "notebooks", "release", "site", "__main__.py")
JUNK = re.compile(r"(^|/)(__pycache__|\.ipynb_checkpoints)(/|$)|\.py[cod]$")
MARKUP = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


class ReleaseError(RuntimeError):
    """The learner distribution cannot be built as asked; the message says why and what to do."""
