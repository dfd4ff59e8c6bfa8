"""Lesson 11's hand-ins that the clean re-grade alone decides: ring, zig-zag and Ulysses attention, right and wrong.

Each learner's notebook is written as `python -m autograder grade` receives it and decided by the
clean re-grade (``autograder.grading.clean``, whose verdicts are the only ones grading counts),
without nbgrader or a kernel (tests/_grading.py, :func:`regrade`). The learners are
tests/test_grading_e2e_11.py's (``LEARNERS``, whose docstring lists each one's answers), which
tries the grade command's own path on lesson 11.
"""

from __future__ import annotations

import pytest

from _grading import regrade
from test_grading_e2e_11 import LEARNERS, LESSON

pytestmark = pytest.mark.slow  # each test runs a clean re-grade of the whole lesson


def _lose(tmp_path, student: str, *parts: str):
    graded = regrade(tmp_path, LESSON, student, LEARNERS[student])
    assert graded.scores() == {**graded.points, **dict.fromkeys(parts, 0)}
    return graded


def test_an_answer_that_sends_nothing_and_exchanges_that_are_no_ring_earn_nothing_for_them(tmp_path):
    """Does a ring attention that returns q lose every part of 11.1, no_hang included (it cannot hang: it sends
    nothing); a zig-zag that sends straight to every rank lose balanced alone; and a Ulysses made of an all-gather
    lose exchange alone, naming it?"""
    graded = _lose(tmp_path, "cid", "11.1/correct", "11.1/ring", "11.1/memory", "11.1/no_hang", "11.2/balanced",
                   "11.3/exchange")
    graded.check_feedback("an answer that exchanges nothing cannot hang",
                          "in a ring each rank sends only to its right neighbour", "an all-gather made of all_to_all")


def test_blocks_kept_until_the_ring_ends_lose_memory_and_the_contiguous_mask_is_named(tmp_path):
    """Does an answer with right values and ring traffic that keeps every received block lose 11.1's memory part
    alone, saying its memory grew with the ranks; its causal ring on the zig-zag layout all of 11.2, naming the
    contiguous mask; and a Ulysses that puts the pieces back along the wrong dimension its correct part?"""
    graded = _lose(tmp_path, "dee", "11.1/memory", "11.2/correct", "11.2/balanced", "11.3/correct")
    graded.check_feedback("a list of the received blocks", "contiguous layout")


def test_right_answers_of_other_shapes_earn_full_marks(tmp_path):
    """Do a log-sum-exp merge with float64 scores and K and V sent apart, a zig-zag computing its diagonal block as
    three products, and a Ulysses with q, k and v packed into one all_to_all earn every point?"""
    _lose(tmp_path, "eli")
