"""Build the learner distribution: the course as learners get it, without answers or hidden tests.

``make release`` (or ``python -m autograder release [--allow-colab-placeholder] [DIR]``) writes
a folder, by default ``dist/learner-course/``, and ``DIR.tar.gz`` next to it. An instructor publishes the folder
as a git repository of its own; learners clone that and run ``make lab``, and the Colab
set-up cell clones it (``REPOSITORY`` in :mod:`autograder.notebooks.colab`). It holds:

- ``course/``: the learner notebooks, as committed (the build stops if one has outputs);
- ``helpers/``: the whole runtime package. That includes ``helpers/ring.py``, whose
  pipelined ring all-reduce lesson 08 prints and runs; with ``piece_bytes=None, ahead=0``
  it is a working plain ring, so it shows a learner one answer to Exercise 4.4. It ships anyway:
  lesson 08 cannot be taught without it, and it comes after lesson 04;
- ``autograder/``: the packages learners need, copied whole (``rules.SHIPPED``): ``__init__.py``
  (``from autograder import exercise``), ``paths.py``, ``kit/`` (the exercise kit), ``lessons/``
  (every lesson's declarations, self-checks and the checkers they run) and ``learner/`` (``make
  check`` and ``make handin``). What stays with the instructor is in packages of its own
  (``rules.INSTRUCTOR_ONLY``): ``answers/``, ``hidden/`` (every graded part's check), ``grading/``,
  ``notebooks/``, ``release/``, ``site/``. So ``exercise("4.4").self_check(fn)`` works as in the
  instructor's copy, while no answer and no hidden check is there to be found: not removed from
  a file, never in one that ships;
- ``README.md`` (:mod:`autograder.release.readme`: ``git clone`` or the ``.tar.gz``, then ``make
  lab``; ``make check``; handing in), ``pyproject.toml``, ``environment.yml``, ``Makefile``
  (``venv``, ``lab``, ``clean-venv`` copied from the main one; ``check`` and ``handin``),
  ``nbgrader_config.py`` (only the per-cell limits of the main one, so Validate allows what
  grading allows) and ``.gitignore`` for learners, and ``MANIFEST.txt``, which lists every file.

A rebuild replaces an earlier release in the same folder but keeps its ``.git``, so the
folder can be the published repository's checkout.

The build fails, naming the file and the next step, when a shipped module imports one that
does not ship, when a learner notebook has
outputs or solution markup, when the notebooks' Colab cells do not point at ``REPOSITORY``
(:mod:`autograder.notebooks.colab`), and while ``REPOSITORY`` is still the placeholder: the
badges would open a repository that holds no course. ``--allow-colab-placeholder``
(``allow_colab_placeholder=True``) builds a draft anyway, to try out before publishing; its
README then says at the top that the Colab badges do not work.

Example::

    >>> import pathlib, shutil, tempfile
    >>> out = build(pathlib.Path(tempfile.mkdtemp()) / "learner-course", allow_colab_placeholder=True)
    >>> (out / "autograder" / "answers").exists(), (out / "autograder" / "lessons" / "lesson04.py").exists()
    (False, True)
    >>> shutil.rmtree(out.parent)
"""

from __future__ import annotations

from .package import build, main
from .rules import DEFAULT_DIR, ReleaseError

__all__ = ["DEFAULT_DIR", "ReleaseError", "build", "main"]
