"""Bytecode for what grading's sandboxed processes import, compiled once before a run on this machine.

The grading sandbox shows Python's packages read-only (:mod:`autograder.grading.sandbox`), so a
module installed without its bytecode is compiled again by every sandboxed process that imports
it: each kernel, each clean re-grade and each rank factory of every submission. Installers
differ: pip compiles by default, uv does not unless told (``--compile-bytecode``), nor does
``pip install --no-compile``. Measured on the course's 2-core machine, `make test` without the
bytecode ran 1.5x slower (25:22 against 17:25), and a right answer to lesson 10 lost a part to its
10 s limit while its rank was still compiling torch's modules.

:func:`prepare` looks for the bytecode of the packages every graded submission imports
(:data:`MODULES`), and where some is missing compiles the package folders they live in, once,
saying so; where those folders are not this user's to write, it says which command would. The course's own
packages (:data:`COURSE_PACKAGES`) are brought up to date in the checkout every time (only changed files compile).

Example::

    from autograder.grading.bytecode import prepare
    prepare()      # [] once every package that grading imports has its bytecode
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable, Iterable

__all__ = ["MODULES", "COURSE_PACKAGES", "missing", "prepare"]

#: Packages every graded submission imports in its sandboxed processes (kernel, clean re-grade, ranks).
MODULES = ("torch", "numpy", "matplotlib", "ipykernel", "jupyter_client", "zmq", "tornado", "nbformat", "cloudpickle")
#: The course's own packages, imported by those processes too. They live in the checkout (an editable install), which
#: the sandbox also shows read-only, and they change with the course, so they are compiled where they are, each time,
#: which compiles only what changed.
COURSE_PACKAGES = ("helpers", "autograder")


def _source(name: str) -> Path | None:
    """The source file of module ``name`` (its ``__init__.py`` for a package), without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def missing(modules: Iterable[str] = MODULES) -> list[Path]:
    """The installation folders (site-packages and the like) that hold a module of ``modules`` (top-level names)
    without its bytecode."""
    folders: list[Path] = []
    for name in modules:
        source = _source(name)
        if source is None or Path(importlib.util.cache_from_source(str(source))).exists():
            continue
        folder = source.parent.parent if source.name == "__init__.py" else source.parent  # a top-level name's home
        if folder not in folders:
            folders.append(folder)
    return folders


def prepare(modules: Iterable[str] = MODULES, say: Callable[[str], None] = print,
            writable: Callable[[Path], bool] = lambda p: os.access(p, os.W_OK)) -> list[Path]:
    """Compile the bytecode of the folders :func:`missing` finds, where this user may write them; say what was done
    or, for the others, the command that would do it. Returns the folders still without bytecode."""
    for name in COURSE_PACKAGES:
        source = _source(name)
        if source is not None and writable(source.parent):
            compileall.compile_dir(str(source.parent), quiet=1, workers=0)
    folders = missing(modules)
    if not folders:
        return []
    mine = [f for f in folders if writable(f)]
    others = [f for f in folders if f not in mine]
    for folder in mine:
        say(f"Compiling the bytecode of {folder} once (installed without it; the grading sandbox shows it "
            f"read-only, so every sandboxed process would compile it again)...")
        compileall.compile_dir(str(folder), quiet=2, workers=0)
    left = missing(modules)
    for folder in others:
        if folder in left:
            say(f"Warning: {folder} has no bytecode and is not yours to write: every sandboxed process of this grading "
                f"compiles its modules again (slower, and under load a rank may run into a part's time limit). Its "
                f"owner can compile them once: {sys.executable} -m compileall -q -j 0 {folder}")
    return left
