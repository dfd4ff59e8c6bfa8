"""Lesson 03's graded exercises: broadcast (3.1) and all-gather (3.2) from point-to-point calls.

Exercise 3.1, ``my_broadcast(tensor, src)``: afterwards every rank of the default group
holds rank ``src``'s values in ``tensor`` (filled in place; ``src``'s own tensor is left
as it was), like ``dist.broadcast(tensor, src)``.

Exercise 3.2, ``my_all_gather(tensor_list, tensor)``: afterwards ``tensor_list[i]`` holds
rank ``i``'s ``tensor`` on every rank; the tensors already in the list are filled in place
and ``tensor`` is left as it was, like ``dist.all_gather(tensor_list, tensor)``.

Both with point-to-point calls only, for 1 to 6 ranks, any contiguous shape, several
dtypes. Hidden test cells (three parts each) and the visible self-checks::

    from autograder import exercise
    exercise("3.1").grade(my_broadcast, "correct")     # also "point_to_point", "no_hang"
    exercise("3.2").grade(my_all_gather, "correct")    # also "point_to_point", "no_hang"
    exercise("3.1").self_check(my_broadcast)           # 2 and 3 ranks
    exercise("3.2").self_check(my_all_gather)

Example (a broadcast that leaves every tensor alone is caught)::

    >>> from autograder.kit import GradingFailure
    >>> try:
    ...     exercise_3_1.self_check(lambda tensor, src: None)
    ... except GradingFailure as err:
    ...     print(str(err).splitlines()[0])
    self-check: on 2 ranks, broadcasting a int64 tensor of shape (3,) from src=1, rank 0: first wrong element at flat index 0
"""

from __future__ import annotations

from typing import Any, Callable

from helpers import DATA_COLLECTIVES

from .kit import Attempt, Exercise, Part, by_world_size, first_difference, fresh_seed, plural, seeded_tensor, silent_ranks

__all__ = ["EXERCISES", "exercise_3_1", "exercise_3_2", "BROADCAST_CASES", "ALL_GATHER_CASES"]

# (world size, src, shape, dtype name): every world size, first/last/middle sources.
BROADCAST_CASES = [
    (1, 0, (4,), "float32"),
    (2, 0, (1,), "float32"),
    (2, 1, (6,), "int64"),
    (3, 0, (2, 3), "float64"),
    (3, 2, (5,), "int32"),
    (3, 1, (3,), "float32"),
    (4, 1, (17,), "float32"),
    (4, 3, (2, 2, 2), "int64"),
    (5, 2, (7,), "float64"),
    (5, 4, (3,), "uint8"),
    (5, 0, (1,), "int64"),
    (6, 5, (100,), "float32"),
    (6, 0, (4, 4), "int64"),
    (6, 3, (1,), "float64"),
]
# (world size, shape, dtype name)
ALL_GATHER_CASES = [
    (1, (3,), "float32"),
    (2, (1,), "float32"),
    (2, (4,), "int64"),
    (3, (2, 3), "float64"),
    (3, (5,), "int32"),
    (4, (10,), "float32"),
    (4, (2, 2), "int64"),
    (5, (7,), "float64"),
    (5, (3,), "uint8"),
    (6, (1,), "float32"),
    (6, (4, 5), "int64"),
]
BROADCAST_SELF_CHECK = [(2, 0, (4,), "float32"), (2, 1, (3,), "int64"),
                        (3, 0, (2, 3), "float32"), (3, 1, (5,), "float32"), (3, 2, (1,), "int64")]
ALL_GATHER_SELF_CHECK = [(2, (4,), "float32"), (2, (2, 2), "int64"), (3, (3,), "float32"), (3, (1,), "float64")]


def _first_failure(attempt: Attempt, world: int, result: list, describe: Callable[[dict], str]) -> None:
    """Fail on the first row (in rank order) whose ``why`` is set; ``describe`` words its case."""
    for rank, rows in enumerate(result):
        for row in rows:
            if row["why"]:
                attempt.fail(f"on {plural(world, 'rank')}, {describe(row)}, rank {rank}: {row['why']}.")


# -- Exercise 3.1: broadcast ------------------------------------------------------------


