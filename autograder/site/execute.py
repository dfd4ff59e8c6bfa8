"""Running an instructor notebook top to bottom, once per content: the executed-notebook cache.

The course website shows outputs of a real run, and the test suite runs every notebook in
``solutions/`` anyway (``tests/test_notebooks.py``). Both go through :func:`executed`, which
runs a notebook with nbclient and keeps the result in a cache keyed by what decides the
outputs (:func:`cache_key`), so a notebook runs once per change, not once per use.

- The key is a SHA-256 over the notebook's cells and metadata (outputs, execution counts
  and the page-only ``site`` cell metadata left out), the other files git knows in its
  lesson folder, the Python sources of ``helpers/`` and of what lessons import from
  ``autograder/`` (its ``__init__.py``, ``kit/``, ``lessons/`` and ``hidden/``; not the answers, grading, notebooks, release and
  site code, which only build or grade), the Python version, the machine type and the installed torch's
  version (a CUDA build's version names it, ``2.11.0+cu130``). Editing one lesson changes
  that lesson's key only; editing the helpers changes every key.
- Entries live in ``.cache/site/<lesson>/<key>.ipynb`` (``COURSE_SITE_CACHE`` moves the
  folder) with a ``<key>.json`` beside it (when, how long, which run made it). Writing a new
  entry removes the lesson's older ones beyond the newest :data:`KEEP` (another venv, such
  as ``make test-compat``'s, keeps its own).
- A per-lesson lock file (``fcntl.flock``) makes a second process that wants the same lesson
  wait for the first and then read its entry, so two pytest-xdist workers, or a test run and
  ``make site``, never run the same notebook at once.
- The hidden tests are left out of the run (nbgrader's ``ClearHiddenTests``, as the release
  does): the cells run as a learner's notebook runs them, with the visible self-checks, and
  keep their full source in the stored notebook. The page of a lesson shows no output of a
  cell with hidden tests anyway, and that the instructor's answers pass them is checked where
  they are graded: every lesson's solution, handed in as a learner's, scores full marks in
  the graded class of ``tests/test_grading_e2e*.py``. ``COURSE_NOTEBOOK_HIDDEN_TESTS=run`` runs
  them too (``make test-compat`` does: on another torch they are the quick check that every
  graded part still passes there).
- ``reuse`` says which entry may stand in for a run: ``"any"`` (the site build: any run of
  the same content) or ``"this-run"`` (the tests: only an entry made by the same test run,
  ``run_id``; an older entry is run again and replaced, so the suite still proves that every
  notebook runs here now).

Example::

    >>> nb, info = executed("00-getting-started")          # doctest: +SKIP
    >>> info.ran, round(info.seconds) > 0                     # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Iterator

__all__ = ["CACHE_ENV", "HIDDEN_ENV", "TIMEOUT", "Run", "cache_dir", "cache_key", "cached", "executed", "missing"]

#: The environment variable that moves the cache (default: ``.cache/site`` in the course root).
CACHE_ENV = "COURSE_SITE_CACHE"
#: Runs kept per lesson (the newest): enough for a few torch versions or venvs side by side.
KEEP = 3
#: The environment variable that runs the hidden tests too (value ``run``).
HIDDEN_ENV = "COURSE_NOTEBOOK_HIDDEN_TESTS"
#: Seconds one cell may run (tests/test_notebooks.py has always used 180).
TIMEOUT = 180
#: What of autograder/ a lesson's cells import (``from autograder import exercise``) and run on their ranks; the
#: rest (grading, course, release, site, the command line) only builds or grades, so editing it runs nothing again.
_LESSON_CODE = ("__init__.py", "paths.py", "kit", "lessons", "hidden")


def _root() -> Path:
    from ..paths import ROOT

    return ROOT


def cache_dir(root: Path | None = None) -> Path:
    """Where executed notebooks are kept: ``$COURSE_SITE_CACHE`` or ``<root>/.cache/site``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).resolve() if env else (root or _root()) / ".cache" / "site"


def _notebook_path(lesson: str, root: Path) -> Path:
    path = root / "solutions" / lesson / f"{lesson}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"no instructor notebook for lesson {lesson!r}: {path} does not exist "
                                "(lessons are the folders solutions/<name>/ holding <name>.ipynb)")
    return path


def _code_digest(root: Path) -> str:
    """SHA-256 over helpers/**.py and what of autograder/ the notebooks run (:data:`_LESSON_CODE`): path and bytes of each."""
    digest = hashlib.sha256()
    files = sorted(p for p in (root / "helpers").rglob("*.py"))
    files += sorted(p for p in (root / "autograder").rglob("*.py")
                    if p.relative_to(root / "autograder").parts[0] in _LESSON_CODE)
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _lesson_files(notebook: Path) -> list[Path]:
    """The other files git knows in the notebook's folder (files a run writes there do not count)."""
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=notebook.parent, capture_output=True, text=True)
    except FileNotFoundError:  # no git: the notebook alone
        return []
    names = [n for n in done.stdout.split("\0") if n] if done.returncode == 0 else []
    return sorted(p for p in (notebook.parent / n for n in names) if p.is_file() and p != notebook)


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def cache_key(lesson: str, root: Path | None = None) -> str:
    """The key of ``lesson``'s executed notebook: see the module docstring for what goes in."""
    root = root or _root()
    path = _notebook_path(lesson, root)
    nb = json.loads(path.read_text(encoding="utf-8"))
    # A cell's "site" metadata (alt text, hidden output) changes the page, not the run.
    cells = [{**{k: v for k, v in cell.items() if k not in ("outputs", "execution_count", "metadata")},
              "metadata": {k: v for k, v in cell.get("metadata", {}).items() if k != "site"}} for cell in nb["cells"]]
    parts = {
        "notebook": {"cells": cells, "metadata": nb.get("metadata", {})},
        "lesson_files": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in _lesson_files(path)},
        "code": _code_digest(root),
        "python": platform.python_version_tuple()[:2],
        "machine": platform.machine(),
        "torch": _torch_version(),
        "hidden_tests": "run" if _run_hidden() else "not run",
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _run_hidden() -> bool:
    return os.environ.get(HIDDEN_ENV) == "run"


