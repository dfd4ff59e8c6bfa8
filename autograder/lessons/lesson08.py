"""Lesson 08's graded exercise: 8.1, three broken programs repaired.

The learner hands in one class, ``Repaired``, with three static methods, each the repaired
version of a broken program from the lesson. Every method runs on every rank as
``Repaired.NAME(rank, world_size, x)``, where ``x`` is this rank's own tensor:

- ``pass_right`` (was a hang: every rank received first): send ``x`` to the right
  neighbour, ``(rank + 1) % world_size``, and return the tensor that arrives from the left
  one. Collectives are switched off for it: the repair is in the order of point-to-point
  calls, not in replacing them.
- ``global_mean`` (was a wrong result: the ranks' means summed, not divided, not weighted):
  return the mean of every element of every rank's ``x`` (the ranks hold different numbers
  of elements), the same on every rank.
- ``gather_all`` (was a crash on some ranks: ``all_gather`` of tensors of different sizes):
  return every rank's ``x`` concatenated in rank order, on every rank; some ranks may hold
  no element at all.

How the checks judge: each program runs on 2, 3 and 4 fresh ranks with data drawn at
grading time from a fresh seed (so nothing can be precomputed, and no rank knows another's
data without communicating), against a single-process reference computed from the same
seed. Each launch has a short timeout; a hang's feedback says where each rank was waiting,
a crash's names the rank and its exception, a wrong value names the rank, the world size,
the expected and the actual values.

Hidden test cells and the visible self-check::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("8.1", Repaired, "hang")       # "wrong_result", "crash"
    exercise("8.1").self_check(Repaired)          # the three programs on 3 ranks

Example (the data is the same on every process for one seed)::

    >>> _data("gather_all", 5, 1, 3).equal(_data("gather_all", 5, 1, 3))
    True
"""

from __future__ import annotations

from typing import Any

from helpers import DATA_COLLECTIVES

from ..kit.harness import GradingFailure
from ..kit.exercise import Attempt, Exercise, Part, fresh_seed
from ..kit.pieces import first_difference, plural

__all__ = ["EXERCISES", "exercise_8_1", "PROGRAMS", "reference"]

TIMEOUT = 5.0  # a repaired program finishes in well under a second on 4 ranks
WORLDS = (2, 3, 4)
PROGRAMS = {"hang": "pass_right", "wrong_result": "global_mean", "crash": "gather_all"}


# -- the data, the same on every process for one seed ------------------------------------


def _lengths(program: str, seed: int, world_size: int) -> list[int]:
    """How many elements each rank holds: equal for pass_right, different (some zero) for gather_all."""
    import torch

    g = torch.Generator().manual_seed(seed * 31 + world_size)
    if program == "pass_right":
        return [int(torch.randint(3, 40, (1,), generator=g))] * world_size
    if program == "global_mean":
        return torch.randint(1, 25, (world_size,), generator=g).tolist()
    lengths = torch.randint(0, 9, (world_size,), generator=g).tolist()
    lengths[seed % world_size] = 0  # one rank has nothing to give
    busy = (seed + 1) % world_size
    lengths[busy] = max(lengths[busy], 3)
    return lengths


def _data(program: str, seed: int, rank: int, world_size: int):
    """Rank ``rank``'s tensor ``x`` for ``program`` on ``world_size`` ranks."""
    import torch

    n = _lengths(program, seed, world_size)[rank]
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if program == "global_mean":
        return torch.randn(n, generator=g, dtype=torch.float64) * 10 + rank
    return torch.randint(-1000, 1000, (n,), generator=g).to(torch.float32)


def reference(program: str, seed: int, rank: int, world_size: int):
    """What rank ``rank`` must return, computed in one process from every rank's data."""
    import torch

    every = [_data(program, seed, r, world_size) for r in range(world_size)]
    if program == "pass_right":
        return every[(rank - 1) % world_size]
    if program == "global_mean":
        return torch.cat(every).mean()
    return torch.cat(every)


def _program_worker(rank: int, world_size: int, repaired: Any, program: str, seed: int) -> Any:
    """Runs on every rank: this rank's data through the learner's repaired program."""
    x = _data(program, seed, rank, world_size)
    return getattr(repaired, program)(rank, world_size, x.clone())


# -- judging --------------------------------------------------------------------------------


def _describe(program: str, seed: int, world_size: int) -> str:
    lengths = _lengths(program, seed, world_size)
    if program == "pass_right":
        return f"every rank holding {plural(lengths[0], 'element')}"
    return "the ranks holding " + ", ".join(map(str, lengths)) + " elements"


