"""Lesson 05 graded end to end with the real nbgrader: realistic wrong answers lose the right parts.

A temporary copy of the course receives three learners' versions of lesson 05 and is graded
with `python -m autograder grade`, the instructor's command: the instructor's answers, an
average that forgets to divide by the world size (its feedback page and graded cells read),
and one that crashes on a None gradient (its visible self-check fails in the kernel, which
must cost nothing). The lesson's other answers, two right ones of other shapes and two
mistakes, are decided by the clean re-grade alone in tests/test_regrade_05.py.
"""

from __future__ import annotations

import pytest

from devtools.scratch import solution_source

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "05-data-parallel-sgd"
AVERAGE, TRAIN = "ex5_1-average-gradients", "ex5_2-train"

NO_DIVISION = '''def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)      # the sum, never divided
'''

CRASHES_ON_NONE = '''def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)          # p.grad is None for a frozen parameter
        p.grad /= dist.get_world_size()
'''

LEARNERS = {
    "amy": None,  # the instructor's answers
    "dee": NO_DIVISION,
    "gus": CRASHES_ON_NONE,
}

# What each learner hands in (tests/conftest.py grades them with the session's other learners).
HANDED_IN = {LESSON: {who: {AVERAGE: average or solution_source(LESSON, AVERAGE), TRAIN: solution_source(LESSON, TRAIN)}
                      for who, average in LEARNERS.items()}}


def test_the_instructors_answers_earn_full_marks(graded_lesson):
    """Do the instructor's answers, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_forgetting_to_divide_is_named(graded_lesson):
    """Does an average that forgets the division lose the gradient and training parts, with feedback that says so?"""
    got = graded_lesson.scores("dee")
    assert got == {**graded_lesson.points, "5.1/correct": 0, "5.1/unused_frozen_tied": 0, "5.1/training": 0, "5.2/same_steps": 0}
    graded_lesson.check_feedback("dee", "Did you divide by the world size?")
    graded_lesson.check_verdicts("dee", {"5.1/correct", "5.1/unused_frozen_tied", "5.1/training", "5.2/same_steps"})


def test_crash_on_a_none_gradient_costs_only_the_parts_with_frozen_parameters(graded_lesson):
    """Does an average that crashes on a None gradient keep the plain parts and lose those with a frozen parameter?

    (The visible self-check, which also tries a frozen parameter, sits in a cell of its own
    and is not graded, so it costs nothing here.)"""
    got = graded_lesson.scores("gus")
    assert got == {**graded_lesson.points, "5.1/unused_frozen_tied": 0, "5.1/parameters_unchanged": 0}
    graded_lesson.check_feedback("gus", "grad is None when it is frozen")


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 05, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
