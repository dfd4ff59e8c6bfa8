"""Hidden-test checks for lesson 03: the learner's ``my_broadcast`` and ``my_all_gather``.

Exercise 3.1, ``my_broadcast(tensor, src)``: afterwards every rank of the default group
holds rank ``src``'s values in ``tensor`` (filled in place; ``src``'s own tensor is left
as it was), like ``dist.broadcast(tensor, src)``.

Exercise 3.2, ``my_all_gather(tensor_list, tensor)``: afterwards ``tensor_list[i]`` holds
rank ``i``'s ``tensor`` on every rank; the tensors already in the list are filled in place
and ``tensor`` is left as it was, like ``dist.all_gather(tensor_list, tensor)``.

Both with point-to-point calls only, for 1 to 6 ranks, any contiguous shape, several
dtypes. Each is graded in three parts, each its own hidden test cell::

    check_my_broadcast(my_broadcast, part="correct")         # also "point_to_point", "no_hang"
    check_my_all_gather(my_all_gather, part="correct")       # also "point_to_point", "no_hang"

``self_check_broadcast(my_broadcast)`` and ``self_check_all_gather(my_all_gather)`` are the
visible checks: 2 and 3 ranks, with messages a learner can act on.
"""

from __future__ import annotations

from typing import Any, Callable

from .harness import COLLECTIVES, GradingFailure, fresh_seed, grade_part, require_function, run_ranks

__all__ = [
    "check_my_broadcast",
    "check_my_all_gather",
    "self_check_broadcast",
    "self_check_all_gather",
    "PARTS",
    "FORBIDDEN",
    "BROADCAST_CASES",
    "ALL_GATHER_CASES",
]

PARTS = ("correct", "point_to_point", "no_hang")
FORBIDDEN = COLLECTIVES  # the object collectives included

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


def _make(shape: tuple, dtype_name: str, seed: int, rank: int):
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype_name in ("int64", "int32"):
        return torch.randint(-1000, 1000, shape, generator=g).to(getattr(torch, dtype_name))
    if dtype_name == "uint8":
        return torch.randint(0, 256, shape, generator=g).to(torch.uint8)
    return (torch.randn(shape, generator=g) * 10).to(getattr(torch, dtype_name))


def _compare(actual, expected) -> str | None:
    """None when equal; else a short description of the first difference."""

    if tuple(actual.shape) != tuple(expected.shape):
        return f"its shape became {tuple(actual.shape)} instead of {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"its dtype became {actual.dtype} instead of {expected.dtype}"
    bad = actual != expected
    if bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0])
        a, e = actual.reshape(-1), expected.reshape(-1)
        return (f"first wrong element at flat index {i}\n  expected {e[max(0, i - 2): i + 6].tolist()}\n"
                f"  actual   {a[max(0, i - 2): i + 6].tolist()}")
    return None


# -- Exercise 3.1: broadcast ------------------------------------------------------------


def _broadcast_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    out = []
    for i, (src, shape, dtype_name) in enumerate(cases):
        original = _make(shape, dtype_name, seed + i, rank)
        tensor = original.clone()
        expected = _make(shape, dtype_name, seed + i, src)
        before = tensor.data_ptr()
        fn(tensor, src)
        row: dict[str, Any] = {"src": src, "shape": shape, "dtype": dtype_name, "why": None}
        if tensor.data_ptr() != before:
            row["why"] = ("the tensor's memory was replaced: fill the tensor you were given in place "
                          "(recv straight into it, or tensor.copy_(...))")
        else:
            why = _compare(tensor, expected)
            if why and rank == src:
                why = "the source rank's own tensor changed: " + why
            elif why and _compare(tensor, original) is None:
                why += ("\n  (the tensor still holds this rank's own values: did it receive into another "
                        "tensor, or rebind the name `tensor`? Fill the tensor you were given.)")
            row["why"] = why
        out.append(row)
    return out


def _broadcast_failures(part: str, world: int, result: list) -> None:
    for rank, rows in enumerate(result):
        for row in rows:
            if row["why"]:
                raise GradingFailure(
                    f"{part}: on {world} rank{'s' if world > 1 else ''}, broadcasting a {row['dtype']} tensor "
                    f"of shape {row['shape']} from src={row['src']}, rank {rank}: {row['why']}."
                )


def _by_world(cases: list) -> dict[int, list]:
    grouped: dict[int, list] = {}
    for world, *rest in cases:
        grouped.setdefault(world, []).append(tuple(rest))
    return grouped


def _broadcast_correct(fn: Callable, cases: list, part: str, timeout: float = 10.0) -> None:
    seed = fresh_seed()
    for world, group_cases in sorted(_by_world(cases).items()):
        result = run_ranks(part, _broadcast_worker, world, (fn, group_cases, seed), timeout=timeout)
        _broadcast_failures(part, world, list(result))


def _broadcast_p2p(fn: Callable) -> None:
    part = "point_to_point"
    for world, src in ((3, 1), (4, 2), (5, 0)):
        result = run_ranks(part, _broadcast_worker, world, (fn, [(src, (8,), "float32")], fresh_seed()),
                           forbid=FORBIDDEN, trace=True, timeout=8.0, context=f"src={src}")
        _broadcast_failures(part, world, list(result))
        summary = result.trace.summary()
        if summary[src]["sent_messages"] == 0:
            raise GradingFailure(
                f"{part}: on {world} ranks with src={src}, the source rank sent no point-to-point "
                "message: its values must leave it by send/isend."
            )
        for rank in range(world):
            if rank != src and summary[rank]["recv_messages"] == 0:
                raise GradingFailure(
                    f"{part}: on {world} ranks with src={src}, rank {rank} received no point-to-point "
                    "message, yet its tensor came out right: every other rank must receive the values."
                )