def _broadcast_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    out = []
    for i, (src, shape, dtype_name) in enumerate(cases):
        original = seeded_tensor(shape, dtype_name, seed + i, rank)
        tensor = original.clone()
        expected = seeded_tensor(shape, dtype_name, seed + i, src)
        before = tensor.data_ptr()
        fn(tensor, src)
        row: dict[str, Any] = {"src": src, "shape": shape, "dtype": dtype_name, "why": None}
        if tensor.data_ptr() != before:
            row["why"] = ("the tensor's memory was replaced: fill the tensor you were given in place "
                          "(recv straight into it, or tensor.copy_(...))")
        else:
            diff = first_difference(tensor, expected)
            why = str(diff) if diff else None
            if why and rank == src:
                why = "the source rank's own tensor changed: " + why
            elif why and first_difference(tensor, original) is None:
                why += ("\n  (the tensor still holds this rank's own values: did it receive into another "
                        "tensor, or rebind the name `tensor`? Fill the tensor you were given.)")
            row["why"] = why
        out.append(row)
    return out


def _broadcast_case(row: dict) -> str:
    return f"broadcasting a {row['dtype']} tensor of shape {row['shape']} from src={row['src']}"


def _broadcast_correct(attempt: Attempt, cases: list = BROADCAST_CASES) -> None:
    seed = fresh_seed()
    for world, group_cases in by_world_size(cases):
        result = attempt.run(_broadcast_worker, world, (attempt.fn, group_cases, seed), timeout=10.0)
        _first_failure(attempt, world, list(result), _broadcast_case)


def _broadcast_point_to_point(attempt: Attempt) -> None:
    for world, src in ((3, 1), (4, 2), (5, 0)):
        result = attempt.run(_broadcast_worker, world, (attempt.fn, [(src, (8,), "float32")], fresh_seed()),
                             trace=True, timeout=8.0, context=f"src={src}")
        _first_failure(attempt, world, list(result), _broadcast_case)
        if silent_ranks(result, ("sent",), [src]):
            attempt.fail(f"on {world} ranks with src={src}, the source rank sent no point-to-point "
                         "message: its values must leave it by send/isend.")
        deaf = silent_ranks(result, ("received",), [r for r in range(world) if r != src])
        if deaf:
            attempt.fail(f"on {world} ranks with src={src}, rank {deaf[0][0]} received no point-to-point "
                         "message, yet its tensor came out right: every other rank must receive the values.")


def _broadcast_no_hang(attempt: Attempt) -> None:
    seed = fresh_seed()
    for world in (2, 3, 4, 5, 6):
        # Every rank takes its turn as the source, back to back on the same group.
        cases = [(src, (5,), "float32") for src in range(world)]
        result = attempt.run(_broadcast_worker, world, (attempt.fn, cases, seed), timeout=10.0,
                             context=f"{world} broadcasts in a row, src = 0 to {world - 1}")
        _first_failure(attempt, world, list(result), _broadcast_case)


def _broadcast_self_check(attempt: Attempt) -> str:
    _broadcast_correct(attempt, BROADCAST_SELF_CHECK)
    return ("Self-check passed: my_broadcast is right on 2 and 3 ranks from every src, with the built-in "
            "collectives switched off. The hidden tests also try 1 to 6 ranks, more dtypes and shapes, count "
            "the messages, and make many calls in a row.")


exercise_3_1 = Exercise(
    number="3.1",
    function="my_broadcast",
    title="broadcast from point-to-point messages",
    parts=(
        Part("correct", 2, "src's values on every rank, 1 to 6 ranks, every src, several dtypes and shapes.",
             _broadcast_correct),
        Part("point_to_point", 1, "collectives switched off; src must send and every other rank receive.",
             _broadcast_point_to_point),
        Part("no_hang", 1, "no hang, every rank as src in turn, 2 to 6 ranks.", _broadcast_no_hang),
    ),
    visible_check=_broadcast_self_check,
    forbid=DATA_COLLECTIVES,
    forbid_reason="exercise 3.1 asks you to build broadcast yourself, from send, recv, isend and irecv",
)


# -- Exercise 3.2: all-gather -----------------------------------------------------------


