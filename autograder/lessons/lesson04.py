"""Lesson 04's graded exercises: the ring all-reduce, climbed in four steps.

- 4.1 ``ring_chunks(phase, step, rank, world_size)``: the schedule, a pure function giving
  ``(chunk sent right, chunk received from the left)`` at each step of the
  ``"reduce-scatter"`` and the ``"all-gather"``, such that rank r ends the reduce-scatter
  owning the full sum of chunk r (as ``dist.reduce_scatter_tensor`` leaves it).
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
    exercise("4.1").grade(ring_chunks, "reduce_scatter")       # also "all_gather"
    exercise("4.2").grade(ring_reduce_scatter, "correct")      # also "ring"
    exercise("4.3").grade(ring_all_gather, "correct")          # also "ring"
    exercise("4.4").grade(ring_allreduce, "correct")   # "point_to_point", "bandwidth", "no_hang"
    exercise("4.4").self_check(ring_allreduce)          # a few cases on 2 and 3 ranks, and the traffic

Example (the instructor's ring passes; a schedule that always sends chunk 0 fails)::

    >>> from autograder.lessons.kit import GradingFailure
    >>> from autograder.lessons.reference import ring_allreduce
    >>> exercise_4_4.grade(ring_allreduce, "no_hang")
    >>> try:
    ...     exercise_4_1.grade(lambda phase, step, rank, world_size: (0, 0), "reduce_scatter")
    ... except GradingFailure as err:
    ...     print(str(err).splitlines()[0])
    reduce_scatter: after the reduce-scatter on 2 ranks, rank 1's chunk 1 holds the sum of ranks [1] only; it should hold the sum over all 2 ranks. Its chunk 0 is complete instead: ...
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

from helpers import COURSE_RING, DATA_COLLECTIVES

from .kit import (Attempt, Exercise, Part, by_world_size, first_difference, fresh_seed, plural, seeded_tensor,
                  silent_ranks)

__all__ = ["EXERCISES", "exercise_4_1", "exercise_4_2", "exercise_4_3", "exercise_4_4", "CASES", "PHASES", "chunk_bounds"]

PHASES = ("reduce-scatter", "all-gather")
# Seconds one launch may take before it counts as a hang. A correct ring finishes each in
# well under a second, but on a busy shared machine a launch has been seen to stall for 5 s
# (once 10 s) while gloo sets up, at any world size; that time counts against these limits.
# They leave room for it: only a hanging submission ever waits them out.
TIMEOUT_CORRECT = 10.0
TIMEOUT_TRAFFIC = 8.0
TIMEOUT_NO_HANG = 6.0
INTS = (-50, 50)  # small integers: sums over 8 ranks stay exact in every dtype
PLACEHOLDER = -7777  # what 4.3's not-yet-gathered chunks hold; no rank's data is ever this
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
# The stepping stones (4.2, 4.3) try fewer world sizes: one launch each.
STEP_CASES = [
    (1, (5,), "float32"),
    (2, (1,), "float32"),
    (2, (6,), "int64"),
    (3, (10,), "float64"),
    (3, (2,), "float32"),
    (4, (17,), "float32"),
    (4, (3, 5), "int64"),
    (5, (2, 3, 4), "float32"),
    (8, (9,), "float32"),
    (8, (1000,), "float64"),
]
SELF_CHECK_CASES = [(2, (4,), "float32"), (3, (10,), "float32"), (3, (2,), "int64")]
# (world size, elements) whose traffic the hidden tests count; the self-checks count the first.
TRAFFIC_CASES = ((3, 10), (4, 1000), (5, 12))
SCHEDULE_WORLDS = tuple(range(2, 9))
SCHEDULE_SELF_CHECK_WORLDS = (2, 3, 4)


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``world_size`` contiguous chunks of ceil(n/p) (the last ones may be short or empty).

    The notebook gives learners the same function: it is the exercise's statement, not its answer.

    >>> chunk_bounds(10, 4)
    [(0, 3), (3, 6), (6, 9), (9, 10)]
    """
    size = -(-numel // world_size)
    return [(min(i * size, numel), min((i + 1) * size, numel)) for i in range(world_size)]


# -- Exercise 4.1: the schedule ------------------------------------------------------------


def _schedule_worker(rank: int, world_size: int, fn: Callable, phase: str, worlds: tuple) -> dict:
    """Ask ``fn`` for every step and rank of ``phase`` on each world size; keep what it returned."""
    table = {}
    for p in worlds:
        rows = []
        for step in range(p - 1):
            row = []
            for r in range(p):
                got = fn(phase, step, r, p)
                try:
                    send, recv = got
                    row.append((operator.index(send), operator.index(recv)))
                except (TypeError, ValueError):
                    row.append(repr(got)[:80])
            rows.append(row)
        table[p] = rows
    return table


def _judge_schedule(attempt: Attempt, phase: str, p: int, rows: list) -> None:
    """Play ``phase`` on ``p`` ranks with the learner's schedule, as the notebook's picture does.

    ``have[r][c]`` is the set of ranks whose values rank r's copy of chunk c holds.
    """
    everyone = set(range(p))
    if phase == "reduce-scatter":
        have = [[{r} for _ in range(p)] for r in range(p)]
    else:  # a lone all-gather starts where the reduce-scatter ended: rank r owns chunk r
        have = [[set(everyone) if c == r else set() for c in range(p)] for r in range(p)]
    where = f"on {p} ranks, at {phase} step"
    for step, row in enumerate(rows):
        for r, pair in enumerate(row):
            if isinstance(pair, str) or not all(0 <= c < p for c in pair):
                attempt.fail(f"ring_chunks({phase!r}, {step}, {r}, {p}) returned {pair}; it should return two "
                             f"chunk numbers (send, recv), each from 0 to {p - 1}.")
        for r, (send, recv) in enumerate(row):
            left = (r - 1) % p
            if recv != row[left][0]:
                how = "adds to" if phase == "reduce-scatter" else "overwrites"
                attempt.fail(f"{where} {step}, rank {r} receives into chunk {recv}, but its left neighbour, rank "
                             f"{left}, sends chunk {row[left][0]}: the chunk a rank {how} must be the one its left "
                             "neighbour sends at the same step.")
            if phase == "all-gather" and not have[r][send]:
                held = [c for c in range(p) if have[r][c]]
                attempt.fail(f"{where} {step}, rank {r} sends chunk {send}, which it does not hold yet (it holds "
                             f"{plural(len(held), 'chunk')}: {held}). In the all-gather a rank starts with its own "
                             "chunk r and then passes on the chunk it has just received.")
        new = [list(h) for h in have]
        for r, (send, recv) in enumerate(row):
            left = (r - 1) % p
            twice = have[r][recv] & have[left][recv] if phase == "reduce-scatter" else set()
            if twice:
                attempt.fail(f"{where} {step}, rank {r} adds chunk {recv} from rank {left} into its own copy, but "
                             f"both already hold the values of ranks {sorted(twice)}: those would be counted twice. "
                             "A rank should pass on the chunk it has just added into, so that every hop adds a "
                             "new rank's values.")
            new[r][recv] = have[r][recv] | have[left][recv] if phase == "reduce-scatter" else set(have[left][recv])
        have = new
    for r in range(p):
        if phase == "reduce-scatter" and have[r][r] != everyone:
            done = [c for c in range(p) if have[r][c] == everyone]
            hint = (f" Its chunk {done[0]} is complete instead: shift the schedule so that rank r ends owning chunk r, "
                    "as dist.reduce_scatter_tensor leaves it." if done else
                    " At each step a rank should send the chunk it has just added into, so the partial sums keep "
                    "travelling.")
            attempt.fail(f"after the reduce-scatter on {p} ranks, rank {r}'s chunk {r} holds the sum of ranks "
                         f"{sorted(have[r][r])} only; it should hold the sum over all {p} ranks.{hint}")
        if phase == "all-gather":
            missing = [c for c in range(p) if have[r][c] != everyone]
            if missing:
                attempt.fail(f"after the all-gather on {p} ranks, rank {r} still misses "
                             f"{plural(len(missing), 'finished chunk')}: {missing}. Each step should pass on the "
                             "chunk that has just arrived.")


def _schedule(attempt: Attempt, phase: str, worlds: tuple = SCHEDULE_WORLDS) -> None:
    # One cheap launch: the learner's function runs in a fresh process with a time limit,
    # never in the grading kernel.
    table = attempt.run(_schedule_worker, 1, (attempt.fn, phase, worlds), timeout=10.0,
                        context=f"asking for the {phase} schedule")[0]
    for p in worlds:
        _judge_schedule(attempt, phase, p, table[p])


def _reduce_scatter_schedule(attempt: Attempt) -> None:
    _schedule(attempt, "reduce-scatter")


def _all_gather_schedule(attempt: Attempt) -> None:
    _schedule(attempt, "all-gather")


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
             "sends and ends owning the full sum of chunk r.", _reduce_scatter_schedule),
        Part("all_gather", 1, "the all-gather schedule on 2-8 ranks: each rank sends only chunks it holds and ends "
             "with every chunk.", _all_gather_schedule),
    ),
    visible_check=_schedule_self_check,
    forbid=(COURSE_RING,),
    forbid_reason="exercise 4.1 asks you to work the schedule out yourself, not to take it from helpers.ring",
)


