"""Lesson 08's hand-ins that the clean re-grade alone decides: the untouched notebook, and repairs that dodge the work.

Each learner's notebook is written as `python -m autograder grade` receives it and decided by the
clean re-grade (``autograder.grading.clean``, whose verdicts are the only ones grading counts),
without nbgrader or a kernel (tests/_grading.py, :func:`regrade`). The learners are
tests/test_grading_e2e_08.py's (``LEARNERS``), which tries the grade command's own path on lesson 08.
"""

from __future__ import annotations

import pytest

from _grading import regrade
from test_grading_e2e_08 import ANSWER, LEARNERS, LESSON

pytestmark = pytest.mark.slow  # each test runs a clean re-grade of the whole lesson


def test_the_untouched_notebook_earns_nothing(tmp_path):
    """Does the notebook handed in untouched score 0, each part telling the learner to replace the stub?"""
    graded = regrade(tmp_path, LESSON, "sam", None)
    assert graded.scores() == dict.fromkeys(graded.points, 0)
    graded.check_feedback("still raises NotImplementedError", "Exercise 8.1: repair three broken programs")


def test_repairs_that_dodge_the_work_earn_nothing(tmp_path):
    """Do a collective in pass_right, a hard-coded mean and a gather crashing on the empty rank each lose their part, named?"""
    graded = regrade(tmp_path, LESSON, "cid", {ANSWER: LEARNERS["cid"]})
    assert graded.scores() == dict.fromkeys(graded.points, 0)
    graded.check_feedback("called a built-in collective", "pass_right is repaired by ordering its point-to-point calls",
                          "rank 0 returned 0.8; the mean of all", "raised IndexError",
                          'part "crash" (gather_all): 0 of 2 points.')
