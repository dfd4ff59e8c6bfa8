"""Hidden-test checks for lesson 02: the learner's ``ring_sum(rank, world_size)``.

The exercise: pass a token round a ring so that every rank ends with
``0 + 1 + ... + (world_size - 1)``, using point-to-point calls only (send, recv, isend,
irecv, batch_isend_irecv, send_object_list, recv_object_list), on any world size from 1
to 6. The function returns the total as an int or a one-element tensor, on every rank.
It must leave nothing behind: it is called several times in a row on the same group.

Graded in three parts, each its own hidden test cell::

    check_ring_sum(ring_sum, part="correct")
    check_ring_sum(ring_sum, part="point_to_point")
    check_ring_sum(ring_sum, part="no_hang")

``self_check(ring_sum)`` is the visible check learners run: 2 and 3 ranks, with
messages they can act on.
"""

from __future__ import annotations

from typing import Any, Callable

from .harness import COLLECTIVES, GradingFailure, grade_part, require_function, run_ranks

__all__ = ["check_ring_sum", "self_check", "PARTS", "FORBIDDEN"]

PARTS = ("correct", "point_to_point", "no_hang")
# Every built-in collective, the object ones included: the token must travel by
# point-to-point messages.
FORBIDDEN = COLLECTIVES  # the object collectives included


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


def _judge(part: str, world: int, rows_per_rank: list[list[dict]]) -> None:
    expected = sum(range(world))
    for rank, rows in enumerate(rows_per_rank):
        for call, row in enumerate(rows):
            again = f" (call {call + 1} in a row)" if call else ""
            ranks = f"{world} rank{'s' if world > 1 else ''}"
            if not row["ok"]:
                raise GradingFailure(f"{part}: on {ranks}, rank {rank} returned {row['why']}{again}.")
            if row["value"] != expected:
                raise GradingFailure(
                    f"{part}: on {ranks}, rank {rank} returned {row['value']!r}{again}; every rank should "
                    f"return 0 + 1 + ... + {world - 1} = {expected}."
                    + (" With one rank there is nobody to talk to: return 0." if world == 1 else "")
                )


def _check_correct(fn: Callable, worlds: tuple, part: str, timeout: float = 10.0) -> None:
    for world in worlds:
        result = run_ranks(part, _worker, world, (fn, 1), timeout=timeout)
        _judge(part, world, list(result))


def _check_p2p(fn: Callable) -> None:
    part = "point_to_point"
    for world in (2, 3, 5):
        result = run_ranks(part, _worker, world, (fn, 1), forbid=FORBIDDEN, trace=True, timeout=8.0)
        _judge(part, world, list(result))
        summary = result.trace.summary()
        for rank in range(world):
            row = summary[rank]
            if row["sent_messages"] == 0 or row["recv_messages"] == 0:
                what = "sent" if row["sent_messages"] == 0 else "received"
                raise GradingFailure(
                    f"{part}: on {world} ranks, rank {rank} {what} no point-to-point message, yet it "
                    "returned the right total. In a ring every rank receives the token from its left "
                    "neighbour and passes it to its right one: the total must travel by messages."
                )


def _check_no_hang(fn: Callable) -> None:
    part = "no_hang"
    for world in (2, 3, 4, 5, 6):
        # Three calls in a row: a message left unreceived by one call would be picked up by
        # the next one (or block it), and an isend that is never waited on may be lost.
        result = run_ranks(part, _worker, world, (fn, 3), timeout=6.0, context="three calls in a row")
        _judge(part, world, list(result))


def check_ring_sum(fn: Any, part: str) -> None:
    """Grade one part of the ring-sum exercise; raises GradingFailure with feedback."""
    fn = require_function(fn, "ring_sum", "Exercise 2.1")
    grade_part(part, {
        "correct": lambda: _check_correct(fn, (1, 2, 3, 4, 5, 6), part),
        "point_to_point": lambda: _check_p2p(fn),
        "no_hang": lambda: _check_no_hang(fn),
    })


def self_check(fn: Any) -> None:
    """The visible check: 2 and 3 ranks. Prints what passed; raises on failure."""
    fn = require_function(fn, "ring_sum", "Exercise 2.1")
    _check_correct(fn, (2, 3), "self-check", timeout=10.0)
    print("Self-check passed: every rank returned the right total on 2 and 3 ranks. The hidden "
          "tests also try 1 to 6 ranks, with collectives disabled, and call ring_sum three times in a row.")