# -- what runs on the ranks (4.2-4.4) ---------------------------------------------------------


def _in_place_problem(tensor, shape: tuple, before: int, dtype) -> str | None:
    if tensor.data_ptr() != before or tuple(tensor.shape) != tuple(shape):
        return "the tensor was replaced or reshaped instead of being changed in place"
    if tensor.dtype != dtype:
        return f"the tensor's dtype changed to {tensor.dtype}"
    return None


def _tolerance(dtype_name: str) -> float:
    return 1e-4 if dtype_name == "float32" else 1e-9


def _reduce_scatter_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    """4.2: chunk ``rank`` must end holding its sum over all ranks; the other chunks may hold anything."""
    out = []
    for i, (shape, dtype_name) in enumerate(cases):
        tensor = seeded_tensor(shape, dtype_name, seed + i, rank, int_range=INTS)
        expected = sum(seeded_tensor(shape, dtype_name, seed + i, r, int_range=INTS) for r in range(world_size))
        before = tensor.data_ptr()
        fn(tensor)
        row: dict[str, Any] = {"shape": shape, "dtype": dtype_name, "ok": True}
        why = _in_place_problem(tensor, shape, before, expected.dtype)
        if why:
            row.update(ok=False, why=why)
            out.append(row)
            continue
        flat, want = tensor.reshape(-1), expected.reshape(-1)
        bounds = chunk_bounds(flat.numel(), world_size)
        a, b = bounds[rank]
        diff = first_difference(flat[a:b], want[a:b], tolerance=_tolerance(dtype_name))
        if diff:
            why = f"its chunk {rank} (elements {a}:{b}) should hold that chunk's sum over all ranks; {diff.what}"
            done = [c for c, (x, y) in enumerate(bounds)
                    if c != rank and y > x and first_difference(flat[x:y], want[x:y], tolerance=_tolerance(dtype_name)) is None]
            if done:
                why += (f". Chunk {done[0]} holds its full sum instead: rank r must end owning chunk r; take the "
                        "chunk numbers from your ring_chunks of Exercise 4.1")
            row.update(ok=False, why=why, excerpt=diff.excerpt)
        out.append(row)
    return out


