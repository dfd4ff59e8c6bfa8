"""Hidden-test checks for lesson 04: the learner's ``ring_allreduce(tensor)``.

The exercise: sum ``tensor`` in place over all ranks of the default group, as
``dist.all_reduce(tensor)`` would, with point-to-point calls only, bandwidth-optimally
(each rank sends 2(p-1) messages of at most ceil(n/p) elements), for any world size
from 1 to 8, any number of elements, float32, float64 and int64, any contiguous shape.

Graded in four parts, each its own hidden test cell::

    check_ring_allreduce(ring_allreduce, part="correct")
    check_ring_allreduce(ring_allreduce, part="point_to_point")
    check_ring_allreduce(ring_allreduce, part="bandwidth")
    check_ring_allreduce(ring_allreduce, part="no_hang")

``self_check(ring_allreduce)`` is the visible check learners run: a few cases on 2 and 3
ranks with messages they can act on.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .harness import COLLECTIVES, GradingFailure, fresh_seed, grade_part, require_function, run_ranks

__all__ = ["check_ring_allreduce", "self_check", "CASES", "PARTS"]

PARTS = ("correct", "point_to_point", "bandwidth", "no_hang")
# Seconds one launch may take before it counts as a hang. A correct ring finishes each in
# well under a second, but on a busy shared machine a launch has been seen to stall for 5 s
# (once 10 s) while gloo sets up, at any world size; that time counts against these limits.
# They leave room for it: only a hanging submission ever waits them out.
TIMEOUT_CORRECT = 10.0
TIMEOUT_TRAFFIC = 8.0
TIMEOUT_NO_HANG = 6.0
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


def _make(shape: tuple, dtype_name: str, seed: int, rank: int):
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype_name == "int64":
        return torch.randint(-50, 50, shape, generator=g, dtype=torch.int64)
    return (torch.randn(shape, generator=g) * 10).to(getattr(torch, dtype_name))


def _correct_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    """Run every case for this world size; compare with a single-process reference."""
    import torch

    out = []
    for i, (shape, dtype_name) in enumerate(cases):
        tensor = _make(shape, dtype_name, seed + i, rank)
        expected = sum(_make(shape, dtype_name, seed + i, r) for r in range(world_size))
        before = tensor.data_ptr()
        fn(tensor)
        row: dict[str, Any] = {"shape": shape, "dtype": dtype_name, "ok": True}
        if tensor.data_ptr() != before or tuple(tensor.shape) != tuple(shape):
            row.update(ok=False, why="the tensor was replaced or reshaped instead of being summed in place")
        elif tensor.dtype != expected.dtype:
            row.update(ok=False, why=f"the tensor's dtype changed to {tensor.dtype}")
        else:
            tol = 1e-4 if dtype_name == "float32" else 1e-9
            bad = ~torch.isclose(tensor.double(), expected.double(), rtol=tol, atol=tol) if dtype_name != "int64" else tensor != expected
            if bool(bad.any()):
                index = int(bad.reshape(-1).nonzero()[0])
                row.update(
                    ok=False,
                    why=f"first wrong element at flat index {index}",
                    expected=expected.reshape(-1)[max(0, index - 2): index + 6].tolist(),
                    actual=tensor.reshape(-1)[max(0, index - 2): index + 6].tolist(),
                )
        out.append(row)
    return out


def _traffic_worker(rank: int, world_size: int, fn: Callable, shape: tuple, seed: int) -> bool:
    import torch

    tensor = _make(shape, "float32", seed, rank)
    expected = sum(_make(shape, "float32", seed, r) for r in range(world_size))
    fn(tensor)
    return bool(torch.allclose(tensor, expected, rtol=1e-4, atol=1e-4))


def _by_world(cases: list) -> dict[int, list]:
    grouped: dict[int, list] = {}
    for world, shape, dtype in cases:
        grouped.setdefault(world, []).append((shape, dtype))
    return grouped


def _check_correct(fn: Callable, cases: list, part: str, timeout: float = TIMEOUT_CORRECT) -> None:
    seed = fresh_seed()
    for world, group_cases in sorted(_by_world(cases).items()):
        result = run_ranks(part, _correct_worker, world, (fn, group_cases, seed), timeout=timeout)
        for rank, rows in enumerate(result):
            for row in rows:
                if not row["ok"]:
                    n = math.prod(row["shape"])
                    msg = (
                        f"{part}: on {world} rank{'s' if world > 1 else ''}, a {row['dtype']} tensor of "
                        f"shape {row['shape']} ({n} element{'s' if n != 1 else ''}), rank {rank}: {row['why']}."
                    )
                    if "expected" in row:
                        msg += f"\n  expected {row['expected']}\n  actual   {row['actual']}"
                    if n < world:
                        msg += "\n  (There are fewer elements than ranks here: some chunks are empty.)"
                    elif n % world:
                        msg += f"\n  ({n} elements do not split evenly over {world} ranks.)"
                    raise GradingFailure(msg)


def _check_p2p(fn: Callable) -> None:
    part = "point_to_point"
    seed = fresh_seed()
    for world, shape in ((3, (10,)), (4, (16,))):
        result = run_ranks(part, _traffic_worker, world, (fn, shape, seed), forbid=COLLECTIVES, trace=True,
                           context=f"{shape[0]} float32 elements", timeout=TIMEOUT_TRAFFIC)
        if not all(result):
            raise GradingFailure(f"{part}: on {world} ranks the sum was wrong once built-in collectives were disabled.")
        sent = result.trace.summary()
        if any(sent[r]["sent_messages"] == 0 for r in range(world)):
            idle = [r for r in range(world) if sent[r]["sent_messages"] == 0]
            raise GradingFailure(
                f"{part}: on {world} ranks, rank {idle[0]} sent no message with send/isend, yet the sum "
                "came out right: the data must travel by point-to-point calls."
            )


def _check_bandwidth(fn: Callable) -> None:
    part = "bandwidth"
    seed = fresh_seed()
    for world, n in ((3, 10), (4, 1000), (5, 12)):
        result = run_ranks(part, _traffic_worker, world, (fn, (n,), seed), trace=True, context=f"{n} float32 elements", timeout=TIMEOUT_TRAFFIC)
        if not all(result):
            raise GradingFailure(f"{part}: on {world} ranks with {n} elements the sum was wrong.")
        want_msgs = 2 * (world - 1)
        max_elems = 2 * (world - 1) * math.ceil(n / world)
        for rank, row in sorted(result.trace.summary().items()):
            elems = row["sent_bytes"] // 4
            if row["sent_messages"] == 0:
                raise GradingFailure(
                    f"{part}: on {world} ranks with {n} elements, rank {rank} sent no point-to-point "
                    f"message, yet a ring sends 2(p-1) = {want_msgs}. Only send and isend count here: "
                    "move the chunks with them rather than with a built-in collective."
                )
            if row["sent_messages"] != want_msgs or elems > max_elems:
                raise GradingFailure(
                    f"{part}: on {world} ranks with {n} elements, rank {rank} sent {row['sent_messages']} "
                    f"messages carrying {elems} elements; a bandwidth-optimal ring sends exactly "
                    f"2(p-1) = {want_msgs} messages of at most ceil(n/p) = {math.ceil(n / world)} elements "
                    f"(at most {max_elems} elements in all). Passing the whole tensor round the ring sends "
                    f"(p-1) x n = {(world - 1) * n}: split it into p chunks, reduce-scatter, then all-gather."
                )


def _check_no_hang(fn: Callable) -> None:
    part = "no_hang"
    seed = fresh_seed()
    for world in (2, 3, 4, 5):
        run_ranks(part, _traffic_worker, world, (fn, (7,), seed), timeout=TIMEOUT_NO_HANG, context="7 float32 elements")


def check_ring_allreduce(fn: Any, part: str) -> None:
    """Grade one part of the ring all-reduce exercise; raises GradingFailure with feedback."""
    fn = require_function(fn, "ring_allreduce", "Exercise 4.1")
    grade_part(part, {
        "correct": lambda: _check_correct(fn, CASES, part),
        "point_to_point": lambda: _check_p2p(fn),
        "bandwidth": lambda: _check_bandwidth(fn),
        "no_hang": lambda: _check_no_hang(fn),
    })


def self_check(fn: Any) -> None:
    """The visible check: a few cases on 2 and 3 ranks. Prints what passed; raises on failure."""
    fn = require_function(fn, "ring_allreduce", "Exercise 4.1")
    cases = [(2, (4,), "float32"), (3, (10,), "float32"), (3, (2,), "int64")]
    _check_correct(fn, cases, "self-check", timeout=10.0)
    print("Self-check passed: correct sums on 2 and 3 ranks, including 10 elements over 3 ranks "
          "and fewer elements than ranks. The hidden tests also check world sizes up to 8, "
          "float64, several dimensions, point-to-point only, and the number of bytes sent.")
