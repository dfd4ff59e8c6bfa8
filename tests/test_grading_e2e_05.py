"""Lesson 05 graded end to end with the real nbgrader: realistic wrong answers lose the right parts.

A temporary copy of the course receives six learners' versions of lesson 05 and is graded
with `python -m autograder grade`, the instructor's command: the instructor's answers, two
other correct ways to average (one flat buffer; asynchronous calls waited together), and
the four mistakes the lesson warns about (no division by the world size, weights averaged
instead of gradients, `reduce` instead of `all_reduce`, a crash on a None gradient).
"""

from __future__ import annotations

import pytest

from devtools.scratch import solution_source

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "05-data-parallel-sgd"
AVERAGE, TRAIN = "ex5_1-average-gradients", "ex5_2-train"

FLAT_BUFFER = '''def average_gradients(model):
    # One flat buffer: one presence all-reduce, then one all-reduce for every gradient.
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    present = torch.tensor([float(p.grad is not None) for p in params])
    dist.all_reduce(present)
    used = [p for p, n in zip(params, present.tolist()) if n > 0]
    for p in used:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1).double() for p in used])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for p, part in zip(used, flat.split([p.numel() for p in used])):
        p.grad.copy_(part.view_as(p.grad))
'''

ASYNC_TOGETHER = '''def average_gradients(model):
    params = [p for p in model.parameters() if p.requires_grad]
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.int64)
    dist.all_reduce(present)
    works = []
    for p, n in zip(params, present.tolist()):
        if n:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            works.append((p, dist.all_reduce(p.grad, async_op=True)))
    for p, work in works:
        work.wait()
        p.grad /= dist.get_world_size()
'''

NO_DIVISION = '''def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)      # the sum, never divided
'''

AVERAGES_WEIGHTS = '''def average_gradients(model):
    with torch.no_grad():
        for p in model.parameters():
            dist.all_reduce(p)           # the weights, not the gradients
            p /= dist.get_world_size()
'''

REDUCE_NOT_ALL_REDUCE = '''def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.reduce(p.grad, dst=0)   # only rank 0 gets the sum
            p.grad /= dist.get_world_size()
'''

CRASHES_ON_NONE = '''def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)          # p.grad is None for a frozen parameter
        p.grad /= dist.get_world_size()
'''

LEARNERS = {
    "amy": None,  # the instructor's answers
    "ben": FLAT_BUFFER,
    "cid": ASYNC_TOGETHER,
    "dee": NO_DIVISION,
    "eli": AVERAGES_WEIGHTS,
    "fay": REDUCE_NOT_ALL_REDUCE,
    "gus": CRASHES_ON_NONE,
}

# What each learner hands in (tests/conftest.py grades them with the session's other learners).
HANDED_IN = {LESSON: {who: {AVERAGE: average or solution_source(LESSON, AVERAGE), TRAIN: solution_source(LESSON, TRAIN)}
                      for who, average in LEARNERS.items()}}


@pytest.mark.parametrize("student", ["amy", "ben", "cid"])
def test_correct_answers_earn_full_marks(graded_lesson, student):
    """Do the instructor's answer, a flat-buffer average and asynchronous calls waited together all earn every point?"""
    assert graded_lesson.scores(student) == graded_lesson.points


def test_forgetting_to_divide_is_named(graded_lesson):
    """Does an average that forgets the division lose the gradient and training parts, with feedback that says so?"""
    got = graded_lesson.scores("dee")
    assert got == {**graded_lesson.points, "5.1/correct": 0, "5.1/unused_frozen_tied": 0, "5.1/training": 0, "5.2/same_steps": 0}
    graded_lesson.check_feedback("dee", "Did you divide by the world size?")
    graded_lesson.check_verdicts("dee", {"5.1/correct", "5.1/unused_frozen_tied", "5.1/training", "5.2/same_steps"})


def test_averaging_the_weights_is_named(graded_lesson):
    """Does averaging the weights instead of the gradients lose every 5.1 part, with feedback naming the mistake?"""
    got = graded_lesson.scores("eli")
    assert {k: v for k, v in got.items() if k.startswith("5.1")} == {
        "5.1/correct": 0, "5.1/unused_frozen_tied": 0, "5.1/parameters_unchanged": 0, "5.1/training": 0}
    graded_lesson.check_feedback("eli", "weights were averaged instead of the gradients",
                                 "your code averaged the weights instead of the gradients")


def test_reduce_instead_of_all_reduce_is_named(graded_lesson):
    """Does `reduce` (the sum reaches rank 0 only) lose the gradient parts, with feedback naming all_reduce?"""
    got = graded_lesson.scores("fay")
    assert got["5.1/correct"] == 0 and got["5.1/training"] == 0 and got["5.2/same_steps"] == 0
    assert got["5.1/parameters_unchanged"] == graded_lesson.points["5.1/parameters_unchanged"]
    graded_lesson.check_feedback("fay", "Use dist.all_reduce")


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
