"""Lesson 06's mistakes that the clean re-grade alone decides: a 6.1 that never waits, MiniDDPs late, unwaited or undivided.

Each learner's notebook is written as `python -m autograder grade` receives it and decided by the
clean re-grade (``autograder.grading.clean``, whose verdicts are the only ones grading counts),
without nbgrader or a kernel (tests/_grading.py, :func:`regrade`). The mistakes are
tests/test_grading_e2e_06.py's (``MISTAKES_6_1``, ``MISTAKES_6_2``), which tries the grade
command's own path on lesson 06.
"""

from __future__ import annotations

import pytest

from _grading import regrade
from test_grading_e2e_06 import LESSON, _answers

pytestmark = pytest.mark.slow  # each test runs a clean re-grade of the whole lesson


def test_never_waiting_in_6_1_and_reducing_after_backward_are_named(tmp_path):
    """Does a 6.1 that never waits lose its gradients (the values named as a half-finished exchange, in both parts that
    make a rank late), a MiniDDP that starts every all-reduce after backward lose the overlap part, and one that writes
    a zero gradient into a parameter no rank used lose 'unused', saying why?"""
    graded = regrade(tmp_path, LESSON, "cid", _answers("cid"))
    assert graded.scores() == {**graded.points, "6.1/gradients": 0, "6.1/unused": 0, "6.2/overlap": 0, "6.2/unused": 0}
    graded.check_feedback("The values look like a half-finished exchange", "never called wait()",
                          "so communication overlaps the rest of backward", "should keep .grad None")


def test_never_waiting_loses_the_late_rank_part(tmp_path):
    """Does a MiniDDP that reads its buckets without waiting lose the late-rank part (and score below full)?

    Without a late rank, whether an unwaited all-reduce has finished is a race, so only the
    part that makes one rank late is sure to catch it.
    """
    graded = regrade(tmp_path, LESSON, "dee", _answers("dee"))
    got = graded.scores()
    assert got["6.2/waits"] == 0 and got["6.2/broadcast"] == graded.points["6.2/broadcast"]
    assert sum(got.values()) < graded.full_marks
    graded.check_feedback("never called wait()")


def test_forgetting_to_divide_is_named_and_the_buckets_are_judged_on_their_sizes(tmp_path):
    """Does a MiniDDP that never divides lose every part that compares gradients, with feedback naming the division,
    and keep 'buckets', which judges what its heading says (the number and sizes of the all-reduces)?"""
    graded = regrade(tmp_path, LESSON, "eli", _answers("eli"))
    assert graded.scores() == {**graded.points, "6.2/gradients": 0, "6.2/waits": 0, "6.2/unused": 0}
    graded.check_feedback("divide the summed gradients by the world size")