def _all_gather_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    """4.3: rank c's chunk c must reach chunk c on every rank; the rest starts as PLACEHOLDER."""
    import torch

    out = []
    for i, (shape, dtype_name) in enumerate(cases):
        n = math.prod(shape)
        bounds = chunk_bounds(n, world_size)
        expected = torch.empty(n, dtype=getattr(torch, dtype_name))
        for c, (a, b) in enumerate(bounds):  # chunk c: rank c's values, which only rank c is given
            expected[a:b] = seeded_tensor(shape, dtype_name, seed + i, c, int_range=INTS).reshape(-1)[a:b]
        tensor = torch.full(shape, PLACEHOLDER, dtype=expected.dtype)
        a, b = bounds[rank]
        tensor.view(-1)[a:b] = expected[a:b]
        before = tensor.data_ptr()
        fn(tensor)
        row: dict[str, Any] = {"shape": shape, "dtype": dtype_name, "ok": True}
        why = _in_place_problem(tensor, shape, before, expected.dtype)
        if why:
            row.update(ok=False, why=why)
            out.append(row)
            continue
        flat = tensor.reshape(-1)
        for c, (a, b) in enumerate(bounds):
            diff = first_difference(flat[a:b], expected[a:b], tolerance=_tolerance(dtype_name))
            if diff is None:
                continue
            if c == rank:
                why = f"its own chunk {c} (elements {a}:{b}) changed; it must be left as it was and sent on"
            elif bool((flat[a:b] == PLACEHOLDER).all()):
                why = (f"chunk {c} (elements {a}:{b}) still holds the placeholder {PLACEHOLDER} this check filled it "
                       f"with: rank {c}'s chunk never arrived there")
            else:
                why = f"chunk {c} (elements {a}:{b}) should hold rank {c}'s chunk; {diff.what}"
            row.update(ok=False, why=why, excerpt=diff.excerpt)
            break
        out.append(row)
    return out