def _all_gather_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    import torch

    out = []
    for i, (shape, dtype_name) in enumerate(cases):
        tensor = seeded_tensor(shape, dtype_name, seed + i, rank)
        original = tensor.clone()
        expected = [seeded_tensor(shape, dtype_name, seed + i, r) for r in range(world_size)]
        # Fill the slots with a value no rank holds, so a slot left alone shows up.
        dtype = getattr(torch, dtype_name)
        tensor_list = [torch.full(shape, 77 if dtype_name == "uint8" else -7777, dtype=dtype) for _ in range(world_size)]
        slots = list(tensor_list)
        fn(tensor_list, tensor)
        row: dict[str, Any] = {"shape": shape, "dtype": dtype_name, "why": None}
        if len(tensor_list) != world_size:
            row["why"] = f"tensor_list has {len(tensor_list)} entries afterwards instead of {world_size}"
        elif any(a is not b for a, b in zip(tensor_list, slots)):
            j = next(k for k, (a, b) in enumerate(zip(tensor_list, slots)) if a is not b)
            row["why"] = (f"tensor_list[{j}] was replaced by another tensor: fill the tensors already in the "
                          f"list in place (recv straight into tensor_list[{j}], or tensor_list[{j}].copy_(...))")
        elif first_difference(tensor, original):
            row["why"] = f"the input tensor changed: {first_difference(tensor, original)}"
        else:
            for j in range(world_size):
                diff = first_difference(tensor_list[j], expected[j])
                if diff:
                    row["why"] = f"tensor_list[{j}] should hold rank {j}'s tensor; {diff}"
                    break
        out.append(row)
    return out


def _all_gather_case(row: dict) -> str:
    return f"gathering {row['dtype']} tensors of shape {row['shape']}"


def _all_gather_correct(attempt: Attempt, cases: list = ALL_GATHER_CASES) -> None:
    seed = fresh_seed()
    for world, group_cases in by_world_size(cases):
        result = attempt.run(_all_gather_worker, world, (attempt.fn, group_cases, seed), timeout=10.0)
        _first_failure(attempt, world, list(result), _all_gather_case)


def _all_gather_point_to_point(attempt: Attempt) -> None:
    for world in (2, 3, 4):
        result = attempt.run(_all_gather_worker, world, (attempt.fn, [((6,), "float32")], fresh_seed()),
                             trace=True, timeout=8.0)
        _first_failure(attempt, world, list(result), _all_gather_case)
        quiet = silent_ranks(result)
        if quiet:
            rank, what = quiet[0]
            attempt.fail(f"on {world} ranks, rank {rank} {what} no point-to-point message: every rank's "
                         "tensor must reach every other rank by send/recv (or isend/irecv).")


def _all_gather_no_hang(attempt: Attempt) -> None:
    seed = fresh_seed()
    for world in (2, 3, 4, 5, 6):
        cases = [((3,), "float32"), ((2,), "int64"), ((4,), "float64")]
        result = attempt.run(_all_gather_worker, world, (attempt.fn, cases, seed), timeout=10.0,
                             context="three calls in a row")
        _first_failure(attempt, world, list(result), _all_gather_case)


def _all_gather_self_check(attempt: Attempt) -> str:
    _all_gather_correct(attempt, ALL_GATHER_SELF_CHECK)
    return ("Self-check passed: my_all_gather is right on 2 and 3 ranks, with the built-in collectives "
            "switched off. The hidden tests also try 1 to 6 ranks, more dtypes and shapes, count the "
            "messages, and make several calls in a row.")


exercise_3_2 = Exercise(
    number="3.2",
    function="my_all_gather",
    title="all-gather from point-to-point messages",
    parts=(
        Part("correct", 2, "every rank's tensor in every slot, 1 to 6 ranks, several dtypes and shapes.",
             _all_gather_correct),
        Part("point_to_point", 1, "collectives switched off; every rank must send and receive.",
             _all_gather_point_to_point),
        Part("no_hang", 1, "no hang, 2 to 6 ranks, three calls in a row.", _all_gather_no_hang),
    ),
    visible_check=_all_gather_self_check,
    forbid=DATA_COLLECTIVES,
    forbid_reason="exercise 3.2 asks you to build all_gather yourself, from send, recv, isend and irecv",
)

EXERCISES = (exercise_3_1, exercise_3_2)