def _clear_hidden_tests(nb) -> dict[int, str]:
    """Take the hidden tests out of ``nb``'s cells, in place, as the release does; return each changed cell's full source."""
    from nbgrader.preprocessors import ClearHiddenTests

    clear, full = ClearHiddenTests(), {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and clear.begin_test_delimeter in cell.source:
            full[index] = cell.source
            clear.preprocess_cell(cell, {}, index)
    return full


@dataclasses.dataclass(frozen=True)
class Run:
    """Where an executed notebook came from: its key, whether this call ran it, how long the run took."""

    lesson: str
    key: str
    ran: bool
    seconds: float
    run_id: str | None
    path: Path


@contextmanager
def _locked(folder: Path, wait: bool = True) -> Iterator[bool]:
    """Hold the lesson's lock (yields True), or, with ``wait=False`` and another process holding it, yield False."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        try:  # released when the file closes, also if this process dies
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


def _entry(lesson: str, key: str, root: Path | None) -> tuple[Path, Path]:
    folder = cache_dir(root) / lesson
    return folder / f"{key}.ipynb", folder / f"{key}.json"


def cached(lesson: str, root: Path | None = None):
    """``lesson``'s executed notebook from the cache (an nbformat node) and its :class:`Run`, or None."""
    import nbformat

    key = cache_key(lesson, root)
    nb_path, info_path = _entry(lesson, key, root)
    if not (nb_path.is_file() and info_path.is_file()):
        return None
    info = json.loads(info_path.read_text())
    return nbformat.read(nb_path, as_version=4), Run(lesson, key, False, info["seconds"], info.get("run_id"), nb_path)


def missing(lessons: list[str], root: Path | None = None) -> list[str]:
    """The lessons among ``lessons`` that the cache holds no run of, for their current content."""
    return [lesson for lesson in lessons if cached(lesson, root) is None]


def executed(lesson: str, root: Path | None = None, *, reuse: str = "any", run_id: str | None = None,
             timeout: int = TIMEOUT, wait: bool = True):
    """``lesson``'s instructor notebook, executed top to bottom: ``(notebook, Run)``.

    From the cache when an entry for the current content may be reused (``reuse="any"``: any;
    ``"this-run"``: only one that ``run_id`` made), else run now with nbclient in the lesson's
    folder, stored, and returned. Raises nbclient's ``CellExecutionError`` when a cell fails
    (nothing is stored then). Holds the lesson's lock throughout, so concurrent callers run it once;
    with ``wait=False``, returns None at once when another process holds it (it is running the lesson).
    """
    import nbformat
    from nbclient import NotebookClient

    if reuse not in ("any", "this-run"):
        raise ValueError(f"reuse={reuse!r}: use 'any' (the site) or 'this-run' (the tests, with run_id)")
    root = root or _root()
    path = _notebook_path(lesson, root)
    with _locked(cache_dir(root) / lesson, wait) as mine:
        if not mine:
            return None
        hit = cached(lesson, root)
        if hit is not None and (reuse == "any" or (run_id is not None and hit[1].run_id == run_id)):
            return hit
        key = cache_key(lesson, root)
        nb = nbformat.read(path, as_version=4)
        full = {} if _run_hidden() else _clear_hidden_tests(nb)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                                resources={"metadata": {"path": str(path.parent)}})
        started = time.monotonic()
        client.execute()
        seconds = time.monotonic() - started
        for index, source in full.items():
            nb.cells[index].source = source
        nb_path, info_path = _entry(lesson, key, root)
        others = sorted((p for p in nb_path.parent.glob("*.ipynb") if p.name != nb_path.name),
                        key=lambda p: p.stat().st_mtime, reverse=True)
        for old in others[KEEP - 1:]:  # the newest few stay: another venv (make test-compat) has its own keys
            old.unlink()
            old.with_suffix(".json").unlink(missing_ok=True)
        tmp = nb_path.with_suffix(f".tmp{os.getpid()}")
        nbformat.write(nb, tmp)
        os.replace(tmp, nb_path)  # a reader never sees half a notebook
        info_path.write_text(json.dumps({"lesson": lesson, "key": key, "seconds": round(seconds, 1), "run_id": run_id,
                                         "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                         "python": sys.version.split()[0], "torch": _torch_version()}, indent=1))
        return nb, Run(lesson, key, True, seconds, run_id, nb_path)