def _broadcast_no_hang(fn: Callable) -> None:
    part = "no_hang"
    seed = fresh_seed()
    for world in (2, 3, 4, 5, 6):
        # Every rank takes its turn as the source, back to back on the same group.
        cases = [(src, (5,), "float32") for src in range(world)]
        result = run_ranks(part, _broadcast_worker, world, (fn, cases, seed), timeout=10.0,
                           context=f"{world} broadcasts in a row, src = 0 to {world - 1}")
        _broadcast_failures(part, world, list(result))


def check_my_broadcast(fn: Any, part: str) -> None:
    """Grade one part of Exercise 3.1; raises GradingFailure with feedback."""
    fn = require_function(fn, "my_broadcast", "Exercise 3.1")
    grade_part(part, {
        "correct": lambda: _broadcast_correct(fn, BROADCAST_CASES, part),
        "point_to_point": lambda: _broadcast_p2p(fn),
        "no_hang": lambda: _broadcast_no_hang(fn),
    })


def self_check_broadcast(fn: Any) -> None:
    """The visible check for Exercise 3.1: 2 and 3 ranks, every src."""
    fn = require_function(fn, "my_broadcast", "Exercise 3.1")
    cases = [(2, 0, (4,), "float32"), (2, 1, (3,), "int64"),
             (3, 0, (2, 3), "float32"), (3, 1, (5,), "float32"), (3, 2, (1,), "int64")]
    _broadcast_correct(fn, cases, "self-check", timeout=10.0)
    print("Self-check passed: my_broadcast is right on 2 and 3 ranks from every src. The hidden tests "
          "also try 1 to 6 ranks, more dtypes and shapes, collectives disabled, and many calls in a row.")


# -- Exercise 3.2: all-gather -----------------------------------------------------------


def _all_gather_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    import torch

    out = []
    for i, (shape, dtype_name) in enumerate(cases):
        tensor = _make(shape, dtype_name, seed + i, rank)
        original = tensor.clone()
        expected = [_make(shape, dtype_name, seed + i, r) for r in range(world_size)]
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
        elif _compare(tensor, original):
            row["why"] = "the input tensor changed: " + _compare(tensor, original)
        else:
            for j in range(world_size):
                why = _compare(tensor_list[j], expected[j])
                if why:
                    row["why"] = f"tensor_list[{j}] should hold rank {j}'s tensor; " + why
                    break
        out.append(row)
    return out


def _all_gather_failures(part: str, world: int, result: list) -> None:
    for rank, rows in enumerate(result):
        for row in rows:
            if row["why"]:
                raise GradingFailure(
                    f"{part}: on {world} rank{'s' if world > 1 else ''}, gathering {row['dtype']} tensors "
                    f"of shape {row['shape']}, rank {rank}: {row['why']}."
                )


def _all_gather_correct(fn: Callable, cases: list, part: str, timeout: float = 10.0) -> None:
    seed = fresh_seed()
    for world, group_cases in sorted(_by_world(cases).items()):
        result = run_ranks(part, _all_gather_worker, world, (fn, group_cases, seed), timeout=timeout)
        _all_gather_failures(part, world, list(result))


def _all_gather_p2p(fn: Callable) -> None:
    part = "point_to_point"
    for world in (2, 3, 4):
        result = run_ranks(part, _all_gather_worker, world, (fn, [((6,), "float32")], fresh_seed()),
                           forbid=FORBIDDEN, trace=True, timeout=8.0)
        _all_gather_failures(part, world, list(result))
        summary = result.trace.summary()
        for rank in range(world):
            row = summary[rank]
            if row["sent_messages"] == 0 or row["recv_messages"] == 0:
                what = "sent" if row["sent_messages"] == 0 else "received"
                raise GradingFailure(
                    f"{part}: on {world} ranks, rank {rank} {what} no point-to-point message: every rank's "
                    "tensor must reach every other rank by send/recv (or isend/irecv)."
                )


def _all_gather_no_hang(fn: Callable) -> None:
    part = "no_hang"
    seed = fresh_seed()
    for world in (2, 3, 4, 5, 6):
        cases = [((3,), "float32"), ((2,), "int64"), ((4,), "float64")]
        result = run_ranks(part, _all_gather_worker, world, (fn, cases, seed), timeout=10.0,
                           context="three calls in a row")
        _all_gather_failures(part, world, list(result))


def check_my_all_gather(fn: Any, part: str) -> None:
    """Grade one part of Exercise 3.2; raises GradingFailure with feedback."""
    fn = require_function(fn, "my_all_gather", "Exercise 3.2")
    grade_part(part, {
        "correct": lambda: _all_gather_correct(fn, ALL_GATHER_CASES, part),
        "point_to_point": lambda: _all_gather_p2p(fn),
        "no_hang": lambda: _all_gather_no_hang(fn),
    })


def self_check_all_gather(fn: Any) -> None:
    """The visible check for Exercise 3.2: 2 and 3 ranks."""
    fn = require_function(fn, "my_all_gather", "Exercise 3.2")
    cases = [(2, (4,), "float32"), (2, (2, 2), "int64"), (3, (3,), "float32"), (3, (1,), "float64")]
    _all_gather_correct(fn, cases, "self-check", timeout=10.0)
    print("Self-check passed: my_all_gather is right on 2 and 3 ranks. The hidden tests also try "
          "1 to 6 ranks, more dtypes and shapes, collectives disabled, and several calls in a row.")
