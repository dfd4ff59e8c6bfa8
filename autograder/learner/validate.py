"""Validate runs the self-checks: a self-check that fails makes nbgrader's Validate fail, with its message.

nbgrader's Validate (the notebook toolbar's button, or ``nbgrader validate NOTEBOOK``) runs the
whole notebook in a fresh kernel, then reports the graded test cells that failed. In a learner's
copy those cells hold no check (the hidden tests were taken out), so Validate would say
"Success!" for a ring all-reduce that deadlocks. The self-check cells (``exercise("4.4")
.self_check(ring_allreduce)``, grade id ``self-check-...``) do check, and they run under
Validate with grading's limits: nbgrader sets ``NBGRADER_EXECUTION``, so ranks get 10 s, as in
grading, and every cell ``Execute.timeout`` seconds.

:func:`self_checks_count` is the hook that makes them count. nbgrader's configuration hands it to
the Execute preprocessor (nbclient's ``on_cell_error``, called for every cell that ends in an
error, a timeout included); a self-check cell that did is then marked as a graded cell worth 0
points (its checksum renewed when the cell is the one released, so a changed cell is still
reported as changed), and Validate lists it as failed, showing the cell and the self-check's own
message. It does nothing outside Validate. (``on_notebook_complete`` would be the obvious hook,
but nbconvert's synchronous run, the one nbgrader uses, never calls it.)
The learner's ``nbgrader_config.py`` (written by ``python -m autograder release``, and by
``make hub`` for learners on the hub) sets it::

    from autograder.learner.validate import self_checks_count
    c.Execute.on_cell_error = self_checks_count
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["self_checks_count", "SELF_CHECK_ID"]

#: How the grade id of a self-check cell starts (autograder/notebooks/cells.py names them).
SELF_CHECK_ID = "self-check-"


def self_checks_count(cell: Any = None, **_: Any) -> None:
    """Under nbgrader's Validate: a self-check ``cell`` that ended in an error becomes a 0-point graded cell."""
    if cell is None or os.environ.get("NBGRADER_EXECUTION") != "validate":
        return
    from nbgrader import utils

    meta = cell.get("metadata", {}).get("nbgrader", {})
    if cell.get("cell_type") != "code" or meta.get("grade") or not str(meta.get("grade_id", "")).startswith(
            SELF_CHECK_ID):
        return
    released = "checksum" in meta and meta["checksum"] == utils.compute_checksum(cell)
    meta["grade"], meta["points"] = True, 0
    if released:
        meta["checksum"] = utils.compute_checksum(cell)
