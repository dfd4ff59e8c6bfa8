"""Lesson 00's graded exercise: 0.1, "say hello", ``hello(rank, world_size)``.

The learner returns the string ``f"rank {rank} of {world_size}"`` on every rank. It is a
warm-up for how exercises are run and graded: the function is sent to fresh rank
processes, called there, and its return values come back.

Hidden test cell and visible self-check::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("0.1", hello, "hello")     # 1, 2, 3 and 5 ranks
    exercise("0.1").self_check(hello)         # 3 ranks

"""

from __future__ import annotations

from typing import Any

from ..kit.exercise import Attempt, Exercise, Part
from ..kit.pieces import call_learner, plural

__all__ = ["EXERCISES", "exercise_0_1", "WORLD_SIZES"]

WORLD_SIZES = (1, 2, 3, 5)  # what the hidden test runs; one rank alone, and an odd size


def _judge(attempt: Attempt, world_size: int, replies: list[Any]) -> None:
    for rank, value in enumerate(replies):
        want = f"rank {rank} of {world_size}"
        where = f"on {plural(world_size, 'rank')}, rank {rank}"
        if value is None:
            attempt.fail(f"{where}: `hello` returned None. Use `return f\"rank {{rank}} of {{world_size}}\"`; "
                         "printing the text is not enough, the check reads the returned value.")
        if not isinstance(value, str):
            attempt.fail(f"{where}: `hello` returned a {type(value).__name__} ({value!r}); it must return a "
                         f"string, here {want!r}.")
        if value != want:
            hint = ""
            if value.strip() == want:
                hint = " (there are extra spaces or a newline around it)"
            elif value.lower() == want.lower():
                hint = " (check upper and lower case)"
            elif str(world_size) not in value or str(rank) not in value:
                hint = " (use the `rank` and `world_size` arguments, not fixed numbers)"
            attempt.fail(f"{where}: expected {want!r}, got {value!r}{hint}.")


def _hello(attempt: Attempt, world_sizes: tuple[int, ...] = WORLD_SIZES) -> None:
    for world_size in world_sizes:
        result = attempt.run(call_learner, world_size, (attempt.fn,), timeout=10.0)
        _judge(attempt, world_size, list(result))


def _self_check(attempt: Attempt) -> str:
    _hello(attempt, (3,))
    return ("Self-check passed: on 3 ranks, hello returned 'rank 0 of 3', 'rank 1 of 3' and "
            "'rank 2 of 3'. The hidden test also tries 1, 2 and 5 ranks.")


exercise_0_1 = Exercise(
    number="0.1",
    function="hello",
    title="say hello",
    parts=(Part("hello", 1, '`hello` returns "rank R of W" on 1, 2, 3 and 5 ranks.'),),
    visible_check=_self_check,
)

EXERCISES = (exercise_0_1,)
