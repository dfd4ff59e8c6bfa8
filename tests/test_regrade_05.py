"""Lesson 05's answers that the clean re-grade alone decides: two right ones of other shapes, and three mistakes.

Each learner's notebook is written as `python -m autograder grade` receives it and decided by the
clean re-grade (``autograder.grading.clean``, whose verdicts are the only ones grading counts),
without nbgrader or a kernel (tests/_grading.py, :func:`regrade`): the points per part, and the
verdicts the graded cells would show. The grade command's own path (nbgrader, the sandbox, the
feedback page) is tried on lesson 05 by tests/test_grading_e2e_05.py.
"""

from __future__ import annotations

import pytest

from _grading import regrade
from devtools.scratch import solution_source
from test_grading_e2e_05 import ANSWERS, AVERAGE, LESSON, TRAIN

pytestmark = pytest.mark.slow  # each test runs a clean re-grade of the whole lesson

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


def _regrade(tmp_path, student: str, average: str):
    return regrade(tmp_path, LESSON, student, {AVERAGE: average, TRAIN: solution_source(LESSON, TRAIN)})


@pytest.mark.parametrize("student, average", [("ben", FLAT_BUFFER), ("cid", ASYNC_TOGETHER)])
def test_correct_answers_of_other_shapes_earn_full_marks(tmp_path, student, average):
    """Do a flat-buffer average and asynchronous calls waited together earn every point?"""
    graded = _regrade(tmp_path, student, average)
    assert graded.scores() == graded.points


def test_averaging_the_weights_is_named(tmp_path):
    """Does averaging the weights instead of the gradients lose every 5.1 part, with feedback naming the mistake?"""
    graded = _regrade(tmp_path, "eli", AVERAGES_WEIGHTS)
    got = graded.scores()
    assert {k: v for k, v in got.items() if k.startswith("5.1")} == {
        "5.1/correct": 0, "5.1/unused_frozen_tied": 0, "5.1/parameters_unchanged": 0, "5.1/training": 0}
    graded.check_feedback("weights were averaged instead of the gradients",
                          "your code averaged the weights instead of the gradients")


def test_reduce_instead_of_all_reduce_is_named(tmp_path):
    """Does `reduce` (the sum reaches rank 0 only) lose the gradient parts, "parameters_unchanged" too (the ranks end
    with different gradients), with feedback naming all_reduce?"""
    graded = _regrade(tmp_path, "fay", REDUCE_NOT_ALL_REDUCE)
    got = graded.scores()
    assert got["5.1/correct"] == 0 and got["5.1/training"] == 0 and got["5.2/same_steps"] == 0
    assert got["5.1/parameters_unchanged"] == 0
    graded.check_feedback("Use dist.all_reduce", "every rank must end with the same gradients")


def test_forgetting_to_divide_is_named(tmp_path):
    """Does an average that forgets the division (tests/test_grading_e2e_05.py's dee) lose the gradient and training
    parts, with feedback that says so?"""
    graded = regrade(tmp_path, LESSON, "dee", ANSWERS["dee"])
    assert graded.scores() == {**graded.points, "5.1/correct": 0, "5.1/unused_frozen_tied": 0, "5.1/training": 0,
                               "5.2/same_steps": 0}
    graded.check_feedback("Did you divide by the world size?")
