"""What ``make grade`` takes in: a folder of ``<student>/<lesson>/<lesson>.ipynb`` copied into the
course's ``autograder/submitted/``, where nbgrader grades from (:func:`collect`).

The folder may be one learners handed in (``python -m autograder hand-in``'s archives, unpacked),
or ``autograder/submitted/`` itself, where nbgrader's collect from the exchange and the
formgrader's Collect button put submissions (:mod:`autograder.grading.exchange`).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from ..notebooks.generate import lessons
from ..paths import ROOT

__all__ = ["collect", "EXCHANGE_FILES"]

WORK = ROOT / "autograder"


#: What nbgrader's exchange puts beside a collected notebook, kept with it: when it was submitted
#: (late penalties read it), and the secret under which its feedback is released to the learner.
EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")


def collect(source: Path) -> dict[str, list[str]]:
    """Copy ``source/<student>/<lesson>/<lesson>.ipynb`` into autograder/submitted/; returns lesson -> students.

    nbgrader's own ``timestamp.txt`` and ``submission_secret.txt`` travel with the notebook (a
    submission from the exchange keeps its time, and its feedback can be released to the learner);
    a notebook without them is stamped now. ``source`` may be autograder/submitted/ itself (where
    nbgrader's collect and the formgrader's Collect button put submissions): it is graded in place.
    """
    known = set(lessons())
    found: dict[str, list[str]] = {}
    in_place = source.resolve() == (WORK / "submitted").resolve()
    for student_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        for lesson_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            notebook = lesson_dir / f"{lesson_dir.name}.ipynb"
            if lesson_dir.name not in known or not notebook.is_file():
                print(f"  skipped {lesson_dir.relative_to(source)}: not a lesson notebook of this course")
                continue
            target = WORK / "submitted" / student_dir.name / lesson_dir.name
            if not in_place:
                if target.exists():
                    shutil.rmtree(target)
                target.mkdir(parents=True)
                shutil.copy2(notebook, target / notebook.name)
                for name in EXCHANGE_FILES:
                    if (lesson_dir / name).is_file():
                        shutil.copy2(lesson_dir / name, target / name)
            if not (target / "timestamp.txt").is_file():
                (target / "timestamp.txt").write_text(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
            found.setdefault(lesson_dir.name, []).append(student_dir.name)
    return found
