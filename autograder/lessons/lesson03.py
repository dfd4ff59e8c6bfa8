"""Lesson 03's graded exercises: broadcast (3.1) and all-gather (3.2) from point-to-point calls,
and a hierarchical all-reduce (3.3) made of collectives on subgroups.

Exercise 3.1, ``my_broadcast(tensor, src)``: afterwards every rank of the default group
holds rank ``src``'s values in ``tensor`` (filled in place; ``src``'s own tensor is left
as it was), like ``dist.broadcast(tensor, src)``.

Exercise 3.2, ``my_all_gather(tensor_list, tensor)``: afterwards ``tensor_list[i]`` holds
rank ``i``'s ``tensor`` on every rank; the tensors already in the list are filled in place
and ``tensor`` is left as it was, like ``dist.all_gather(tensor_list, tensor)``.

Both with point-to-point calls only, for 1 to 6 ranks, any contiguous shape, several
dtypes.

Exercise 3.3, ``hierarchical_all_reduce(tensor, ranks_per_node)``: sums ``tensor`` in place
over all ranks, as ``dist.all_reduce(tensor)`` would, in three collectives on subgroups
made with ``dist.new_group``: ``reduce`` within each node (blocks of ``ranks_per_node``
consecutive ranks) to its leader (the node's lowest rank), ``all_reduce`` among the
leaders, ``broadcast`` from each leader within its node. Unlike 3.1 and 3.2 it uses the
built-in collectives; the trace shows which ones, on which groups.

Hidden test cells (one per part) and the visible self-checks::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("3.1", my_broadcast, "correct")     # also "point_to_point", "no_hang"
    grade("3.2", my_all_gather, "correct")    # also "point_to_point", "no_hang"
    grade("3.3", hierarchical_all_reduce, "correct")   # also "hierarchy"
    exercise("3.1").self_check(my_broadcast)           # 2 and 3 ranks
    exercise("3.2").self_check(my_all_gather)
    exercise("3.3").self_check(hierarchical_all_reduce)   # 4 ranks on 2 nodes

Example (a broadcast that leaves every tensor alone is caught)::

    >>> from autograder.kit.exercise import GradingFailure
    >>> try:
    ...     exercise_3_1.self_check(lambda tensor, src: None)
    ... except GradingFailure as err:
    ...     print(str(err).splitlines()[0])
    self-check: on 2 ranks, broadcasting a int64 tensor of shape (3,) from src=1, rank 0: first wrong element at flat index ...
"""

from __future__ import annotations

from typing import Any, Callable

from helpers import DATA_COLLECTIVES

from ..kit.exercise import Attempt, Exercise, Part, fresh_seed
from ..kit.pieces import by_world_size, first_difference, plural, seeded_tensor

__all__ = ["EXERCISES", "exercise_3_1", "exercise_3_2", "exercise_3_3", "BROADCAST_CASES", "ALL_GATHER_CASES",
           "HIERARCHY_CASES"]

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
        Part("correct", 2, "src's values on every rank, 1 to 6 ranks, every src, several dtypes and shapes."),
        Part("point_to_point", 1, "collectives switched off; src must send and every other rank receive."),
        Part("no_hang", 1, "no hang, every rank as src in turn, 2 to 6 ranks."),
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
        Part("correct", 2, "every rank's tensor in every slot, 1 to 6 ranks, several dtypes and shapes."),
        Part("point_to_point", 1, "collectives switched off; every rank must send and receive."),
        Part("no_hang", 1, "no hang, 2 to 6 ranks, three calls in a row."),
    ),
    visible_check=_all_gather_self_check,
    forbid=DATA_COLLECTIVES,
    forbid_reason="exercise 3.2 asks you to build all_gather yourself, from send, recv, isend and irecv",
)


# -- Exercise 3.3: a hierarchical all-reduce on subgroups -------------------------------------

# (world size, ranks per node): one node, one rank per node, two to four nodes.
HIERARCHY_CASES = [(1, 1), (2, 2), (4, 1), (4, 2), (6, 3), (8, 2)]
HIERARCHY_TENSORS = [((5,), "float32"), ((2, 3), "int64"), ((4,), "float64")]
HIERARCHY_TRACED = ((4, 2), (6, 3), (6, 2))
HIERARCHY_SELF_CHECK = [(2, 2), (4, 2)]


