"""nbgrader preprocessors used by this course (configured in nbgrader_config.py), and the stub text.

:data:`STUB` is the line nbgrader puts in place of a solution (``nbgrader_config.py``
imports :data:`CODE_STUB` from here); :class:`NameExerciseStubs` then rewrites it to name
the exercise.

Example::

    >>> CODE_STUB.splitlines()[-1] == STUB
    True
"""

from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor

__all__ = ["STUB", "CODE_STUB", "SANITIZE", "AddColabCells", "NameExerciseStubs", "RestoreMissingCells"]

# The one place the stub text is written: nbgrader's ClearSolutions inserts CODE_STUB,
# NameExerciseStubs looks for STUB in it.
STUB = 'raise NotImplementedError("Replace this line with your code")'
CODE_STUB = "# YOUR CODE HERE\n" + STUB
_EXERCISE = re.compile(r"#\s*(Exercise\s+[\w.]+\s*:[^\n]*)")
#: What autograde does to a notebook before it runs (``Autograde.sanitize_preprocessors`` in
#: nbgrader_config.py): a learner who deletes a graded or read-only cell gets it back, where
#: it was, and graded; OverwriteCells then restores edited read-only cells.
SANITIZE = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "autograder.notebooks.preprocessors.RestoreMissingCells",
    "nbgrader.preprocessors.OverwriteCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]


class NameExerciseStubs(NbGraderPreprocessor):
    """Make each stub name its exercise.

    A solution cell whose first comment reads ``# Exercise 4.4: ring all-reduce`` gets
    ``raise NotImplementedError("Exercise 4.4: ring all-reduce")`` instead of nbgrader's
    generic stub, so a learner who runs an unfinished cell knows which one it is.
    """

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and STUB in cell.source:
            m = _EXERCISE.search(cell.source)
            if m:
                name = m.group(1).strip().replace('"', "'")
                cell.source = cell.source.replace(STUB, f'raise NotImplementedError("{name}")')
        return cell, resources


class AddColabCells(NbGraderPreprocessor):
    """Start each learner notebook with the "Open in Colab" badge and the Colab set-up cell.

    The cells come from :func:`autograder.notebooks.colab.colab_cells` for the lesson being built;
    cells with their ids already in the notebook are replaced, so building twice, or from
    a notebook that carries them, gives them once.
    """

    def preprocess(self, nb, resources):
        import nbformat

        from .colab import BADGE_ID, SETUP_ID, colab_cells

        lesson = resources["nbgrader"]["assignment"]
        nb.cells = [c for c in nb.cells if c.get("id") not in (BADGE_ID, SETUP_ID)]
        nb.cells[:0] = [nbformat.from_dict(cell) for cell in colab_cells(lesson)]
        return nb, resources


class RestoreMissingCells(NbGraderPreprocessor):
    """Put back graded and read-only cells a learner deleted, where they were.

    The reference is the released notebook, where nbgrader's own configuration puts the
    release (``CourseDirectory.release_directory`` under ``CourseDirectory.root``:
    course/<lesson>/<lesson>.ipynb in this course). Every nbgrader cell of the release that is missing from the submission
    is inserted after the closest earlier cell that is still there; nbgrader's
    OverwriteCells, which runs next, then restores the content of every read-only cell.
    (nbgrader's own ``add_missing_cells`` fails when the cell before a deleted test cell
    is a read-only cell rather than an answer or test cell.)
    """

    def preprocess(self, nb, resources):
        import json
        from pathlib import Path

        import nbformat
        from nbgrader.coursedir import CourseDirectory

        assignment = resources["nbgrader"]["assignment"]
        notebook = resources["nbgrader"]["notebook"]
        coursedir = CourseDirectory(config=self.config)
        release = Path(coursedir.format_path(coursedir.release_directory, ".", assignment)) / f"{notebook}.ipynb"
        if not release.is_file():
            self.log.warning("No released notebook at %s: deleted cells cannot be restored", release)
            return nb, resources
        released = nbformat.reads(json.dumps(json.loads(release.read_text())), as_version=4)

        def gid(cell):
            return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")

        present = {gid(c) for c in nb.cells if gid(c)}
        anchor = -1  # index in the submission after which a restored cell goes
        restored = []
        for cell in released.cells:
            name = gid(cell)
            if name is None:
                continue
            if name in present:
                anchor = next(i for i, c in enumerate(nb.cells) if gid(c) == name)
                continue
            meta = cell.metadata.nbgrader
            if meta.get("grade") or meta.get("locked") or meta.get("solution"):
                nb.cells.insert(anchor + 1, cell)
                anchor += 1
                restored.append(name)
        if restored:
            self.log.warning("Restored deleted cells: %s", ", ".join(restored))
        return nb, resources
