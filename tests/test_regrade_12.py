"""Lesson 12's planner that the clean re-grade alone decides: every micro-batch held, an all-reduce counted once, the slowest layout.

The learner's notebook is written as `python -m autograder grade` receives it and decided by the
clean re-grade (``autograder.grading.clean``, whose verdicts are the only ones grading counts),
without nbgrader or a kernel (tests/_grading.py, :func:`regrade`); outside the sandbox the hidden
checks import the course's planner from the checkout (autograder/hidden/sealed.py, ``load``). The
mistakes are tests/test_grading_e2e_12.py's, which tries the grade command's own path on lesson 12,
the sealed planner and a learner who tries to borrow it included.
"""

from __future__ import annotations

import pytest

from _grading import regrade, variant
from test_grading_e2e_12 import ALL_REDUCE_ONCE, EVERY_MICROBATCH, LAYOUT, LESSON, MEMORY, SLOWEST, TRAFFIC

pytestmark = pytest.mark.slow  # the test runs a clean re-grade of the whole lesson


def test_every_micro_batch_an_all_reduce_counted_once_and_the_slowest_layout_lose_their_parts(tmp_path):
    """Does holding every micro-batch under 1F1B lose all of 12.1 and an all-reduce counted once all of 12.2, each
    named, and a search that picks the slowest layout that fits lose 12.3's fast part alone, naming the course
    search's best?"""
    graded = regrade(tmp_path, LESSON, "cid", {MEMORY: variant(LESSON, MEMORY, *EVERY_MICROBATCH),
                                               TRAFFIC: variant(LESSON, TRAFFIC, *ALL_REDUCE_ONCE),
                                               LAYOUT: variant(LESSON, LAYOUT, *SLOWEST)})
    lost = ("12.1/small", "12.1/large", "12.1/recompute", "12.2/small", "12.2/large", "12.3/fast")
    assert graded.scores() == {**graded.points, **dict.fromkeys(lost, 0)}
    graded.check_feedback("pp - s micro-batches", "2(p-1)/p", "search finds")
