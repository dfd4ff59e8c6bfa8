"""A learner's hand-in: their lesson notebooks in one zip archive, laid out as ``make grade`` reads them.

``make handin`` in the learner distribution runs it (with the system's Python: it needs
nothing but the standard library, no torch, no virtual environment)::

    python3 -m autograder.learner.handin [--student NAME] [--lesson LESSON ...]

(``make handin STUDENT=ada LESSON=05`` gives both through the environment, as ``$STUDENT``
and ``$LESSON``). It writes ``handin/<NAME>.zip`` holding ``<NAME>/<lesson>/<lesson>.ipynb`` for each lesson
handed in, so an instructor unpacks every learner's archive into one folder and grades it
with ``make grade SUBMISSIONS=folder`` (:func:`autograder.grading.intake.collect` reads that
layout). Which lessons: those named with ``--lesson`` (a number such as ``05``, or a folder
name), else every lesson whose notebook has at least one answer cell changed since the
course was released (nbgrader's checksum of the cell, stored in the notebook, no longer
matches, as :func:`changed_answers` computes it). The name is ``--student``; without it the
command asks for one when it runs in a terminal, offering a name made from ``git config
user.name``; elsewhere it stops and says to pass ``STUDENT=``.

Example::

    >>> student_name("Ada Lovelace"), student_name("ada_l-2")
    ('ada-lovelace', 'ada_l-2')
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import unicodedata
import zipfile
from pathlib import Path

from ..paths import ROOT

__all__ = ["VALID_NAME", "student_name", "changed_answers", "lesson_notebooks", "hand_in", "main"]

#: A name the archive, the folder inside it and nbgrader's gradebook can all use.
VALID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_NAME_RULE = "letters, digits, '-', '_' and '.', starting with a letter or digit, at most 64 characters"


def student_name(text: str) -> str:
    """``text`` made into a valid hand-in name: accents dropped, lower case, runs of other characters as ``-``."""
    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9_.]+", "-", plain.lower()).strip("-._")[:64]


def _checksum(cell: dict) -> str:
    """nbgrader's checksum of an answer (solution) cell (``nbgrader.utils.compute_checksum``, in the standard library)."""
    meta = cell["metadata"]["nbgrader"]
    source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    digest = hashlib.md5()
    for piece in (source, cell["cell_type"], str(meta.get("grade", False)), str(meta.get("solution", False)),
                  str(False), meta["grade_id"]):
        digest.update(piece.encode("utf-8"))
    if meta.get("grade", False):
        digest.update(str(float(meta["points"])).encode("utf-8"))
    return digest.hexdigest()


