"""Lesson 05's hidden tests: the check of every graded part of Exercises 5.1, 5.2.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson05`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.

Example (the instructor's answer passes)::

    >>> from autograder.hidden import grade
    >>> from autograder.answers.lesson05 import average_gradients
    >>> grade("5.1", average_gradients, "correct")
"""

from __future__ import annotations

from autograder.lessons.gradcheck import training_worker
from autograder.kit.exercise import Attempt, fresh_seed
from autograder.kit.pieces import plural
from autograder.lessons.lesson05 import TIMEOUT, _run_grads, _same_steps, _sharding, _signatures

__all__ = ["CHECKS"]


# (model kind, dtype, world sizes): what the part "correct" runs.
CORRECT_CASES = (("mlp", "float32", (1, 2, 3, 4, 8)), ("mlp", "float64", (3,)))


SPECIAL_CASES = (("frozen", (2, 3)), ("unused_everywhere", (2,)), ("unused_on_rank_0", (2, 4)), ("tied", (3,)))


def _correct(attempt: Attempt) -> None:
    _signatures(attempt, (2, 3, 4))
    for kind, dtype_name, worlds in CORRECT_CASES:
        for world_size in worlds:
            _run_grads(attempt, kind, dtype_name, world_size)


def _unused_frozen_tied(attempt: Attempt) -> None:
    for kind, worlds in SPECIAL_CASES:
        for world_size in worlds:
            _run_grads(attempt, kind, "float32", world_size)


def _same(a, b) -> bool:
    """Both None, or equal tensors."""
    import torch

    return a is b is None or (a is not None and b is not None and torch.equal(a, b))


def _parameters_unchanged(attempt: Attempt) -> None:
    """With different weights on every rank: the weights stay as they were, and the gradients were exchanged.

    Leaving everything alone must not pass, so every rank has to end with the same gradients (what averaging over
    the ranks gives). Whether they are the exact mean is the other parts' question: an average that forgets to divide
    still changes only the gradients.
    """
    import torch

    for kind, world_size in (("mlp", 3), ("frozen", 2)):
        replies = _run_grads(attempt, kind, "float32", world_size, spread=True)
        where = f"on {plural(world_size, 'rank')}, each rank with slightly different weights"
        for rank, reply in enumerate(replies):
            if reply["changed"]:
                same = all(
                    r["equal_after"][reply["changed"][0]].equal(replies[0]["equal_after"][reply["changed"][0]])
                    for r in replies
                )
                hint = (" The ranks' weights are now equal: it looks like the weights were averaged instead "
                        "of the gradients." if same and world_size > 1 else "")
                attempt.fail(f"{where}, rank {rank}: average_gradients changed the parameter {reply['changed'][0]} "
                             f"itself. Only the .grad tensors may change; the optimizer changes the weights.{hint}")
        first = replies[0]["grads"]
        for name, want in first.items():
            for rank, reply in enumerate(replies[1:], start=1):
                got = reply["grads"][name]
                if (want is None) != (got is None) or (
                        want is not None and not torch.allclose(got, want, rtol=1e-5, atol=1e-6)):
                    kept = all(_same(r["grads"][name], r["local"][name]) for r in replies)
                    why = (" Every rank still holds the gradient it computed itself: nothing was averaged."
                           if kept else "")
                    attempt.fail(f"{where}: after average_gradients rank {rank}'s {name}.grad differs from rank 0's."
                                 f"{why} This part pays for gradients averaged over the ranks with the weights left "
                                 "alone, so every rank must end with the same gradients.")


def _training(attempt: Attempt) -> None:
    for optimizer, world_size in (("sgd", 2), ("momentum", 3), ("adam", 4)):
        seed = fresh_seed()
        result = attempt.run(training_worker, world_size, (attempt.fn, optimizer, seed, 5, 3), timeout=TIMEOUT,
                             context=f"5 steps of {optimizer} in float64")
        for rank, reply in enumerate(result):
            if reply["worst"] > 1e-9 * max(1.0, reply["scale"]):
                attempt.fail(f"on {plural(world_size, 'rank')}, after 5 steps of {optimizer} with your averaging, "
                             f"rank {rank}'s weights differ from one process training on the whole batch by up to "
                             f"{reply['worst']:.3g}. Each step's gradient must be the mean over the ranks.")


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "5.1": {"correct": _correct, "unused_frozen_tied": _unused_frozen_tied, "parameters_unchanged": _parameters_unchanged, "training": _training},
    "5.2": {"same_steps": _same_steps, "sharding": _sharding},
}
