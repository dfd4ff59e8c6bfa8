"""Lesson 10's hand-ins that the clean re-grade alone decides: tensor-parallel MLPs and pipeline schedules.

Each learner's notebook is written as `python -m autograder grade` receives it and decided by the
clean re-grade (``autograder.grading.clean``, whose verdicts are the only ones grading counts),
without nbgrader or a kernel (tests/_grading.py, :func:`regrade`). The learners are
tests/test_grading_e2e_10.py's (``LEARNERS``, whose docstring lists each one's mistakes), which
tries the grade command's own path on lesson 10.
"""

from __future__ import annotations

import pytest

from _grading import regrade
from test_grading_e2e_10 import LEARNERS, LESSON

pytestmark = pytest.mark.slow  # each test runs a clean re-grade of the whole lesson


def _lose(tmp_path, student: str, *parts: str):
    graded = regrade(tmp_path, LESSON, student, LEARNERS[student])
    assert graded.scores() == {**graded.points, **dict.fromkeys(parts, 0)}
    return graded


def test_frozen_weights_made_trainable_and_a_missing_one_over_m_are_named(tmp_path):
    """Do shards that drop their frozen weights' requires_grad lose 10.1's backward alone, naming the parameter and
    the fix, a GPipe without 1/m the gradients alone, while 1F1B written backward-first earns all of 10.3?"""
    graded = _lose(tmp_path, "cid", "10.1/backward", "10.2/gradients")
    graded.check_feedback("was given frozen (requires_grad=False)", "requires_grad=fc1.weight.requires_grad",
                          "backward on the last stage with 1/")


def test_whole_copies_computed_alone_and_a_pipeline_that_never_fills_are_named(tmp_path):
    """Does a module that computes on each rank alone from whole copies lose every part of 10.1 (forward and backward
    because rank 0 never depends on the other ranks), a one-micro-batch-at-a-time schedule 10.2's bubble, and an
    untouched 1F1B all of 10.3?"""
    graded = _lose(tmp_path, "dee", "10.1/forward", "10.1/backward", "10.1/communication", "10.1/shards",
                   "10.2/bubble", "10.3/gradients", "10.3/memory", "10.3/bubble")
    graded.check_feedback("rank 0 computed it alone", "backward sums the parts over the ranks",
                          "Send every micro-batch forward before waiting for any gradient",
                          "still raises NotImplementedError")


def test_a_strided_split_earns_full_marks_and_gpipes_order_in_1f1b_earns_nothing(tmp_path):
    """Do a strided split of the hidden units and a GPipe that divides only the gradients there are earn all of
    10.1 and 10.2, while a 1F1B that runs every forward first loses every part of 10.3, naming GPipe's order, and two
    chunks taken one micro-batch at a time 10.4's bubble, with its formula?"""
    graded = _lose(tmp_path, "eli", "10.3/gradients", "10.3/memory", "10.3/bubble", "10.4/bubble")
    graded.check_feedback("order (Exercise 10.2)", "a bubble of (p - 1) / (v m + p - 1)")


def test_no_backward_all_reduce_dividing_every_gradient_and_no_warm_up_are_named(tmp_path):
    """Does an f without its backward all-reduce lose backward and communication, naming f; a GPipe that divides
    every .grad (the frozen bias and the unused parameter have none) lose gradients alone, with the fix; and a 1F1B
    with no warm-up lose every part of 10.3, saying the pipeline never fills?"""
    graded = _lose(tmp_path, "ben", "10.1/backward", "10.1/communication", "10.2/gradients", "10.3/gradients",
                   "10.3/memory", "10.3/bubble")
    graded.check_feedback("That is f: the identity in forward, an all-reduce of the gradient in backward",
                          "backward made no call at all", "a parameter, spare, that its forward never uses",
                          "if p.grad is not None", "the pipeline never fills")
