"""Lesson 02's ring sum worked out alone, decided by the clean re-grade alone.

The learner's notebook is written as `python -m autograder grade` receives it and decided by the
clean re-grade (``autograder.grading.clean``, whose verdicts are the only ones grading counts),
without nbgrader or a kernel (tests/_grading.py, :func:`regrade`). tests/test_grading_e2e.py
tries the grade command's own path on lesson 02 (the instructor's ring sum, and one that tries
to leave its folder).
"""

from __future__ import annotations

import pytest

from _grading import regrade

pytestmark = pytest.mark.slow  # the test runs a clean re-grade of the whole lesson

LESSON = "02-point-to-point"
ANSWER = "ex2_1-ring-sum"

# Exercise 2.1: every message goes round the ring, but each rank works the total out from its
# own value alone; it cannot know the others' values.
LOCAL_RING_SUM = '''def ring_sum(rank, world_size, value):
    if world_size > 1:
        request = dist.isend(torch.zeros(1), (rank + 1) % world_size)
        dist.recv(torch.zeros(1), (rank - 1) % world_size)
        request.wait()
    return value * world_size
'''


def test_ring_sum_worked_out_alone_earns_nothing(tmp_path):
    """Does a ring_sum that sends dummy messages round the ring but works the total out alone score 0 on every part, with feedback saying why?"""
    graded = regrade(tmp_path, LESSON, "carol", {ANSWER: LOCAL_RING_SUM})
    scores = graded.scores()
    assert set(scores) == {"correct", "point_to_point", "no_hang"} and set(scores.values()) == {0}, scores
    graded.check_feedback("every rank should return their sum", "Each rank knows only its own value")
