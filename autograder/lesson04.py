"""Lesson 04's graded exercise: 4.1, the ring all-reduce ``ring_allreduce(tensor)``.

The learner sums ``tensor`` in place over all ranks of the default group, as
``dist.all_reduce(tensor)`` would, with point-to-point calls only, bandwidth-optimally
(each rank sends 2(p-1) messages of at most ceil(n/p) elements), for any world size from
1 to 8, any number of elements, float32, float64 and int64, any contiguous shape.

Hidden test cells (one per part) and the visible self-check::

    from autograder import exercise
    exercise("4.1").grade(ring_allreduce, "correct")   # "point_to_point", "bandwidth", "no_hang"
    exercise("4.1").self_check(ring_allreduce)          # a few cases on 2 and 3 ranks

Example (the instructor's ring passes)::

    >>> from autograder.reference import ring_allreduce
    >>> exercise_4_1.grade(ring_allreduce, "no_hang")
"""

from __future__ import annotations

import math
from typing import Any, Callable

from helpers import DATA_COLLECTIVES

from .kit import Attempt, Exercise, Part, by_world_size, first_difference, fresh_seed, plural, seeded_tensor, silent_ranks

__all__ = ["EXERCISES", "exercise_4_1", "CASES"]

# Seconds one launch may take before it counts as a hang. A correct ring finishes each in
# well under a second, but on a busy shared machine a launch has been seen to stall for 5 s
# (once 10 s) while gloo sets up, at any world size; that time counts against these limits.
# They leave room for it: only a hanging submission ever waits them out.
TIMEOUT_CORRECT = 10.0
TIMEOUT_TRAFFIC = 8.0
TIMEOUT_NO_HANG = 6.0
INTS = (-50, 50)  # small integers: sums over 8 ranks stay exact in every dtype
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


# -- what runs on the ranks ----------------------------------------------------------------


def _correct_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    """Run every case for this world size; compare with a single-process reference."""
    out = []
    for i, (shape, dtype_name) in enumerate(cases):
        tensor = seeded_tensor(shape, dtype_name, seed + i, rank, int_range=INTS)
        expected = sum(seeded_tensor(shape, dtype_name, seed + i, r, int_range=INTS) for r in range(world_size))
        before = tensor.data_ptr()
        fn(tensor)
        row: dict[str, Any] = {"shape": shape, "dtype": dtype_name, "ok": True}
        if tensor.data_ptr() != before or tuple(tensor.shape) != tuple(shape):
            row.update(ok=False, why="the tensor was replaced or reshaped instead of being summed in place")
        elif tensor.dtype != expected.dtype:
            row.update(ok=False, why=f"the tensor's dtype changed to {tensor.dtype}")
        else:
            diff = first_difference(tensor, expected, tolerance=1e-4 if dtype_name == "float32" else 1e-9)
            if diff:
                row.update(ok=False, why=diff.what, excerpt=diff.excerpt)
        out.append(row)
    return out


def _traffic_worker(rank: int, world_size: int, fn: Callable, shape: tuple, seed: int) -> bool:
    """Sum one float32 tensor; True when the result is right."""
    import torch

    tensor = seeded_tensor(shape, "float32", seed, rank)
    expected = sum(seeded_tensor(shape, "float32", seed, r) for r in range(world_size))
    fn(tensor)
    return bool(torch.allclose(tensor, expected, rtol=1e-4, atol=1e-4))


# -- the parts -----------------------------------------------------------------------------


