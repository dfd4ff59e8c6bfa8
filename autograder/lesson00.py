"""Hidden-test checks for lesson 00: the learner's ``hello(rank, world_size)``.

The exercise (0.1, "say hello"): return the string ``f"rank {rank} of {world_size}"``
on every rank. It is a warm-up for how exercises are run and graded: the function is
sent to fresh rank processes, called there, and its return values come back.

Graded in one part, in its own hidden test cell::

    check_hello(hello)

``self_check(hello)`` is the visible check learners run: 3 ranks, with messages they
can act on.
"""

from __future__ import annotations

from typing import Any, Callable

from .harness import GradingFailure, require_function, run_ranks

__all__ = ["check_hello", "self_check", "WORLD_SIZES"]

EXERCISE = "Exercise 0.1"
WORLD_SIZES = (1, 2, 3, 5)  # what the hidden test runs; one rank alone, and an odd size


def _worker(rank: int, world_size: int, fn: Callable) -> dict[str, Any]:
    """Call the learner's function on this rank; report a stub separately from other errors."""
    try:
        value = fn(rank, world_size)
    except NotImplementedError as exc:
        return {"stub": str(exc) or "NotImplementedError"}
    return {"value": value}


def _expected(rank: int, world_size: int) -> str:
    return f"rank {rank} of {world_size}"


def _judge(part: str, world_size: int, replies: list[dict[str, Any]]) -> None:
    for rank, reply in enumerate(replies):
        if "stub" in reply:
            raise GradingFailure(
                f"{part}: `hello` still raises NotImplementedError ({reply['stub']}). Replace the "
                "`raise NotImplementedError(...)` line in the exercise cell with your code, run "
                "that cell, then run this one again."
            )
        value, want = reply["value"], _expected(rank, world_size)
        where = f"on {world_size} rank{'s' if world_size != 1 else ''}, rank {rank}"
        if value is None:
            raise GradingFailure(
                f"{part}: {where}: `hello` returned None. Use `return f\"rank {{rank}} of "
                "{world_size}\"`; printing the text is not enough, the check reads the returned value."
            )
        if not isinstance(value, str):
            raise GradingFailure(
                f"{part}: {where}: `hello` returned a {type(value).__name__} ({value!r}); it must "
                f"return a string, here {want!r}."
            )
        if value != want:
            hint = ""
            if value.strip() == want:
                hint = " (there are extra spaces or a newline around it)"
            elif value.lower() == want.lower():
                hint = " (check upper and lower case)"
            elif str(world_size) not in value or str(rank) not in value:
                hint = " (use the `rank` and `world_size` arguments, not fixed numbers)"
            raise GradingFailure(f"{part}: {where}: expected {want!r}, got {value!r}{hint}.")


def _check(fn: Any, part: str, world_sizes: tuple[int, ...], timeout: float) -> None:
    fn = require_function(fn, "hello", EXERCISE)
    for world_size in world_sizes:
        result = run_ranks(part, _worker, world_size, (fn,), timeout=timeout)
        _judge(part, world_size, list(result))


def check_hello(fn: Any) -> None:
    """Grade Exercise 0.1 on 1, 2, 3 and 5 ranks; raises GradingFailure with feedback."""
    _check(fn, "hello", WORLD_SIZES, timeout=10.0)


def self_check(fn: Any) -> None:
    """The visible check: 3 ranks. Prints what passed; raises GradingFailure on failure."""
    _check(fn, "self-check", (3,), timeout=10.0)
    print(
        "Self-check passed: on 3 ranks, hello returned 'rank 0 of 3', 'rank 1 of 3' and "
        "'rank 2 of 3'. The hidden test also tries 1, 2 and 5 ranks."
    )
