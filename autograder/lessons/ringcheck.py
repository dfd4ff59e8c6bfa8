"""Checks of a hand-built ring (lesson 04): the schedule replayed, the learner's collective on seeded tensors, the traffic.

- :func:`schedule_worker` and :func:`judge_schedule` (Exercise 4.1): ask the learner's
  ``ring_chunks`` for every step and rank, then play the reduce-scatter or all-gather it
  describes and say where it first goes wrong;
- :func:`reduce_scatter_worker`, :func:`all_gather_worker`, :func:`all_reduce_worker`
  (4.2-4.4, on the ranks): run the learner's function on each case's seeded tensors and
  report, per case, whether it changed the tensor in place to the right values, and how not;
  :func:`judge_rows` turns those reports into feedback;
- :func:`traced` and :func:`ring_traffic`: a traced run, and the rule of a ring phase (p-1
  messages of at most ceil(n/p) elements, to the right neighbour, from the left one).

Chunks are those of :func:`chunk_bounds`. The lesson's exercises and parts are declared in
:mod:`autograder.lessons.lesson04`; this module ships to learners with it (the self-checks use it).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

from ..kit.exercise import Attempt, fresh_seed
from ..kit.pieces import HALF_FINISHED, first_difference, plural, read_before_wait, recorded, seeded_tensor

__all__ = ["chunk_bounds", "schedule_worker", "judge_schedule", "reduce_scatter_worker", "all_gather_worker",
           "all_reduce_worker", "judge_rows", "traced", "ring_traffic", "INTS", "PLACEHOLDER", "TIMEOUT_TRAFFIC",
           "TRAFFIC_CASES"]

INTS = (-50, 50)  # small integers: sums over 8 ranks stay exact in every dtype
PLACEHOLDER = -7777  # what 4.3's not-yet-gathered chunks hold; no rank's data is ever this
TIMEOUT_TRAFFIC = 8.0  # seconds a traced run may take (see lesson04's note on timeouts)
# (world size, elements) whose traffic the hidden tests count; the self-checks count the first.
TRAFFIC_CASES = ((3, 10), (4, 1000), (5, 12))


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``world_size`` contiguous chunks of ceil(n/p) (the last ones may be short or empty).

    The notebook gives learners the same function: it is the exercise's statement, not its answer.

    >>> chunk_bounds(10, 4)
    [(0, 3), (3, 6), (6, 9), (9, 10)]
    """
    size = -(-numel // world_size)
    return [(min(i * size, numel), min((i + 1) * size, numel)) for i in range(world_size)]


def schedule_worker(rank: int, world_size: int, fn: Callable, phase: str, worlds: tuple) -> dict:
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


def judge_schedule(attempt: Attempt, phase: str, p: int, rows: list) -> None:
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
                    "as dist.reduce_scatter leaves item r on rank r." if done else
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


def _in_place_problem(tensor, shape: tuple, before: int, dtype) -> str | None:
    if tensor.data_ptr() != before or tuple(tensor.shape) != tuple(shape):
        return "the tensor was replaced or reshaped instead of being changed in place"
    if tensor.dtype != dtype:
        return f"the tensor's dtype changed to {tensor.dtype}"
    return None


def _tolerance(dtype_name: str) -> float:
    return 1e-4 if dtype_name == "float32" else 1e-9


def _unchanged(returned: Any, expected, tolerance: float) -> str:
    """Why a tensor that came back exactly as it went in is wrong, and what the returned value says."""
    import torch

    why = ("the tensor passed in was not changed: the caller's tensor must change in place (write into "
           "tensor.view(-1) or slices of it; tensor.clone(), torch.cat(...) or `tensor = ...` make a new tensor "
           "that the caller never sees)")
    if isinstance(returned, torch.Tensor) and returned.numel() == expected.numel():
        if first_difference(returned.detach().reshape(-1).to(expected.dtype), expected.reshape(-1),
                            tolerance=tolerance) is None:
            why += ". The tensor you returned holds the right values: it is a copy"
    return why


def _returned(returned: Any) -> str:
    import torch

    if returned is None:
        return "None"
    if isinstance(returned, torch.Tensor):
        return "a different tensor"
    return f"a {type(returned).__name__}"


def _partial_sum(value: float, values: list[float], tolerance: float) -> list[int] | None:
    """The ranks whose values add up to ``value``, when that is some of them but not all (else None)."""
    p = len(values)
    for mask in range(1, 2 ** p - 1):
        total = sum(values[r] for r in range(p) if mask >> r & 1)
        if abs(total - value) <= tolerance * max(1.0, abs(value)):
            return [r for r in range(p) if mask >> r & 1]
    return None


def _run_cases(fn: Callable, cases: list, seed: int, prepare: Callable, judge: Callable) -> list[dict]:
    """Each case on this rank: ``prepare`` the input and what it must become, run ``fn`` in place, ``judge`` it.

    Returns one row per case: ``{"shape", "dtype", "ok"}``, and ``why`` (with an ``excerpt`` of
    values and a ``hint``) when not ok. A tensor replaced, reshaped or recast instead of changed
    in place is wrong whatever it holds; one left as it came in is named as such; right values
    with something else than the tensor returned are wrong too (the exercises say "return it");
    wrong values from code that received data asynchronously get :data:`HALF_FINISHED`.
    """
    out = []
    for i, (shape, dtype_name) in enumerate(cases):
        tensor, expected = prepare(shape, dtype_name, seed + i)
        original, before, tolerance = tensor.clone(), tensor.data_ptr(), _tolerance(dtype_name)
        returned, calls = recorded(lambda: fn(tensor))
        row: dict[str, Any] = {"shape": shape, "dtype": dtype_name, "ok": True}
        why = _in_place_problem(tensor, shape, before, expected.dtype)
        found = (why, "") if why else judge(tensor.reshape(-1), expected.reshape(-1), tolerance)
        hint, unchanged = "", found and not why and tensor.equal(original) and not expected.equal(original)
        if found and not why and read_before_wait(calls):
            hint = HALF_FINISHED
            if unchanged:
                found = (found[0] + " (it came back exactly as it went in)", found[1])
        elif unchanged:
            found = (_unchanged(returned, expected, tolerance), found[1])
        elif not found and returned is not tensor:
            found = (f"the tensor holds the right values, but the function returned {_returned(returned)} "
                     "instead of the tensor it was given: change the given tensor in place and end with "
                     "`return tensor`", "")
        if found:
            row.update(ok=False, why=found[0], excerpt=found[1], hint=hint)
        out.append(row)
    return out


def _summed(rank: int, world_size: int):
    """This rank's seeded tensor, and the sum over every rank's: what an all-reduce leaves.

    Every rank's own values of the case are kept in :data:`_PARTS` while it is judged, so that a
    wrong element can be read as a partial sum.
    """
    def prepare(shape: tuple, dtype_name: str, seed: int):
        parts = [seeded_tensor(shape, dtype_name, seed, r, int_range=INTS) for r in range(world_size)]
        _PARTS[:] = [t.reshape(-1) for t in parts]
        return parts[rank].clone(), sum(parts)
    return prepare


#: The case being judged: every rank's own values, flattened (set by :func:`_summed`'s prepare).
_PARTS: list = []


def _which_ranks(flat, want, index: int | None, tolerance: float) -> str:
    """``" (it holds the sum of ranks [0, 2] only: a partial sum)"`` when the wrong float element is a partial sum."""
    parts = _PARTS
    if index is None or not parts or not want.is_floating_point():
        return ""
    ranks = _partial_sum(float(flat[index]), [float(t[index]) for t in parts], tolerance)
    if ranks is None:
        return ""
    held = f"rank {ranks[0]}'s value alone" if len(ranks) == 1 else f"the sum of ranks {ranks} only"
    return f" (it holds {held}: a partial sum)"


def reduce_scatter_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    """4.2: chunk ``rank`` must end holding its sum over all ranks; the other chunks may hold anything."""
    def judge(flat, want, tolerance: float):
        bounds = chunk_bounds(flat.numel(), world_size)
        a, b = bounds[rank]
        diff = first_difference(flat[a:b], want[a:b], tolerance=tolerance)
        if diff is None:
            return None
        index = None if diff.index is None else a + diff.index
        why = (f"its chunk {rank} (elements {a}:{b}) should hold that chunk's sum over all ranks; {diff.what}"
               + _which_ranks(flat, want, index, tolerance))
        done = [c for c, (x, y) in enumerate(bounds)
                if c != rank and y > x and first_difference(flat[x:y], want[x:y], tolerance=tolerance) is None]
        if done:
            why += (f". Chunk {done[0]} holds its full sum instead: rank r must end owning chunk r; take the "
                    "chunk numbers from your ring_chunks of Exercise 4.1")
        return why, diff.excerpt

    try:
        return _run_cases(fn, cases, seed, _summed(rank, world_size), judge)
    finally:
        _PARTS.clear()


def all_gather_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    """4.3: rank c's chunk c must reach chunk c on every rank; the rest starts as PLACEHOLDER."""
    import torch

    def prepare(shape: tuple, dtype_name: str, case_seed: int):
        n = math.prod(shape)
        expected = torch.empty(n, dtype=getattr(torch, dtype_name))
        for c, (a, b) in enumerate(chunk_bounds(n, world_size)):  # chunk c: rank c's values, given to rank c only
            expected[a:b] = seeded_tensor(shape, dtype_name, case_seed, c, int_range=INTS).reshape(-1)[a:b]
        tensor = torch.full(shape, PLACEHOLDER, dtype=expected.dtype)
        a, b = chunk_bounds(n, world_size)[rank]
        tensor.view(-1)[a:b] = expected[a:b]
        return tensor, expected

    def judge(flat, expected, tolerance: float):
        for c, (a, b) in enumerate(chunk_bounds(flat.numel(), world_size)):
            diff = first_difference(flat[a:b], expected[a:b], tolerance=tolerance)
            if diff is None:
                continue
            if c == rank:
                return f"its own chunk {c} (elements {a}:{b}) changed; it must be left as it was and sent on", diff.excerpt
            if bool((flat[a:b] == PLACEHOLDER).all()):
                return (f"chunk {c} (elements {a}:{b}) still holds the placeholder {PLACEHOLDER} this check filled it "
                        f"with: rank {c}'s chunk never arrived there", diff.excerpt)
            return f"chunk {c} (elements {a}:{b}) should hold rank {c}'s chunk; {diff.what}", diff.excerpt
        return None

    return _run_cases(fn, cases, seed, prepare, judge)


def all_reduce_worker(rank: int, world_size: int, fn: Callable, cases: list, seed: int) -> list[dict]:
    """4.4: every rank's tensor must end holding the sum over all ranks."""
    def judge(flat, want, tolerance: float):
        diff = first_difference(flat, want, tolerance=tolerance)
        return (diff.what + _which_ranks(flat, want, diff.index, tolerance), diff.excerpt) if diff else None

    try:
        return _run_cases(fn, cases, seed, _summed(rank, world_size), judge)
    finally:
        _PARTS.clear()


def judge_rows(attempt: Attempt, world: int, result: list) -> None:
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
            if row.get("hint"):
                msg += "\n  " + row["hint"]
            attempt.fail(msg)


def traced(attempt: Attempt, worker: Callable, world: int, n: int):
    """One float32 case of ``n`` elements on ``world`` ranks, traced; fails when the result is wrong."""
    result = attempt.run(worker, world, (attempt.fn, [((n,), "float32")], fresh_seed()), trace=True,
                         context=f"{n} float32 elements", timeout=TIMEOUT_TRAFFIC)
    judge_rows(attempt, world, list(result))
    return result


def ring_traffic(attempt: Attempt, worker: Callable, phase: str, cases: tuple = TRAFFIC_CASES) -> None:
    """A ring phase: p-1 sends of at most ceil(n/p) elements to the right, p-1 receives from the left."""
    for world, n in cases:
        result = traced(attempt, worker, world, n)
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

