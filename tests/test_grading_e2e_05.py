"""Lesson 05 graded end to end with the real nbgrader: realistic wrong answers lose the right parts.

A temporary copy of the course receives two learners' versions of lesson 05 and is graded
with `python -m autograder grade`, the instructor's command: the instructor's answers, and an
average that crashes on a None gradient (its visible self-check fails in the kernel, which
must cost nothing; its feedback page names the frozen parameter). The lesson's other answers,
two right ones of other shapes and three mistakes (``dee``'s forgotten division among them), are
decided by the clean re-grade alone in tests/test_regrade_05.py.
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

ANSWERS = {who: {AVERAGE: average or solution_source(LESSON, AVERAGE), TRAIN: solution_source(LESSON, TRAIN)}
           for who, average in LEARNERS.items()}
# What goes through the grade command (tests/conftest.py grades them with the session's other learners);
# dee: tests/test_regrade_05.py.
HANDED_IN = {LESSON: {who: ANSWERS[who] for who in ("amy", "gus")}}


def test_the_instructors_answers_earn_full_marks(graded_lesson):
    """Do the instructor's answers, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_crash_on_a_none_gradient_costs_only_the_parts_with_frozen_parameters(graded_lesson):
    """Does an average that crashes on a None gradient keep the plain parts and lose those with a frozen parameter,
    its feedback page showing exactly those parts' verdicts?

    (The visible self-check, which also tries a frozen parameter, sits in a cell of its own
    and is not graded, so it costs nothing here.)"""
    got = graded_lesson.scores("gus")
    assert got == {**graded_lesson.points, "5.1/unused_frozen_tied": 0, "5.1/parameters_unchanged": 0}
    graded_lesson.check_feedback("gus", "grad is None when it is frozen")
    graded_lesson.check_verdicts("gus", {"5.1/unused_frozen_tied", "5.1/parameters_unchanged"})


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 05, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
