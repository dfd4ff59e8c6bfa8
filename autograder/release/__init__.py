"""Build the learner distribution: the course as learners get it, without answers or hidden tests.

``make release`` (or ``python -m autograder release [--allow-colab-placeholder] [DIR]``) writes
a folder, by default ``dist/learner-course/``, and ``DIR.tar.gz`` next to it. An instructor publishes the folder
as a git repository of its own; learners clone that and run ``make lab``, and the Colab
set-up cell clones it (``REPOSITORY`` in :mod:`autograder.course.colab`). It holds:

- ``course/``: the learner notebooks, as committed (the build stops if one has outputs);
- ``helpers/``: the whole runtime package. That includes ``helpers/ring.py``, whose
  pipelined ring all-reduce lesson 08 prints and runs; with ``piece_bytes=None, ahead=0``
  it is a working plain ring, so it shows a learner one answer to Exercise 4.4. It ships anyway:
  lesson 08 cannot be taught without it, and it comes after lesson 04;
- ``autograder/``: ``__init__.py`` and, of ``autograder/lessons/``, ``__init__.py``, ``kit.py``,
  ``harness.py``, the shared checks listed in ``rules.KEPT_MODULES`` and every ``lessonNN.py``
  rewritten by :func:`prune_lesson`: each ``Part``'s check becomes
  :func:`autograder.lessons.kit.HIDDEN_CHECK`, and what only the hidden tests used is left out,
  so ``exercise("4.4").self_check(fn)`` works as in the instructor's copy while
  ``exercise("4.4").grade(fn, part)`` says the hidden test is not there. Of ``autograder/grading/``
  it ships the learner's two commands, ``selfcheck.py`` (``make check``) and ``handin.py``
  (``make handin``), and ``clean.py``, whose reading of a notebook's definitions ``make check``
  shares with grading. No other module of the package ships (``reference.py``, the grading and
  build tools);
- ``README.md`` (:mod:`autograder.release.readme`: ``git clone`` or the ``.tar.gz``, then ``make
  lab``; ``make check``; handing in), ``pyproject.toml``, ``environment.yml``, ``Makefile``
  (``venv``, ``lab``, ``clean-venv`` copied from the main one; ``check`` and ``handin``),
  ``nbgrader_config.py`` (only the per-cell limits of the main one, so Validate allows what
  grading allows) and ``.gitignore`` for learners, and ``MANIFEST.txt``, which lists every file.

A rebuild replaces an earlier release in the same folder but keeps its ``.git``, so the
folder can be the published repository's checkout.

The build fails, naming the file and the next step, when a kept module imports one that
is left out, when a lesson module declares no exercise, when a learner notebook has
outputs or solution markup, when the notebooks' Colab cells do not point at ``REPOSITORY``
(:mod:`autograder.course.colab`), and while ``REPOSITORY`` is still the placeholder: the
badges would open a repository that holds no course. ``--allow-colab-placeholder``
(``allow_colab_placeholder=True``) builds a draft anyway, to try out before publishing; its
README then says at the top that the Colab badges do not work.

Example::

    >>> import pathlib, shutil, tempfile
    >>> out = build(pathlib.Path(tempfile.mkdtemp()) / "learner-course", allow_colab_placeholder=True)
    >>> (out / "autograder" / "lessons" / "reference.py").exists(), (out / "autograder" / "lessons" / "lesson04.py").exists()
    (False, True)
    >>> shutil.rmtree(out.parent)
"""

from __future__ import annotations

from .build import build, main
from .prune import prune_lesson
from .rules import DEFAULT_DIR, ReleaseError

__all__ = ["DEFAULT_DIR", "ReleaseError", "build", "prune_lesson", "main"]
