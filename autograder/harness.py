"""The grading harness: run a learner's function on fresh ranks and judge it fairly.

Hidden tests call the lesson checks (``autograder.lessonNN``), which are built on this
module. Every check:

- runs the learner's code in fresh rank processes through :func:`helpers.launch`, never
  in the learner's kernel, so nothing the learner patched there reaches the ranks;
- draws its test data from a seed chosen at grading time, and computes the expected
  answer in a single process (no cached answer can match);
- disables the built-in collectives inside the ranks where the exercise is to build
  one (also through ``distributed_c10d`` and the process-group object);
- keeps the ranks' output out of the notebook (it goes in the feedback only when it
  helps), so a harmless warning cannot cost points;
- ends within its own short timeout, so one broken submission cannot stall the class.

A failing check raises :class:`GradingFailure` (an ``AssertionError``) whose message
says which part failed, on which world size and tensor size, which rank, and the
expected and actual values.

Example (in a hidden test cell)::

    from autograder.lesson04 import check_ring_allreduce
    check_ring_allreduce(ring_allreduce, part="correct")
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from helpers import DATA_COLLECTIVES, ForbiddenCallError, LaunchResult, LaunchTimeoutError, RankFailedError, launch

__all__ = [
    "GradingFailure",
    "COLLECTIVES",
    "run_ranks",
    "fresh_seed",
    "describe_values",
    "require_function",
    "grade_part",
]

# Every built-in collective (all but the barriers); disabled inside the ranks when an
# exercise builds its own. The object collectives are in it too: they call the others.
COLLECTIVES = DATA_COLLECTIVES
_REASON = "this exercise asks you to build it from point-to-point calls (send, recv, isend, irecv)"


class GradingFailure(AssertionError):
    """A check failed; the message is written for the learner."""


def fresh_seed() -> int:
    """A seed drawn at grading time, so answers cannot be precomputed."""
    return random.SystemRandom().randrange(1, 2**31)


def require_function(fn: Any, name: str, exercise: str) -> Callable:
    """Fail clearly when the learner's function is missing or still a stub."""
    if not callable(fn):
        raise GradingFailure(f"{exercise}: define a function named `{name}` (found {type(fn).__name__}).")
    return fn


def grade_part(part: str, checks: dict[str, Callable[[], None]]) -> None:
    """Run the check of one graded part (each hidden test cell grades one part)."""
    if part not in checks:
        raise ValueError(f"unknown part {part!r}; use one of {tuple(checks)}")
    checks[part]()


def describe_values(values: Any, limit: int = 8) -> str:
    """A short text of a tensor's values for feedback."""
    try:
        flat = values.reshape(-1).tolist()
    except AttributeError:
        return repr(values)
    text = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat[:limit])
    return f"[{text}{', ...' if len(flat) > limit else ''}] ({len(flat)} values)"


def run_ranks(
    part: str,
    worker: Callable,
    world_size: int,
    args: Sequence[Any] = (),
    *,
    context: str = "",
    timeout: float = 10.0,
    forbid: Sequence[str] = (),
    trace: bool = False,
    nnodes: int = 1,
    init: bool = True,
    hints: dict[str, str] | None = None,
) -> LaunchResult:
    """Run ``worker`` on fresh ranks; turn a crash or hang into learner feedback.

    ``nnodes`` simulates hosts, ``init=False`` leaves the process group to the worker,
    and ``hints`` maps a rank's exception type name to a sentence added to the feedback.
    """
    hosts = f" on {nnodes} simulated hosts" if nnodes > 1 else ""
    where = f"on {world_size} rank{'s' if world_size != 1 else ''}{hosts}" + (f", {context}" if context else "")
    try:
        return launch(
            worker,
            world_size,
            tuple(args),
            timeout=timeout,
            output="quiet",
            forbid=dict.fromkeys(forbid, _REASON),
            trace=trace,
            backend="gloo",
            nnodes=nnodes,
            init=init,
        )
    except LaunchTimeoutError as err:
        waits = "\n".join(f"  {line}" for line in err.waiting.values())
        notes = "\n".join(f"  {n}" for n in getattr(err, "notes", []))
        raise GradingFailure(
            f"{part}: your code did not finish within {timeout:g} s {where}; it was stopped.\n"
            f"Where the ranks were waiting:\n{waits}" + (f"\n{notes}" if notes else "")
        ) from None
    except RankFailedError as err:
        if isinstance(err.original, ForbiddenCallError):
            raise GradingFailure(
                f"{part}: rank {err.rank} called a built-in collective {where}: {err.exc_message}"
            ) from None
        what = (
            f"raised {err.exc_type}: {err.exc_message}"
            if err.exc_type
            else err.exc_message
        )
        hint = f"\n  {hints[err.exc_type]}" if hints and err.exc_type in hints else ""
        tb = err.rank_traceback.strip().splitlines()[-6:] if err.rank_traceback else []
        detail = ("\n" + "\n".join(tb)) if tb else ""
        raise GradingFailure(f"{part}: rank {err.rank} {what} {where}.{hint}{detail}") from None
