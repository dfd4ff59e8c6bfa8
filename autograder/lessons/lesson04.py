"""Lesson 04's graded exercises: the ring all-reduce, climbed in four steps.

- 4.1 ``ring_chunks(phase, step, rank, world_size)``: the schedule, a pure function giving
  ``(chunk sent right, chunk received from the left)`` at each step of the
  ``"reduce-scatter"`` and the ``"all-gather"``, such that rank r ends the reduce-scatter
  owning the full sum of chunk r (as ``dist.reduce_scatter`` leaves item r on rank r).
- 4.2 ``ring_reduce_scatter(tensor)``: in place, chunk ``rank`` of the flattened tensor
  becomes its sum over all ranks; a ring, p-1 messages of at most ceil(n/p) elements.
- 4.3 ``ring_all_gather(tensor)``: in place, each rank's chunk ``rank`` reaches every rank;
  a ring, p-1 messages of at most ceil(n/p) elements.
- 4.4 ``ring_allreduce(tensor)``: the sum in place on every rank, as
  ``dist.all_reduce(tensor)`` gives it, bandwidth-optimally: each rank sends exactly
  2(p-1) messages of at most ceil(n/p) elements. The bandwidth part counts messages and
  elements, not who receives them, so an exchange that meets the bound without a ring
  passes 4.4 (4.2 and 4.3 check the ring itself).

Chunks are those of ``chunk_bounds``: ceil(n/p) elements each, the last ones short or
empty. 4.2-4.4 run with every built-in collective switched off, for 1 to 8 ranks, any
number of elements, float32, float64 and int64, any contiguous shape.

Hidden test cells (one per part) and the visible self-checks::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("4.1", ring_chunks, "reduce_scatter")       # also "all_gather"
    grade("4.2", ring_reduce_scatter, "correct")      # also "ring"
    grade("4.3", ring_all_gather, "correct")          # also "ring"
    grade("4.4", ring_allreduce, "correct")   # "point_to_point", "bandwidth", "no_hang"
    exercise("4.4").self_check(ring_allreduce)          # a few cases on 2 and 3 ranks, and the traffic

"""

from __future__ import annotations

import math
from typing import Callable

from helpers import COURSE_RING, DATA_COLLECTIVES

from ..kit.exercise import Attempt, Exercise, Part, fresh_seed
from ..kit.pieces import by_world_size
from .ringcheck import (TRAFFIC_CASES, all_gather_worker, all_reduce_worker, judge_rows, judge_schedule,
                        reduce_scatter_worker, ring_traffic, schedule_worker, traced)

__all__ = ["EXERCISES", "exercise_4_1", "exercise_4_2", "exercise_4_3", "exercise_4_4", "CASES", "PHASES", "HINTS"]

PHASES = ("reduce-scatter", "all-gather")
# Seconds one launch may take before it counts as a hang. A correct ring finishes each in
# well under a second, but on a busy shared machine a launch has been seen to stall for 5 s
# (once 10 s) while gloo sets up, at any world size; that time counts against these limits.
# They leave room for it: only a hanging submission ever waits them out.
TIMEOUT_CORRECT = 10.0
# (world size, shape, dtype name): fewer elements than ranks, counts not divisible by
# the world size, several dimensions, three dtypes.
CASES = [
    (1, (5,), "float32"),
    (2, (1,), "float32"),
    (2, (6,), "int64"),
    (3, (10,), "float64"),
    (3, (2,), "float32"),
    (4, (17,), "float32"),
    (4, (3, 5), "int64"),
    (4, (3,), "float64"),
    (5, (2, 3, 4), "float32"),
    (6, (7,), "int64"),
    (7, (100,), "float64"),
    (8, (9,), "float32"),
    (8, (1000,), "float32"),
]
SELF_CHECK_CASES = [(2, (4,), "float32"), (3, (10,), "float32"), (3, (2,), "int64")]
# What feedback adds to the usual mistakes of 4.2-4.4 (see autograder.kit.harness.run_ranks).
HINTS = {
    "IndexError": "An IndexError in a ring usually means a list of chunks shorter than the world size: "
                  "torch.chunk(t, p) (and t.chunk(p)) cuts chunks of ceil(n/p) elements and returns fewer than p "
                  "of them when the elements run out (10 elements in 4 chunks give 3; 2 elements over 3 ranks "
                  "give 2). Split with the lesson's chunk_bounds(n, p), which always gives p chunks, the last "
                  "ones short or empty.",
    "DeadlockError": "Every rank in the cycle sits in a blocking call that waits for another: when every rank "
                     "sends first (or receives first), nobody ever reaches the matching call. Start each send "
                     "with dist.isend, then recv, then wait() on the send's request; or let even ranks send "
                     "first and odd ranks receive first (lesson 2, section 5).",
}
SCHEDULE_WORLDS = tuple(range(2, 9))
SCHEDULE_SELF_CHECK_WORLDS = (2, 3, 4)


