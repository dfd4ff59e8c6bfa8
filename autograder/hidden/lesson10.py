"""Lesson 10's hidden tests: the check of every graded part of Exercises 10.1, 10.2, 10.3, 10.4.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson10`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.

Example (the instructor's answers pass)::

    >>> from autograder.hidden import grade
    >>> from autograder.answers.lesson10 import TensorParallelMLP, gpipe_step
    >>> grade("10.1", TensorParallelMLP, "communication")
    >>> grade("10.2", gpipe_step, "bubble")
"""

from __future__ import annotations

from autograder.kit.exercise import Attempt, fresh_seed
from autograder.lessons.pipecheck import (judge_bubble, judge_chunk_gradients, judge_finished, judge_gradients,
                        judge_interleaved_bubble, judge_memory, judge_messages, pipeline_worker)
from autograder.lessons.tpcheck import judge_backward, judge_communication, judge_forward, judge_shards
from autograder.lessons.lesson10 import CHUNKS, TP_CASES, _pipeline, _tp_runs

__all__ = ["CHECKS"]


NO_HANG_TIMEOUT = 6.0


# The backward part also runs (world size, dtype, the full parameters given with requires_grad=False, whose
# shards must stay without a gradient, as torch leaves them).
TP_FROZEN = ((2, "float64", ("fc1.weight", "fc2.bias")),)


# Exercises 10.2 and 10.3: (stages, micro-batches).
GPIPE_CASES = ((2, 1), (2, 4), (3, 3), (3, 5), (4, 3))


ONE_F_ONE_B_CASES = ((2, 4), (3, 6), (4, 8))


# Exercise 10.4: (stages, micro-batches), two chunks per rank; m a multiple of p, as Megatron's schedule needs.
INTERLEAVED_CASES = ((2, 4), (3, 3), (4, 8))


# The gradients parts also run a case whose stages hold a frozen bias and a parameter their forward never uses
# (pipecheck.SPARE): (stages, micro-batches) per exercise. Their .grad must stay None, as torch's autograd leaves it.
SPARE_CASES = {"10.2": (3, 4), "10.3": (3, 6), "10.4": (2, 4)}


def _tp_part(judge, cases: tuple = TP_CASES):
    def check(attempt: Attempt, cases: tuple = cases) -> None:
        for world, dtype_name, replies in _tp_runs(attempt, cases, run=judge is not judge_shards):
            judge(attempt, world, dtype_name, replies)

    check.__name__ = f"_{judge.__name__.removeprefix('judge_')}"
    return check


_tp_forward, _tp_backward = _tp_part(judge_forward), _tp_part(judge_backward, TP_CASES + TP_FROZEN)


_tp_communication, _tp_shards = _tp_part(judge_communication), _tp_part(judge_shards)


def _pipeline_part(judge, cases: tuple, chunks: int = 0, spare: tuple | None = None, **options):
    def check(attempt: Attempt, cases: tuple = cases) -> None:
        for p, m in cases:
            judge(attempt, p, m, _pipeline(attempt, p, m, chunks=chunks), **options)
        if spare is not None:
            p, m = spare
            judge(attempt, p, m, _pipeline(attempt, p, m, chunks=chunks, spare=True), **options)

    check.__name__ = f"_{judge.__name__.removeprefix('judge_')}"
    return check


def _gpipe_no_hang(attempt: Attempt) -> None:
    seed = fresh_seed()
    for p in (2, 3, 4):  # a run of its own, with its own time limit; the step must be done, not skipped
        replies = attempt.run(pipeline_worker, p, (attempt.fn, seed, 8), timeout=NO_HANG_TIMEOUT, trace=True,
                              context="8 micro-batches of 3 rows")
        judge_finished(attempt, p, 8, list(replies))


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "10.1": {"forward": _tp_forward, "backward": _tp_backward, "communication": _tp_communication, "shards": _tp_shards},
    "10.2": {"gradients": _pipeline_part(judge_gradients, GPIPE_CASES, spare=SPARE_CASES["10.2"]), "messages": _pipeline_part(judge_messages, GPIPE_CASES), "bubble": _pipeline_part(judge_bubble, GPIPE_CASES), "no_hang": _gpipe_no_hang},
    "10.3": {"gradients": _pipeline_part(judge_gradients, ONE_F_ONE_B_CASES, spare=SPARE_CASES["10.3"], schedule_name="1F1B"), "memory": _pipeline_part(judge_memory, ONE_F_ONE_B_CASES), "bubble": _pipeline_part(judge_bubble, ONE_F_ONE_B_CASES, schedule_name="1F1B")},
    "10.4": {"gradients": _pipeline_part(judge_chunk_gradients, INTERLEAVED_CASES, chunks=CHUNKS, spare=SPARE_CASES["10.4"]), "bubble": _pipeline_part(judge_interleaved_bubble, INTERLEAVED_CASES, chunks=CHUNKS)},
}
