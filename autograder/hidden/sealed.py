"""Answers a lesson's hidden checks compare with, where the grading sandbox hides their files.

Most hidden checks compare a learner's answer with one process computing the same thing; lesson 12's
compare a planner with the course's own planner, which is the instructor's answer itself
(``autograder/answers/lesson12.py``). The grading sandbox hides the whole ``answers`` package from
everything inside it, the learner's code included (:data:`autograder.grading.sandbox.HIDDEN_PACKAGES`).
So the clean re-grade (:mod:`autograder.grading.clean`) receives it another way, *sealed*:

1. a lesson's hidden checks name the answers they need: ``SEALED = ("lesson12",)`` in
   ``autograder/hidden/lesson12.py`` (:func:`sealed_modules`);
2. the grader opens those files outside the sandbox (:func:`open_sealed`) and hands the clean re-grade
   one open file descriptor each, named in the environment (``COURSE_SEALED_MODULES="lesson12:5"``);
3. the clean re-grade forks its rank factory first (which keeps no descriptor but its socket, so no
   rank ever has one), then makes itself unreadable to other processes, and only then
   :func:`unseal` reads each descriptor, closes it, and defines the module in memory as
   ``autograder.answers.lesson12``.

The learner's code runs only on ranks forked from that factory: it cannot open the file (hidden), read
the descriptor (never inherited) or the clean process's memory (not dumpable). :func:`load` gives the
hidden checks the module either way: imported where the file is there (the instructor's checkout, the
tests), unsealed in a clean re-grade. The hidden checks name the answers module only through
:func:`load`, never in an import statement, so that ``hidden/`` stands below ``answers/``
(``tests/test_structure.py``, ``AUTOGRADER_LAYERS``) and a missing file is a sentence, not a traceback.

Example::

    >>> load("lesson12").__name__
    'autograder.answers.lesson12'
    >>> sealed_modules(12), sealed_modules(4)
    (('lesson12',), ())
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

__all__ = ["ENV", "load", "unseal", "environment", "sealed_modules", "open_sealed"]

ENV = "COURSE_SEALED_MODULES"
#: The package the sealed modules belong to, and its folder (hidden in the grading sandbox).
PACKAGE = __name__.rpartition(".")[0].rpartition(".")[0] + ".answers"
FOLDER = Path(__file__).resolve().parents[1] / "answers"


def sealed_modules(lesson: int) -> tuple[str, ...]:
    """The answers modules lesson ``lesson``'s hidden checks need: ``SEALED`` of ``hidden/lessonNN.py``, else none."""
    try:
        module = importlib.import_module(f"{__name__.rpartition('.')[0]}.lesson{int(lesson):02d}")
    except ModuleNotFoundError:
        return ()
    return tuple(getattr(module, "SEALED", ()))


def open_sealed(lesson: int) -> dict[str, int]:
    """One read-only descriptor per module :func:`sealed_modules` names (the caller closes them once handed on)."""
    return {name: os.open(FOLDER / f"{name}.py", os.O_RDONLY) for name in sealed_modules(lesson)}


def environment(fds: dict[str, int]) -> dict[str, str]:
    """The environment entry naming each sealed module's descriptor."""
    return {ENV: ",".join(f"{name}:{fd}" for name, fd in fds.items())} if fds else {}


def unseal() -> list[str]:
    """Define every module handed over in :data:`ENV` from its descriptor (then closed); returns their names."""
    entries = [e for e in os.environ.pop(ENV, "").split(",") if e]
    done = []
    for entry in entries:
        name, _, fd = entry.partition(":")
        chunks = []
        while chunk := os.read(int(fd), 1 << 16):
            chunks.append(chunk)
        os.close(int(fd))
        module = types.ModuleType(f"{PACKAGE}.{name}")
        module.__package__ = PACKAGE
        sys.modules[module.__name__] = module
        exec(compile(b"".join(chunks), f"<sealed {name}.py>", "exec"), module.__dict__)  # noqa: S102
        done.append(name)
    return done


def load(name: str) -> types.ModuleType:
    """The answers module ``name`` (imported, or unsealed); a RuntimeError saying how to grade otherwise."""
    try:
        return importlib.import_module(f"{PACKAGE}.{name}")
    except ModuleNotFoundError as err:
        if err.name not in (f"{PACKAGE}.{name}", PACKAGE):
            raise
    raise RuntimeError(f"the hidden checks need autograder/answers/{name}.py, which this copy of the course does not "
                       "hold or cannot read: grade with the instructor's `make grade`, which hands it to the sandboxed "
                       "re-grade")