# -- Exercise 4.1: the schedule ------------------------------------------------------------


def _schedule(attempt: Attempt, phase: str, worlds: tuple = SCHEDULE_WORLDS) -> None:
    # One cheap launch: the learner's function runs in a fresh process with a time limit,
    # never in the grading kernel.
    table = attempt.run(schedule_worker, 1, (attempt.fn, phase, worlds), timeout=10.0,
                        context=f"asking for the {phase} schedule")[0]
    for p in worlds:
        judge_schedule(attempt, phase, p, table[p])


def _schedule_self_check(attempt: Attempt) -> str:
    for phase in PHASES:
        _schedule(attempt, phase, SCHEDULE_SELF_CHECK_WORLDS)
    return ("Self-check passed: on 2, 3 and 4 ranks each rank receives what its left neighbour sends, the "
            "reduce-scatter leaves rank r owning the full sum of chunk r, and the all-gather passes every "
            "finished chunk to every rank. The hidden tests check the same on 2 to 8 ranks.")


exercise_4_1 = Exercise(
    number="4.1",
    function="ring_chunks",
    title="the ring's chunk schedule",
    parts=(
        Part("reduce_scatter", 1, "the reduce-scatter schedule on 2-8 ranks: each rank adds what its left neighbour "
             "sends and ends owning the full sum of chunk r."),
        Part("all_gather", 1, "the all-gather schedule on 2-8 ranks: each rank sends only chunks it holds and ends "
             "with every chunk."),
    ),
    visible_check=_schedule_self_check,
    forbid=(COURSE_RING,),
    forbid_reason="exercise 4.1 asks you to work the schedule out yourself, not to take it from helpers.ring",
)


# -- the shared parts ------------------------------------------------------------------------


def _correct(attempt: Attempt, worker: Callable = all_reduce_worker, cases: list = CASES,
             timeout: float = TIMEOUT_CORRECT) -> None:
    seed = fresh_seed()
    for world, group_cases in by_world_size(cases):
        result = attempt.run(worker, world, (attempt.fn, group_cases, seed), timeout=timeout)
        judge_rows(attempt, world, list(result))


# -- Exercise 4.2: ring reduce-scatter ----------------------------------------------------------


def _reduce_scatter_self_check(attempt: Attempt) -> str:
    _correct(attempt, reduce_scatter_worker, SELF_CHECK_CASES)
    ring_traffic(attempt, reduce_scatter_worker, "reduce-scatter", TRAFFIC_CASES[:1])
    return ("Self-check passed: on 2 and 3 ranks, with the built-in collectives switched off, rank r ends "
            "holding the full sum of chunk r, including 10 elements over 3 ranks and fewer elements than "
            "ranks; on 3 ranks each rank sent 2 chunks to its right neighbour. The hidden tests also try "
            "up to 8 ranks, float64, several dimensions, and count the messages on 4 and 5 ranks.")


exercise_4_2 = Exercise(
    number="4.2",
    function="ring_reduce_scatter",
    title="ring reduce-scatter",
    parts=(
        Part("correct", 2, "chunk r of rank r holds its sum over all ranks, 1-8 ranks, uneven and tiny sizes, "
             "3 dtypes, several shapes."),
        Part("ring", 1, "each rank sends p-1 messages of at most ceil(n/p) elements, to its right neighbour, "
             "and receives p-1 from its left."),
    ),
    visible_check=_reduce_scatter_self_check,
    forbid=DATA_COLLECTIVES + (COURSE_RING,),
    hints=HINTS,
    forbid_reason="exercise 4.2 asks you to build the reduce-scatter yourself, from send, recv, isend and irecv",
)


# -- Exercise 4.3: ring all-gather --------------------------------------------------------------


