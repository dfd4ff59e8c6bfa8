"""Turning how a request to the ranks ended into one clear exception for the notebook.

:func:`outcome_error` is the one place that does it, for launches and persistent ranks
alike: the root cause's own error (:meth:`~helpers.protocol.Failure.to_error`,
:meth:`~helpers.protocol.Death.to_error`) when a rank failed, else the hang report (a
:class:`~helpers.DeadlockError` when the ranks were found deadlocked before the timeout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import diagnose
from .errors import DeadlockError, LaunchError, LaunchTimeoutError
from .protocol import Death, Failure

if TYPE_CHECKING:
    from ._group import Outcome

__all__ = ["outcome_error", "group_stopped_error", "hang_report", "earliest", "in_distributed_call"]


def earliest(failures: list[Failure | Death]) -> Failure | Death:
    """The root cause: a rank that died, else the first failure in time.

    Later failures are usually echoes of the first. A death is the exception: its peers'
    collectives fail at once ("Connection reset by peer") and their errors can reach us
    before the factory reports the death, so a rank that died without an error of its own
    comes first.
    """
    raised = {f.rank for f in failures if isinstance(f, Failure)}
    deaths = [f for f in failures if isinstance(f, Death) and f.rank not in raised]
    return min(deaths or failures, key=lambda f: (f.time, f.rank))


def in_distributed_call(failure: Failure | Death) -> bool:
    """Whether an error was raised inside torch.distributed (maybe because a peer died)."""
    if not isinstance(failure, Failure) or not failure.error.frames:
        return False
    return diagnose.is_distributed(failure.error.frames[-1].filename)


def outcome_error(
    outcome: "Outcome",
    world_size: int,
    timeout: float,
    *,
    what: str = "The ranks",
    note: str = "",
    stopped: list[int] = (),
) -> LaunchError:
    """The exception for a request that did not end well.

    ``what`` names what ran ("The cell", "Starting the ranks"); ``note`` says what was
    done about the other ranks (added after a failure's traceback, or in a hang report's
    first line); ``stopped`` lists the ranks stopped because of a failure.
    """
    if outcome.cause is not None:
        return outcome.cause.to_error(world_size, list(stopped), note=note, diag=outcome.diag)
    return hang_report(outcome, world_size, timeout, what=what, recovery=note)


def group_stopped_error(outcome: "Outcome", live: list[int], world_size: int, timeout: float,
                        what: str = "The ranks") -> LaunchError:
    """The error for a request after which the whole group is stopped (``live``: its ranks
    still running): the failure's other ranks, or every rank of a hang, are named as stopped."""
    if outcome.cause is None:
        return outcome_error(outcome, world_size, timeout, what=what, note="All ranks were stopped.")
    stopped = [r for r in live if r != outcome.cause.rank]
    many = len(stopped) > 1
    note = (f"The other rank{'s' if many else ''} ({', '.join(map(str, stopped))}) "
            f"{'were' if many else 'was'} stopped.") if stopped else ""
    return outcome_error(outcome, world_size, timeout, what=what, note=note, stopped=stopped)


def hang_report(
    outcome: "Outcome", world_size: int, timeout: float, what: str = "The ranks", recovery: str = ""
) -> LaunchTimeoutError:
    """The error for ranks still running at the timeout, from their stacks and the board.

    When waiting stopped because ranks were found deadlocked (``outcome.deadlock``), the
    same report is a :class:`~helpers.DeadlockError` whose first line says so.
    """
    busy = outcome.pending
    frames = {r: diagnose.main_stack(outcome.stacks.get(r, ""), outcome.main_threads.get(r)) for r in busy}
    stacks = {r: diagnose.format_stack(frames[r]) for r in busy}
    waiting, notes = diagnose.explain_hang(outcome.board, frames, busy, outcome.finished)
    finished = outcome.finished
    deadlock = outcome.deadlock
    if deadlock is not None:
        stuck = deadlock.ranks
        head = (f"{what} deadlocked: found after {deadlock.seconds:.1f} s, "
                f"rank{'s' if len(stuck) != 1 else ''} {', '.join(map(str, stuck))} of {world_size} "
                f"{'are blocked in point-to-point calls' if len(stuck) != 1 else 'is blocked in a point-to-point call'} "
                f"that no rank can ever match. {recovery}")
    else:
        head = (f"{what} did not finish within {timeout:g} s: "
                f"{len(busy)} of {world_size} rank{'s' if world_size != 1 else ''} still running. {recovery}")
    lines = [head.rstrip(), ""]
    lines += [waiting[r] for r in busy]
    if finished:
        lines.append(f"finished: rank{'s' if len(finished) > 1 else ''} {', '.join(map(str, finished))}")
    if notes:
        lines += ["", *notes]
    if any(diagnose.RECEIVE_FIRST in n for n in notes):
        lines += ["Fix: let some ranks send first (for example even ranks send while odd ranks "
                  "receive), or post the receives with irecv and wait after sending."]
    if any(diagnose.SEND_FIRST in n for n in notes):
        lines += ["Fix: let some ranks receive first (for example even ranks send while odd ranks "
                  "receive), or send with isend and wait after receiving."]
    if any(diagnose.CALLS_DISAGREE in n for n in notes):
        lines += ["Fix: every rank must make the same collectives in the same order, with tensors of the "
                  "same size and dtype. Compare what each rank passes, or set TORCH_DISTRIBUTED_DEBUG=DETAIL "
                  "before the group is created: it checks every collective across ranks and names what differs."]
    if deadlock is not None:
        lines += ["", "Each rank's full stack is on the error's .stacks."]
        return DeadlockError("\n".join(lines), timeout=timeout, stacks=stacks, waiting=waiting, finished=finished,
                             notes=notes, seconds=deadlock.seconds, ranks=list(deadlock.ranks))
    lines += ["", "Each rank's full stack is on the error's .stacks. If the work is just slow, pass "
              "a larger timeout=."]
    return LaunchTimeoutError(
        "\n".join(lines), timeout=timeout, stacks=stacks, waiting=waiting, finished=finished, notes=notes
    )