def _correct(attempt: Attempt, cases: list = CASES, timeout: float = TIMEOUT_CORRECT) -> None:
    seed = fresh_seed()
    for world, group_cases in by_world_size(cases):
        result = attempt.run(_correct_worker, world, (attempt.fn, group_cases, seed), timeout=timeout)
        for rank, rows in enumerate(result):
            for row in rows:
                if row["ok"]:
                    continue
                n = math.prod(row["shape"])
                msg = (f"on {plural(world, 'rank')}, a {row['dtype']} tensor of shape {row['shape']} "
                       f"({plural(n, 'element')}), rank {rank}: {row['why']}." + row.get("excerpt", ""))
                if n < world:
                    msg += "\n  (There are fewer elements than ranks here: some chunks are empty.)"
                elif n % world:
                    msg += f"\n  ({n} elements do not split evenly over {world} ranks.)"
                attempt.fail(msg)


def _point_to_point(attempt: Attempt) -> None:
    seed = fresh_seed()
    for world, shape in ((3, (10,)), (4, (16,))):
        result = attempt.run(_traffic_worker, world, (attempt.fn, shape, seed), trace=True,
                             context=f"{shape[0]} float32 elements", timeout=TIMEOUT_TRAFFIC)
        if not all(result):
            attempt.fail(f"on {world} ranks the sum was wrong once built-in collectives were disabled.")
        idle = silent_ranks(result, ("sent",))
        if idle:
            attempt.fail(f"on {world} ranks, rank {idle[0][0]} sent no message with send/isend, yet the sum "
                         "came out right: the data must travel by point-to-point calls.")


def _bandwidth(attempt: Attempt) -> None:
    seed = fresh_seed()
    for world, n in ((3, 10), (4, 1000), (5, 12)):
        result = attempt.run(_traffic_worker, world, (attempt.fn, (n,), seed), trace=True,
                             context=f"{n} float32 elements", timeout=TIMEOUT_TRAFFIC)
        if not all(result):
            attempt.fail(f"on {world} ranks with {n} elements the sum was wrong.")
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
            if row["sent_messages"] != want_msgs or elems > max_elems:
                attempt.fail(
                    f"on {world} ranks with {n} elements, rank {rank} sent {row['sent_messages']} messages "
                    f"carrying {elems} elements; a bandwidth-optimal ring sends exactly 2(p-1) = {want_msgs} "
                    f"messages of at most ceil(n/p) = {chunk} elements (at most {max_elems} elements in all). "
                    f"Passing the whole tensor round the ring sends (p-1) x n = {(world - 1) * n}: split it "
                    "into p chunks, reduce-scatter, then all-gather."
                )


def _no_hang(attempt: Attempt) -> None:
    seed = fresh_seed()
    for world in (2, 3, 4, 5):
        attempt.run(_traffic_worker, world, (attempt.fn, (7,), seed), timeout=TIMEOUT_NO_HANG,
                    context="7 float32 elements")


def _self_check(attempt: Attempt) -> str:
    _correct(attempt, SELF_CHECK_CASES, timeout=10.0)
    return ("Self-check passed: correct sums on 2 and 3 ranks, with the built-in collectives switched "
            "off, including 10 elements over 3 ranks and fewer elements than ranks. The hidden tests also "
            "check world sizes up to 8, float64, several dimensions, and the messages and bytes each rank sends.")


exercise_4_1 = Exercise(
    number="4.1",
    function="ring_allreduce",
    title="ring all-reduce",
    parts=(
        Part("correct", 4, "the right sums on 1-8 ranks, uneven and tiny sizes, 3 dtypes, several shapes.",
             _correct),
        Part("point_to_point", 2, "still correct with every built-in collective disabled; data moves by send/recv.",
             _point_to_point),
        Part("bandwidth", 3, "each rank sends exactly 2(p-1) messages of at most ceil(n/p) elements.", _bandwidth),
        Part("no_hang", 1, "finishes promptly on 2, 3, 4 and 5 ranks (no deadlock for odd or even world sizes).",
             _no_hang),
    ),
    visible_check=_self_check,
    forbid=DATA_COLLECTIVES,
    forbid_reason="exercise 4.1 asks you to build all_reduce yourself, from send, recv, isend and irecv",
)

EXERCISES = (exercise_4_1,)