def _all_reduce_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    """4.4: every rank's tensor must end holding the sum over all ranks."""
    out = []
    for i, (shape, dtype_name) in enumerate(cases):
        tensor = seeded_tensor(shape, dtype_name, seed + i, rank, int_range=INTS)
        expected = sum(seeded_tensor(shape, dtype_name, seed + i, r, int_range=INTS) for r in range(world_size))
        before = tensor.data_ptr()
        fn(tensor)
        row: dict[str, Any] = {"shape": shape, "dtype": dtype_name, "ok": True}
        why = _in_place_problem(tensor, shape, before, expected.dtype)
        if why:
            row.update(ok=False, why=why)
        else:
            diff = first_difference(tensor, expected, tolerance=_tolerance(dtype_name))
            if diff:
                row.update(ok=False, why=diff.what, excerpt=diff.excerpt)
        out.append(row)
    return out


_correct_worker = _all_reduce_worker  # the name the course's own tests use


# -- the shared parts ------------------------------------------------------------------------


def _judge_rows(attempt: Attempt, world: int, result: list) -> None:
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


def _correct(attempt: Attempt, worker: Callable = _all_reduce_worker, cases: list = CASES,
             timeout: float = TIMEOUT_CORRECT) -> None:
    seed = fresh_seed()
    for world, group_cases in by_world_size(cases):
        result = attempt.run(worker, world, (attempt.fn, group_cases, seed), timeout=timeout)
        _judge_rows(attempt, world, list(result))


def _traced(attempt: Attempt, worker: Callable, world: int, n: int):
    """One float32 case of ``n`` elements on ``world`` ranks, traced; fails when the result is wrong."""
    result = attempt.run(worker, world, (attempt.fn, [((n,), "float32")], fresh_seed()), trace=True,
                         context=f"{n} float32 elements", timeout=TIMEOUT_TRAFFIC)
    _judge_rows(attempt, world, list(result))
    return result


def _ring_traffic(attempt: Attempt, worker: Callable, phase: str, cases: tuple = TRAFFIC_CASES) -> None:
    """A ring phase: p-1 sends of at most ceil(n/p) elements to the right, p-1 receives from the left."""
    for world, n in cases:
        result = _traced(attempt, worker, world, n)
        chunk = math.ceil(n / world)
        where = f"on {world} ranks with {n} elements"
        for rank in range(world):
            right, left = (rank + 1) % world, (rank - 1) % world
            events = result.trace.for_rank(rank)
            sends = [e for e in events if e.is_send]
            recvs = [e for e in events if e.is_recv]
            if len(sends) != world - 1:
                attempt.fail(f"{where}, rank {rank} sent {plural(len(sends), 'message')}; a ring {phase} sends "
                             f"p-1 = {world - 1}, one chunk per step.")
            for e in sends:
                if e.peer != right:
                    attempt.fail(f"{where}, rank {rank} sent a message to rank {e.peer}; in a ring each rank sends "
                                 f"only to its right neighbour, rank {right}.")
                if (e.nbytes or 0) > 4 * chunk:
                    attempt.fail(f"{where}, rank {rank} sent a message of {(e.nbytes or 0) // 4} elements; a chunk "
                                 f"has at most ceil(n/p) = {chunk}. Send one chunk per message (a slice of the "
                                 "flattened tensor).")
            if len(recvs) != world - 1 or any(e.peer != left for e in recvs):
                peers = sorted({"any source" if e.peer is None else f"rank {e.peer}" for e in recvs})
                attempt.fail(f"{where}, rank {rank} made {plural(len(recvs), 'receive')} (from {', '.join(peers) or 'nobody'}); "
                             f"in a ring each rank receives p-1 = {world - 1} chunks, each from its left "
                             f"neighbour, rank {left} (say src={left}).")


# -- Exercise 4.2: ring reduce-scatter ----------------------------------------------------------


