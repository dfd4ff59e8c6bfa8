"""nbgrader preprocessors used by this course (configured in nbgrader_config.py)."""

from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor

__all__ = ["NameExerciseStubs"]

_DEFAULT = 'raise NotImplementedError("Replace this line with your code")'
_EXERCISE = re.compile(r"#\s*(Exercise\s+[\w.]+\s*:[^\n]*)")


class NameExerciseStubs(NbGraderPreprocessor):
    """Make each stub name its exercise.

    A solution cell whose first comment reads ``# Exercise 4.1: ring all-reduce`` gets
    ``raise NotImplementedError("Exercise 4.1: ring all-reduce")`` instead of nbgrader's
    generic stub, so a learner who runs an unfinished cell knows which one it is.
    """

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and _DEFAULT in cell.source:
            m = _EXERCISE.search(cell.source)
            if m:
                name = m.group(1).strip().replace('"', "'")
                cell.source = cell.source.replace(_DEFAULT, f'raise NotImplementedError("{name}")')
        return cell, resources