def _hierarchy_worker(rank: int, world_size: int, fn: Callable, ranks_per_node: int, cases: list,
                      seed: int) -> list[dict]:
    out = []
    for i, (shape, dtype_name) in enumerate(cases):
        tensor = seeded_tensor(shape, dtype_name, seed + i, rank, int_range=(-50, 50))
        expected = sum(seeded_tensor(shape, dtype_name, seed + i, r, int_range=(-50, 50)) for r in range(world_size))
        before = tensor.data_ptr()
        fn(tensor, ranks_per_node)
        row: dict[str, Any] = {"shape": shape, "dtype": dtype_name, "why": None}
        if tensor.data_ptr() != before:
            row["why"] = ("the tensor's memory was replaced: sum into the tensor you were given (the collectives "
                          "all work in place)")
        else:
            diff = first_difference(tensor, expected, tolerance=1e-4 if dtype_name == "float32" else 1e-9)
            row["why"] = str(diff) if diff else None
        out.append(row)
    return out


def _hierarchy_run(attempt: Attempt, world: int, m: int, cases: list, trace: bool = False):
    result = attempt.run(_hierarchy_worker, world, (attempt.fn, m, cases, fresh_seed()), timeout=10.0,
                         trace=trace, nnodes=world // m, context=f"ranks_per_node={m}")
    _first_failure(attempt, world, list(result),
                   lambda row: f"ranks_per_node={m}, summing {row['dtype']} tensors of shape {row['shape']}")
    return result


def _hierarchy_correct(attempt: Attempt, cases: list = HIERARCHY_CASES) -> None:
    for world, m in cases:
        _hierarchy_run(attempt, world, m, HIERARCHY_TENSORS)


def _hierarchy_calls(attempt: Attempt, cases: tuple = HIERARCHY_TRACED) -> None:
    """From the trace: reduce on the node's group to its leader, all_reduce among leaders, broadcast back."""
    for world, m in cases:
        result = _hierarchy_run(attempt, world, m, [((6,), "float32")], trace=True)
        leaders = list(range(0, world, m))
        where = f"on {world} ranks with ranks_per_node={m}"
        for rank in range(world):
            first = rank - rank % m
            node = list(range(first, first + m))
            events = result.trace.for_rank(rank)
            if any(e.is_p2p for e in events):
                attempt.fail(f"{where}, rank {rank} sent or received point-to-point messages: move the data with "
                             "the three collectives only (reduce, all_reduce, broadcast).")
            calls = [e for e in events if e.op in DATA_COLLECTIVES]
            for e in calls:
                if e.op not in ("reduce", "all_reduce", "broadcast"):
                    continue
                wanted, name = (leaders, "the leaders' group") if e.op == "all_reduce" else (node, "the node's group")
                if e.group != wanted:
                    group = "the whole world (the default group)" if e.group is None else f"the group {e.group}"
                    attempt.fail(f"{where}, rank {rank} called {e.op} on {group}; its {e.op} belongs on {name}, "
                                 f"{wanted}. Make the groups with dist.new_group and pass them as group=.")
            ops = [e.op for e in calls]
            want = ["reduce", "all_reduce", "broadcast"] if rank == first else ["reduce", "broadcast"]
            if ops != want:
                attempt.fail(f"{where}, rank {rank} (" + ("its node's leader" if rank == first else f"led by rank {first}")
                             + f") called {', '.join(ops) or 'no collective'}; it should call "
                             f"{', then '.join(want)}: reduce to the leader within the node, all_reduce among the "
                             "leaders only, broadcast from the leader within the node.")
            for e in calls:
                if e.op in ("reduce", "broadcast") and e.peer != first:
                    word = "dst" if e.op == "reduce" else "src"
                    attempt.fail(f"{where}, rank {rank} called {e.op} with {word}={e.peer}; its node's leader is "
                                 f"rank {first} (the node's lowest rank, a global rank number).")


def _hierarchy_self_check(attempt: Attempt) -> str:
    _hierarchy_correct(attempt, HIERARCHY_SELF_CHECK)
    _hierarchy_calls(attempt, ((4, 2),))
    return ("Self-check passed: hierarchical_all_reduce sums correctly on 2 ranks (one node) and on 4 ranks "
            "(two nodes of 2), and the trace shows reduce within each node, all_reduce among the leaders and "
            "broadcast within each node. The hidden tests also try 1 to 8 ranks with 1 to 4 ranks per node "
            "and check the calls on 6 ranks.")


exercise_3_3 = Exercise(
    number="3.3",
    function="hierarchical_all_reduce",
    title="a hierarchical all-reduce on subgroups",
    parts=(
        Part("correct", 2, "the sum on every rank, in place, 1 to 8 ranks, 1 to 4 ranks per node, 3 dtypes."),
        Part("hierarchy", 2, "the trace shows reduce to each node's leader, all_reduce among the leaders only, "
             "broadcast within each node."),
    ),
    visible_check=_hierarchy_self_check,
)

EXERCISES = (exercise_3_1, exercise_3_2, exercise_3_3)