def _judge(attempt: Attempt, program: str, seed: int, world_size: int, values: list) -> None:
    import torch

    where = f"on {plural(world_size, 'rank')} ({_describe(program, seed, world_size)})"
    for rank, value in enumerate(values):
        expected = reference(program, seed, rank, world_size)
        if program == "global_mean":
            try:
                got = float(value)
            except (TypeError, ValueError):
                attempt.fail(f"{program}: {where}, rank {rank} returned {type(value).__name__} {value!r}; "
                             f"return the mean as a number or a one-element tensor.")
            want = float(expected)
            if abs(got - want) > 1e-6 * max(1.0, abs(want)):
                attempt.fail(
                    f"{program}: {where}, rank {rank} returned {got:.6g}; the mean of all "
                    f"{sum(_lengths(program, seed, world_size))} elements is {want:.6g}. Sum the elements and count "
                    "them on every rank, all-reduce both, then divide: a mean of means is wrong when the ranks "
                    "hold different numbers of elements, and a sum of means is the world size times too large.")
            continue
        if not isinstance(value, torch.Tensor):
            attempt.fail(f"{program}: {where}, rank {rank} returned {type(value).__name__} {value!r}, not a tensor.")
        diff = first_difference(value.detach(), expected)
        if diff is not None:
            wanted = (f"rank {(rank - 1) % world_size}'s x (the left neighbour's)" if program == "pass_right"
                      else "every rank's x, concatenated in rank order")
            attempt.fail(f"{program}: {where}, rank {rank} returned a tensor that is not {wanted}: {diff}")


def _run_program(attempt: Attempt, program: str, worlds: tuple[int, ...] = WORLDS) -> None:
    """Run ``program`` of the learner's class on each world size, with a fresh seed; fail on the first fault.

    The runs follow the rules of the part that grades ``program`` (``pass_right`` without collectives).
    """
    if not callable(getattr(attempt.fn, program, None)):
        attempt.fail(f"`{attempt.exercise.function}` has no method `{program}`: keep the three methods the "
                     f"exercise cell gives, each with @staticmethod and the arguments (rank, world_size, x).")
    part = next(name for name, p in PROGRAMS.items() if p == program)
    for world_size in worlds:
        seed = fresh_seed()
        values = attempt.under(part).run(
            _program_worker, world_size, (attempt.fn, program, seed), timeout=TIMEOUT,
            context=_describe(program, seed, world_size), label=f"{attempt.part} ({program})",
            function=f"{attempt.exercise.function}.{program}",
        )
        _judge(attempt, program, seed, world_size, list(values))


def _self_check(attempt: Attempt) -> str:
    """Each program on 3 ranks; every failure is reported, not only the first."""
    passed, failures = [], []
    for part, program in PROGRAMS.items():
        try:
            _run_program(attempt, program, worlds=(3,))
            passed.append(program)
        except GradingFailure as failure:
            failures.append(str(failure))
    if failures:
        done = f" ({', '.join(passed)} passed.)" if passed else ""
        raise GradingFailure("\n\n".join(failures) + done)
    return ("Self-check passed: pass_right, global_mean and gather_all each finished on 3 ranks with the right "
            "result. The hidden tests run each on 2, 3 and 4 ranks with new data.")


exercise_8_1 = Exercise(
    number="8.1",
    function="Repaired",
    title="repair three broken programs",
    parts=(
        Part("hang", 2, "pass_right finishes on 2, 3 and 4 ranks, each rank returning its left neighbour's tensor.", forbid=DATA_COLLECTIVES,
             forbid_reason="pass_right is repaired by ordering its point-to-point calls (isend/irecv, or send and "
                           "recv in an order that pairs up), not by replacing them with a collective"),
        Part("wrong_result", 2, "global_mean returns the mean of every rank's elements on 2, 3 and 4 ranks."),
        Part("crash", 2, "gather_all returns every rank's tensor, in rank order, on 2, 3 and 4 ranks."),
    ),
    visible_check=_self_check,
    hints={
        "DeadlockError": "Every rank sits in a blocking call that waits for its neighbour, in a cycle: when "
                         "every rank sends first (or receives first), none ever reaches the call that would "
                         "match its neighbour's. Start the send with dist.isend, then recv, then wait() on the "
                         "send's request; or let even ranks send first and odd ranks receive first.",
        "SIGABRT": "gloo's all_gather needs every rank's tensor to have the same number of elements; when the "
                   "sizes differ it can abort the process (SIGABRT) instead of raising. The ranks must agree "
                   "on one size first: all_gather every rank's length, pad every tensor to the longest of "
                   "them (not each to its own length), gather, then trim each piece back to its length.",
    },
)

EXERCISES = (exercise_8_1,)
