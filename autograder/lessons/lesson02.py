"""Lesson 02's graded exercise: 2.1, the ring sum ``ring_sum(rank, world_size, value)``.

Each rank is given a whole number, ``value``, that only it knows: the checks draw the
values when they run, so no rank can work the total out alone. The learner passes a
token round the ring so that every rank returns the sum of all the ranks' values. In the
ring, rank ``r`` receives only from its left neighbour ``(r - 1) % p`` and sends only to
its right neighbour ``(r + 1) % p``; with more than one rank every rank sends at least
one message and receives at least one. Only point-to-point calls may carry the token
(send, recv, isend, irecv, batch_isend_irecv, send_object_list, recv_object_list): the
collectives are switched off in every part and in the self-check. The answer must work
on 1 to 6 ranks, return an int or a one-element tensor on every rank, and leave nothing
behind: it is called three times in a row on the same group, with new values each time.

The parts:

- ``correct``: the right totals on 1 to 6 ranks;
- ``point_to_point``: the right totals, and the trace shows the ring pattern above;
- ``no_hang``: three calls in a row on 2 to 6 ranks, each with its own values.

The visible self-check runs the first two on 2 and 3 ranks.

Hidden test cells (one per part) and the visible self-check::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("2.1", ring_sum, "correct")     # also "point_to_point", "no_hang"
    exercise("2.1").self_check(ring_sum)           # 2 and 3 ranks, totals and pattern

"""

from __future__ import annotations

import random
from typing import Any, Callable

from helpers import DATA_COLLECTIVES

from ..kit.exercise import Attempt, Exercise, Part, fresh_seed
from ..kit.pieces import plural, silent_ranks

__all__ = ["EXERCISES", "exercise_2_1", "draw_values"]


def draw_values(seed: int, world_size: int, call: int = 0) -> list[int]:
    """The values the ranks of one call are given: distinct, non-zero, between -999 and 999.

    >>> draw_values(7, 3) == draw_values(7, 3) and draw_values(7, 3) != draw_values(7, 3, call=1)
    True
    >>> 0 in draw_values(7, 6) or len(set(draw_values(7, 6))) != 6
    False
    """
    rng = random.Random(f"{seed}/{world_size}/{call}")
    return [v * rng.choice((-1, 1)) for v in rng.sample(range(1, 1000), world_size)]


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


def _worker(rank: int, world_size: int, fn: Callable, values: list[list[int]]) -> list[dict]:
    """Call ``fn`` once per row of ``values``, with this rank's value of that row."""
    return [_as_number(fn(rank, world_size, row[rank])) for row in values]


def _sum_text(values: list[int]) -> str:
    """``"412 + (-37) + 88 = 463"``."""
    return " + ".join(str(v) if v >= 0 else f"({v})" for v in values) + f" = {sum(values)}"


def _judge(attempt: Attempt, world: int, values: list[list[int]], rows_per_rank: list[list[dict]]) -> None:
    for call, row_values in enumerate(values):
        expected = sum(row_values)
        again = f" (call {call + 1} in a row)" if call else ""
        for rank, rows in enumerate(rows_per_rank):
            row = rows[call]
            if not row["ok"]:
                attempt.fail(f"on {plural(world, 'rank')}, rank {rank} returned {row['why']}{again}.")
            got = row["value"]
            if got == expected:
                continue
            if world == 1:
                attempt.fail(f"on 1 rank with the value {expected}, rank 0 returned {got!r}{again}. With one "
                             "rank there is nobody to talk to: return the rank's own value.")
            own = row_values[rank]
            alone = got in (own, own * world, sum(range(world)))
            attempt.fail(
                f"on {plural(world, 'rank')} the values were {row_values}{again}; rank {rank} returned {got!r}, "
                f"but every rank should return their sum, {_sum_text(row_values)}."
                + ("\nEach rank knows only its own value: the others' values must reach it by messages round "
                   "the ring." if alone else "")
            )


def _ring_pattern(attempt: Attempt, world: int, result: Any) -> None:
    """Fail unless every rank received only from its left, sent only to its right, and did both."""
    quiet = silent_ranks(result)
    if quiet:
        rank, what = quiet[0]
        attempt.fail(
            f"on {world} ranks, rank {rank} {what} no point-to-point message, yet it returned the right total. "
            "In the ring every rank receives the token from its left neighbour and passes it to its right one."
        )
    for event in result.trace.events:
        if not (event.is_send or event.is_recv):
            continue
        rank = event.rank
        right, left = (rank + 1) % world, (rank - 1) % world
        if event.is_send and event.peer != right:
            attempt.fail(
                f"on {world} ranks, rank {rank} sent a message ({event.op}) to rank {event.peer}. In the ring "
                f"rank {rank} sends only to its right neighbour, rank {right}, and receives only from its left "
                f"neighbour, rank {left}."
            )
        if event.is_recv and event.peer != left:
            source = "any rank" if event.peer is None else f"rank {event.peer}"
            attempt.fail(
                f"on {world} ranks, rank {rank} received a message ({event.op}) from {source}. In the ring "
                f"rank {rank} receives only from its left neighbour, rank {left}, and sends only to its right "
                f"neighbour, rank {right}."
            )


def _point_to_point(attempt: Attempt, worlds: tuple[int, ...] = (2, 3, 5)) -> None:
    seed = fresh_seed()
    for world in worlds:
        values = [draw_values(seed, world)]
        result = attempt.run(_worker, world, (attempt.fn, values), trace=True, timeout=8.0)
        _judge(attempt, world, values, list(result))
        _ring_pattern(attempt, world, result)


def _self_check(attempt: Attempt) -> str:
    _point_to_point(attempt, (2, 3))
    return ("Self-check passed: on 2 and 3 ranks every rank returned the sum of the values the check drew, "
            "each rank received only from its left neighbour and sent only to its right one, and the built-in "
            "collectives were switched off. The hidden tests also try 1 to 6 ranks, other values, and three "
            "calls in a row.")


exercise_2_1 = Exercise(
    number="2.1",
    function="ring_sum",
    title="ring sum",
    parts=(
        Part("correct", 2, "every rank returns the sum of the ranks' values (drawn at grading) on 1 to 6 ranks."),
        Part("point_to_point", 1, "each rank receives only from its left neighbour and sends only to its right "
             "one, at least one message each way."),
        Part("no_hang", 1, "no hang on 2 to 6 ranks, three calls in a row with new values."),
    ),
    visible_check=_self_check,
    forbid=DATA_COLLECTIVES,  # the object collectives too: the token must travel by messages
    forbid_reason="in exercise 2.1 the token travels round the ring by point-to-point messages (send, recv, "
                  "isend, irecv), not by a collective",
)

EXERCISES = (exercise_2_1,)