def _all_gather_self_check(attempt: Attempt) -> str:
    _correct(attempt, all_gather_worker, SELF_CHECK_CASES)
    ring_traffic(attempt, all_gather_worker, "all-gather", TRAFFIC_CASES[:1])
    return ("Self-check passed: on 2 and 3 ranks, with the built-in collectives switched off, every rank "
            "ends with every rank's chunk, including 10 elements over 3 ranks and fewer elements than ranks; "
            "on 3 ranks each rank sent 2 chunks to its right neighbour. The hidden tests also try up to 8 "
            "ranks, float64, several dimensions, and count the messages on 4 and 5 ranks.")


exercise_4_3 = Exercise(
    number="4.3",
    function="ring_all_gather",
    title="ring all-gather",
    parts=(
        Part("correct", 2, "chunk c of every rank ends holding rank c's chunk, 1-8 ranks, uneven and tiny sizes, "
             "3 dtypes, several shapes."),
        Part("ring", 1, "each rank sends p-1 messages of at most ceil(n/p) elements, to its right neighbour, "
             "and receives p-1 from its left."),
    ),
    visible_check=_all_gather_self_check,
    forbid=DATA_COLLECTIVES + (COURSE_RING,),
    hints=HINTS,
    forbid_reason="exercise 4.3 asks you to build the all-gather yourself, from send, recv, isend and irecv",
)


# -- Exercise 4.4: ring all-reduce --------------------------------------------------------------


def _bandwidth(attempt: Attempt, cases: tuple = TRAFFIC_CASES) -> None:
    """2(p-1) messages of at most ceil(n/p) elements per rank, to any peer: a ring is not required."""
    for world, n in cases:
        result = traced(attempt, all_reduce_worker, world, n)
        want_msgs = 2 * (world - 1)
        chunk = math.ceil(n / world)
        max_elems = want_msgs * chunk
        for rank, row in sorted(result.trace.summary().items()):
            elems = row["sent_bytes"] // 4
            if row["sent_messages"] == 0:
                attempt.fail(
                    f"on {world} ranks with {n} elements, rank {rank} sent no point-to-point message, yet a "
                    f"ring sends 2(p-1) = {want_msgs}. Only send and isend count here: move the chunks with "
                    "them rather than with a built-in collective."
                )
            biggest = max((e.nbytes or 0) // 4 for e in result.trace.for_rank(rank) if e.is_send)
            if row["sent_messages"] != want_msgs or elems > max_elems or biggest > chunk:
                attempt.fail(
                    f"on {world} ranks with {n} elements, rank {rank} sent {row['sent_messages']} messages "
                    f"carrying {elems} elements (the largest {biggest}); a bandwidth-optimal all-reduce sends "
                    f"exactly 2(p-1) = {want_msgs} messages of at most ceil(n/p) = {chunk} elements (at most "
                    f"{max_elems} elements in all). Passing the whole tensor round the ring sends (p-1) x n = "
                    f"{(world - 1) * n}: split it into p chunks, reduce-scatter, then all-gather."
                )


def _self_check(attempt: Attempt) -> str:
    _correct(attempt, all_reduce_worker, SELF_CHECK_CASES, timeout=10.0)
    _bandwidth(attempt, TRAFFIC_CASES[:1])
    return ("Self-check passed: correct sums on 2 and 3 ranks, with the built-in collectives switched "
            "off, including 10 elements over 3 ranks and fewer elements than ranks, and on 3 ranks each rank "
            "sent 2(p-1) = 4 messages of at most ceil(10/3) = 4 elements. The hidden tests also check world "
            "sizes up to 8, float64, several dimensions, and count the messages on 4 and 5 ranks.")


exercise_4_4 = Exercise(
    number="4.4",
    function="ring_allreduce",
    title="ring all-reduce",
    parts=(
        Part("correct", 4, "the right sums on 1-8 ranks, uneven and tiny sizes, 3 dtypes, several shapes."),
        Part("point_to_point", 2, "still correct with every built-in collective disabled; data moves by send/recv."),
        Part("bandwidth", 3, "each rank sends exactly 2(p-1) messages of at most ceil(n/p) elements (to any peer)."),
        Part("no_hang", 1, "finishes promptly on 2, 3, 4 and 5 ranks, every rank sending and receiving (no "
             "deadlock for odd or even world sizes)."),
    ),
    visible_check=_self_check,
    forbid=DATA_COLLECTIVES + (COURSE_RING,),
    hints=HINTS,
    forbid_reason="exercise 4.4 asks you to build all_reduce yourself, from send, recv, isend and irecv",
)

EXERCISES = (exercise_4_1, exercise_4_2, exercise_4_3, exercise_4_4)