def _reduce_scatter_correct(attempt: Attempt) -> None:
    _correct(attempt, _reduce_scatter_worker, STEP_CASES)


def _reduce_scatter_ring(attempt: Attempt) -> None:
    _ring_traffic(attempt, _reduce_scatter_worker, "reduce-scatter")


def _reduce_scatter_self_check(attempt: Attempt) -> str:
    _correct(attempt, _reduce_scatter_worker, SELF_CHECK_CASES)
    _ring_traffic(attempt, _reduce_scatter_worker, "reduce-scatter", TRAFFIC_CASES[:1])
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
             "3 dtypes, several shapes.", _reduce_scatter_correct),
        Part("ring", 1, "each rank sends p-1 messages of at most ceil(n/p) elements, to its right neighbour, "
             "and receives p-1 from its left.",
             _reduce_scatter_ring),
    ),
    visible_check=_reduce_scatter_self_check,
    forbid=DATA_COLLECTIVES + (COURSE_RING,),
    forbid_reason="exercise 4.2 asks you to build the reduce-scatter yourself, from send, recv, isend and irecv",
)


# -- Exercise 4.3: ring all-gather --------------------------------------------------------------


def _all_gather_correct(attempt: Attempt) -> None:
    _correct(attempt, _all_gather_worker, STEP_CASES)


def _all_gather_ring(attempt: Attempt) -> None:
    _ring_traffic(attempt, _all_gather_worker, "all-gather")


def _all_gather_self_check(attempt: Attempt) -> str:
    _correct(attempt, _all_gather_worker, SELF_CHECK_CASES)
    _ring_traffic(attempt, _all_gather_worker, "all-gather", TRAFFIC_CASES[:1])
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
             "3 dtypes, several shapes.", _all_gather_correct),
        Part("ring", 1, "each rank sends p-1 messages of at most ceil(n/p) elements, to its right neighbour, "
             "and receives p-1 from its left.",
             _all_gather_ring),
    ),
    visible_check=_all_gather_self_check,
    forbid=DATA_COLLECTIVES + (COURSE_RING,),
    forbid_reason="exercise 4.3 asks you to build the all-gather yourself, from send, recv, isend and irecv",
)


# -- Exercise 4.4: ring all-reduce --------------------------------------------------------------


def _point_to_point(attempt: Attempt) -> None:
    for world, n in ((3, 10), (4, 16)):
        result = _traced(attempt, _all_reduce_worker, world, n)
        idle = silent_ranks(result, ("sent",))
        if idle:
            attempt.fail(f"on {world} ranks, rank {idle[0][0]} sent no message with send/isend, yet the sum "
                         "came out right: the data must travel by point-to-point calls.")


def _bandwidth(attempt: Attempt, cases: tuple = TRAFFIC_CASES) -> None:
    """2(p-1) messages of at most ceil(n/p) elements per rank, to any peer: a ring is not required."""
    for world, n in cases:
        result = _traced(attempt, _all_reduce_worker, world, n)
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


def _no_hang(attempt: Attempt) -> None:
    seed = fresh_seed()
    for world in (2, 3, 4, 5):
        attempt.run(_all_reduce_worker, world, (attempt.fn, [((7,), "float32")], seed), timeout=TIMEOUT_NO_HANG,
                    context="7 float32 elements")


def _self_check(attempt: Attempt) -> str:
    _correct(attempt, _all_reduce_worker, SELF_CHECK_CASES, timeout=10.0)
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
        Part("correct", 4, "the right sums on 1-8 ranks, uneven and tiny sizes, 3 dtypes, several shapes.",
             _correct),
        Part("point_to_point", 2, "still correct with every built-in collective disabled; data moves by send/recv.",
             _point_to_point),
        Part("bandwidth", 3, "each rank sends exactly 2(p-1) messages of at most ceil(n/p) elements (to any peer).",
             _bandwidth),
        Part("no_hang", 1, "finishes promptly on 2, 3, 4 and 5 ranks (no deadlock for odd or even world sizes).",
             _no_hang),
    ),
    visible_check=_self_check,
    forbid=DATA_COLLECTIVES + (COURSE_RING,),
    forbid_reason="exercise 4.4 asks you to build all_reduce yourself, from send, recv, isend and irecv",
)

EXERCISES = (exercise_4_1, exercise_4_2, exercise_4_3, exercise_4_4)
