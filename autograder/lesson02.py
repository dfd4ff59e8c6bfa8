"""Lesson 02's graded exercise: 2.1, the ring sum ``ring_sum(rank, world_size)``.

The learner passes a token round a ring so that every rank ends with
``0 + 1 + ... + (world_size - 1)``, using point-to-point calls only (send, recv, isend,
irecv, batch_isend_irecv, send_object_list, recv_object_list), on any world size from 1
to 6, and returns the total as an int or a one-element tensor on every rank. It must
leave nothing behind: it is called several times in a row on the same group.

Hidden test cells (one per part) and the visible self-check::

    from autograder import exercise
    exercise("2.1").grade(ring_sum, "correct")     # also "point_to_point", "no_hang"
    exercise("2.1").self_check(ring_sum)           # 2 and 3 ranks

Example (an answer that always returns 0 is right on one rank only)::

    >>> from autograder.kit import GradingFailure
    >>> try:
    ...     exercise_2_1.grade(lambda rank, world_size: 0, "correct")
    ... except GradingFailure as err:
    ...     print(err)
    correct: on 2 ranks, rank 0 returned 0; every rank should return 0 + 1 + ... + 1 = 1.
"""

from __future__ import annotations

from typing import Any, Callable

from helpers import DATA_COLLECTIVES

from .kit import Attempt, Exercise, Part, plural, silent_ranks

__all__ = ["EXERCISES", "exercise_2_1"]


def _as_number(value: Any) -> dict:
    """Turn what the learner returned into a number, or say why it is not one."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return {"ok": False, "why": f"a tensor of shape {tuple(value.shape)}; return one number "
                                        "(an int or a tensor with a single element)"}
        return {"ok": True, "value": value.item()}
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return {"ok": False, "why": f"{type(value).__name__} {value!r:.60}; return the total as an int "
                                    "or a one-element tensor"}
    return {"ok": True, "value": value}


def _worker(rank: int, world_size: int, fn: Callable, repeats: int) -> list[dict]:
    return [_as_number(fn(rank, world_size)) for _ in range(repeats)]


def _judge(attempt: Attempt, world: int, rows_per_rank: list[list[dict]]) -> None:
    expected = sum(range(world))
    for rank, rows in enumerate(rows_per_rank):
        for call, row in enumerate(rows):
            again = f" (call {call + 1} in a row)" if call else ""
            if not row["ok"]:
                attempt.fail(f"on {plural(world, 'rank')}, rank {rank} returned {row['why']}{again}.")
            if row["value"] != expected:
                attempt.fail(
                    f"on {plural(world, 'rank')}, rank {rank} returned {row['value']!r}{again}; every rank should "
                    f"return 0 + 1 + ... + {world - 1} = {expected}."
                    + (" With one rank there is nobody to talk to: return 0." if world == 1 else "")
                )


def _correct(attempt: Attempt, worlds: tuple[int, ...] = (1, 2, 3, 4, 5, 6)) -> None:
    for world in worlds:
        result = attempt.run(_worker, world, (attempt.fn, 1), timeout=10.0)
        _judge(attempt, world, list(result))


def _point_to_point(attempt: Attempt) -> None:
    for world in (2, 3, 5):
        result = attempt.run(_worker, world, (attempt.fn, 1), trace=True, timeout=8.0)
        _judge(attempt, world, list(result))
        quiet = silent_ranks(result)
        if quiet:
            rank, what = quiet[0]
            attempt.fail(
                f"on {world} ranks, rank {rank} {what} no point-to-point message, yet it returned the "
                "right total. In a ring every rank receives the token from its left neighbour and passes "
                "it to its right one: the total must travel by messages."
            )


def _no_hang(attempt: Attempt) -> None:
    for world in (2, 3, 4, 5, 6):
        # Three calls in a row: a message left unreceived by one call would be picked up by
        # the next one (or block it), and an isend that is never waited on may be lost.
        result = attempt.run(_worker, world, (attempt.fn, 3), timeout=6.0, context="three calls in a row")
        _judge(attempt, world, list(result))


def _self_check(attempt: Attempt) -> str:
    _correct(attempt, (2, 3))
    return ("Self-check passed: every rank returned the right total on 2 and 3 ranks, with the built-in "
            "collectives switched off. The hidden tests also try 1 to 6 ranks, count each rank's messages, "
            "and call ring_sum three times in a row.")


exercise_2_1 = Exercise(
    number="2.1",
    function="ring_sum",
    title="ring sum",
    parts=(
        Part("correct", 2, "every rank returns the right total on 1 to 6 ranks.", _correct),
        Part("point_to_point", 1, "still right with the collectives switched off; every rank sends and receives.",
             _point_to_point),
        Part("no_hang", 1, "no hang on 2 to 6 ranks, three calls in a row.", _no_hang),
    ),
    visible_check=_self_check,
    forbid=DATA_COLLECTIVES,  # the object collectives too: the token must travel by messages
    forbid_reason="in exercise 2.1 the token travels round the ring by point-to-point messages (send, recv, "
                  "isend, irecv), not by a collective",
)

EXERCISES = (exercise_2_1,)
