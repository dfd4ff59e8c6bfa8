"""Where the course is: :data:`ROOT`, the one definition every tool of the course reads.

The course root holds ``nbgrader_config.py``, ``solutions/`` and ``course/`` (in a learner's copy,
``course/`` alone). It is the folder this package lies in (the repository, or the learner release)
unless ``COURSE_ROOT`` names another copy: the grading tests grade a throw-away copy that way, and
the course's JupyterHub points the instructor's tools at the course folder it serves. Folders that
nbgrader's configuration names (the release folder among them) are read from that configuration,
not from here. This module imports nothing of the course, so every part of it may use it, and it
ships to learners (``make check`` and ``make handin`` find their notebooks from it).

Example::

    >>> (ROOT / "course").is_dir()
    True
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ROOT"]

ROOT = Path(os.environ.get("COURSE_ROOT") or Path(__file__).resolve().parents[1]).resolve()
