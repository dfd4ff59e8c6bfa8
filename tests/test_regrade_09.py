"""Lesson 09's ShardedOptimizers that the clean re-grade alone decides: five mistakes and two right answers.

Each learner's notebook is written as `python -m autograder grade` receives it and decided by the
clean re-grade (``autograder.grading.clean``, whose verdicts are the only ones grading counts),
without nbgrader or a kernel (tests/_grading.py, :func:`regrade`). The mistakes are
tests/test_grading_e2e_09.py's (``MISTAKES``), which tries the grade command's own path on
lesson 09 with the frozen and unused parameters of issue 48.
"""

from __future__ import annotations

import pytest

from _grading import regrade, variant
from test_grading_e2e_09 import ANSWER, FLAT_SLICE, LESSON, MISTAKES

pytestmark = pytest.mark.slow  # each test runs a clean re-grade of the whole lesson


def _regrade(tmp_path, student: str):
    return regrade(tmp_path, LESSON, student, {ANSWER: variant(LESSON, ANSWER, *MISTAKES[student])})


def test_state_not_sharded_loses_state_and_traffic(tmp_path):
    """Does an optimizer that keeps and steps every parameter on every rank (an all-reduce, no shards) keep the
    parts that compare parameters and lose the state and traffic parts, with feedback naming both mistakes?"""
    graded = _regrade(tmp_path, "ben")
    assert graded.scores() == {**graded.points, "state": 0, "traffic": 0}
    graded.check_feedback("the whole model", "step() called all_reduce")


def test_summed_gradients_are_named(tmp_path):
    """Does an optimizer that sums the ranks' gradients lose the SGD and AdamW parts (AdamW, checked in float64, sees
    the scale through its eps), with feedback that says to divide?"""
    graded = _regrade(tmp_path, "cal")
    got = graded.scores()
    assert got["sgd"] == 0 and got["adamw"] == 0 and got["state"] == graded.points["state"]
    assert got["traffic"] == graded.points["traffic"]
    graded.check_feedback("divide its result by the world size")
    adamw = next(r for r in graded.results if r["part"] == "adamw")
    assert "float64" in adamw["message"] and "divide its result by the world size" in adamw["message"], adamw


def test_shards_never_gathered_lose_every_part_but_state(tmp_path):
    """Does an optimizer that never all-gathers lose the parameter and traffic parts, saying that the ranks disagree?"""
    graded = _regrade(tmp_path, "dan")
    assert graded.scores() == {**graded.points, "sgd": 0, "adamw": 0, "traffic": 0}
    graded.check_feedback("differs from rank 0", "all-gather the updated shards")


def test_a_whole_model_step_loses_only_the_state_part(tmp_path):
    """Does an inner optimizer that also steps every model parameter lose the state part alone, and say so?"""
    graded = _regrade(tmp_path, "eve")
    assert graded.scores() == {**graded.points, "state": 0}
    graded.check_feedback("the whole model")


def test_a_subclass_of_torchs_optimizer_earns_full_marks(tmp_path):
    """Does a correct ShardedOptimizer that subclasses torch.optim.Optimizer (the whole model in its own
    param_groups, the shard stepped by an inner optimizer) earn every point, "state" included?"""
    graded = _regrade(tmp_path, "fay")
    assert graded.scores() == graded.points


def test_an_exchange_without_a_step_earns_nothing(tmp_path):
    """Does a step() that reduce-scatters and all-gathers but never steps its slice earn no point at all, "state" and
    "traffic" included, with feedback saying that nothing was stepped?"""
    graded = _regrade(tmp_path, "hal")
    assert graded.scores() == {part: 0 for part in graded.points}
    graded.check_feedback("left every parameter as it was", "hold state for 0 elements")


def test_one_flat_slice_that_puts_back_idle_values_earns_full_marks(tmp_path):
    """Does a right answer of another shape, one flat slice with the frozen layer in it and the values of parameters
    without a gradient put back after each step, earn every point?"""
    graded = regrade(tmp_path, LESSON, "ivy", {ANSWER: FLAT_SLICE})
    assert graded.scores() == graded.points
