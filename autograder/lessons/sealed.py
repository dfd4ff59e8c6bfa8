"""Instructor modules a lesson's hidden checks need, where the grading sandbox hides their files.

Most hidden checks compare a learner's answer with one process computing the same thing; lesson 12's
compare a planner with the course's own planner, which is the answer itself
(``autograder/lessons/reference_plan.py``). The grading sandbox hides that file from everything inside
it, the learner's code included. So the clean re-grade (:mod:`autograder.grading.clean`) receives it
another way, *sealed*:

1. a lesson module names what its hidden checks need: ``SEALED = ("reference_plan",)``
   (:func:`autograder.lessons.registry.sealed_modules`);
2. the grader opens those files outside the sandbox and hands the clean re-grade one open file
   descriptor each, named in the environment (``COURSE_SEALED_MODULES="reference_plan:5"``);
3. the clean re-grade forks its rank factory first (which keeps no descriptor but its socket, so no
   rank ever has one), then makes itself unreadable to other processes, and only then
   :func:`unseal` reads each descriptor, closes it, and defines the module in memory.

The learner's code runs only on ranks forked from that factory: it cannot open the file (hidden), read
the descriptor (never inherited) or the clean process's memory (not dumpable). :func:`load` gives the
hidden checks the module either way: imported where the file is there (the instructor's checkout, the
tests), unsealed in a clean re-grade.

Example::

    >>> load("reference_plan").__name__
    'autograder.lessons.reference_plan'
"""

from __future__ import annotations

import importlib
import os
import sys
import types

__all__ = ["ENV", "load", "unseal", "environment"]

ENV = "COURSE_SEALED_MODULES"
_PACKAGE = __name__.rpartition(".")[0]


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
        module = types.ModuleType(f"{_PACKAGE}.{name}")
        module.__package__ = _PACKAGE
        sys.modules[module.__name__] = module
        exec(compile(b"".join(chunks), f"<sealed {name}.py>", "exec"), module.__dict__)  # noqa: S102
        done.append(name)
    return done


def load(name: str) -> types.ModuleType:
    """The instructor module ``name`` (imported, or unsealed); a RuntimeError saying how to grade otherwise."""
    try:
        return importlib.import_module(f"{_PACKAGE}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"{_PACKAGE}.{name}":
            raise
    raise RuntimeError(f"the hidden checks need autograder/lessons/{name}.py, which this copy of the course does not "
                       "hold: grade with the instructor's `make grade`, which hands it to the sandboxed re-grade")