def changed_answers(notebook: Path) -> list[str]:
    """The grade ids of ``notebook``'s answer cells that differ from the released ones; ValueError if it is no notebook."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{notebook} cannot be read as a notebook ({type(err).__name__}: {err}). Save it again "
                         "from JupyterLab, or take a fresh copy of it from the course.") from None
    changed = []
    for cell in cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") and "checksum" in meta and _checksum(cell) != meta["checksum"]:
            changed.append(meta["grade_id"])
    return changed


def lesson_notebooks(course: Path) -> dict[str, Path]:
    """Lesson folder name -> its notebook, for every ``course/<NN-name>/<NN-name>.ipynb``."""
    return {p.name: p / f"{p.name}.ipynb" for p in sorted(course.iterdir())
            if p.is_dir() and re.match(r"\d+-", p.name) and (p / f"{p.name}.ipynb").is_file()}


def _pick(names: list[str], lessons: dict[str, Path]) -> list[str]:
    chosen = []
    for name in names:
        found = [lesson for lesson in lessons if lesson == name or (name.isdigit() and lesson.split("-")[0].lstrip("0")
                                                                   == name.lstrip("0"))]
        if len(found) != 1:
            raise ValueError(f"no lesson {name!r} in course/ (the lessons: {', '.join(lessons)}). Give its number, "
                             "for example LESSON=05, or its folder's name.")
        chosen += found
    return [lesson for lesson in lessons if lesson in chosen]


def hand_in(student: str, course: Path, out: Path, lessons: list[str] | None = None) -> tuple[Path, list[str], list[str]]:
    """Write ``out/<student>.zip``; returns it, the lessons in it, and the lessons left out (none changed).

    Raises ValueError, with the next step, when the name is not valid, a lesson is unknown or
    nothing would be handed in.
    """
    if not VALID_NAME.fullmatch(student):
        better = student_name(student)
        raise ValueError(f"{student!r} cannot name a hand-in: use {_NAME_RULE}"
                         + (f", for example STUDENT={better}." if better else "."))
    notebooks = lesson_notebooks(course)
    if lessons:
        chosen, skipped = _pick(lessons, notebooks), []
    else:
        chosen = [name for name, path in notebooks.items() if changed_answers(path)]
        skipped = [name for name in notebooks if name not in chosen]
    if not chosen:
        raise ValueError(f"no answer cell of any notebook in {course} has changed, so there is nothing to hand in. "
                         "Save your notebook in JupyterLab first (Ctrl+S), or name the lesson: make handin LESSON=05.")
    for name in chosen:
        changed_answers(notebooks[name])  # a notebook that cannot be read stops the hand-in here
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"{student}.zip"
    partial = archive.with_name(archive.name + ".part")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in chosen:
            zf.write(notebooks[name], f"{student}/{name}/{name}.ipynb")
    partial.replace(archive)
    return archive, chosen, skipped


def _suggested() -> str:
    """A name made from ``git config user.name`` (or ``user.email``'s part before the @), or ``""``."""
    for key in ("user.name", "user.email"):
        try:
            done = subprocess.run(["git", "config", key], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return ""
        if done.returncode == 0 and done.stdout.strip():
            return student_name(done.stdout.strip().split("@")[0])
    return ""


def _ask() -> str:
    """The learner's name, asked for in the terminal; ``""`` where there is no terminal to ask in."""
    if not sys.stdin.isatty():
        return ""
    offer = _suggested()
    print(f"Your name for the hand-in ({_NAME_RULE}; use the one your instructor gave you, if any).")
    try:
        answer = input(f"Name{f' [{offer}]' if offer else ''}: ").strip()
    except EOFError:
        return ""
    return answer or offer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make handin", description="Pack your lesson notebooks into handin/NAME.zip.")
    parser.add_argument("--student", default=os.environ.get("STUDENT", ""),
                        help="your name for the hand-in (default: $STUDENT, as `make handin STUDENT=...` sets it)")
    parser.add_argument("--lesson", action="append", default=None,
                        help="a lesson to hand in (default: $LESSON, as `make handin LESSON=05` sets it; without "
                        "either, every lesson with a changed answer cell)")
    parser.add_argument("--out", default=str(ROOT / "handin"), help="where the archive goes (default: handin/)")
    args = parser.parse_args(argv)
    student = args.student.strip() or _ask()
    if not student:
        print("make handin needs your name: run `make handin STUDENT=your-name` (use the name your instructor gave "
              f"you, if any; {_NAME_RULE}).", file=sys.stderr)
        return 2
    try:
        archive, chosen, skipped = hand_in(student, ROOT / "course", Path(args.out),
                                           args.lesson or os.environ.get("LESSON", "").replace(",", " ").split())
    except ValueError as err:
        print(f"make handin: {err}", file=sys.stderr)
        return 2
    archive_notebooks = lesson_notebooks(ROOT / "course")
    where = archive.relative_to(Path.cwd()) if archive.is_relative_to(Path.cwd()) else archive
    print(f"Wrote {where}: {len(chosen)} notebook{'s' if len(chosen) != 1 else ''} of {student}: {', '.join(chosen)}.")
    untouched = [name for name in chosen if not changed_answers(archive_notebooks[name])]
    if untouched:
        print(f"Note: no answer cell of {', '.join(untouched)} has changed since the course was released (is it saved?).")
    if skipped:
        print(f"Left out (no answer cell changed): {', '.join(skipped)}. Name a lesson to hand it in anyway: "
              "make handin LESSON=05.")
    print(f"Send {archive.name} to your instructor the way they ask (an upload page, e-mail). It holds the notebooks "
          "as last saved: save in JupyterLab (Ctrl+S) before running make handin.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
