"""A request to ranks kept between cells: ask, and when it fails, interrupt the rest.

A launch ends its ranks whatever happens (:mod:`helpers.launcher`). Persistent ranks
(:class:`helpers.Cluster`) keep their variables from one cell to the next, so a request
that fails must leave the others able to take the next one. :func:`ask` sends one request
to ranks of a running group and returns the outcome once every one answered; otherwise it
raises the notebook's error, having first interrupted the ranks still running
(:func:`interrupt`: SIGINT, which ends a rank's request, not the rank):

- a rank failed, or the timeout passed: the ranks still busy are interrupted, except those
  found deadlocked in point-to-point calls (an interrupt cannot reach them inside gloo);
  the error (:func:`~helpers._runtime.report.kept_ranks_error`) says which ranks keep their
  state and which need a restart;
- the stop button: the busy ranks are interrupted, and
  :class:`~helpers.Interrupted` names those that did not stop.

Example (``cluster._group``, a running :class:`~helpers._runtime.group.RankGroup`)::

    >>> outcome = ask(group, Exec(0, "x = rank", "<cell>"), [0, 1], 10.0, after_failure=2.0)
    >>> sorted(outcome.replies)
    [0, 1]
"""

from __future__ import annotations

import signal
import time

from ..errors import LaunchError
from .group import RankGroup
from .protocol import Exec, Request
from .report import Outcome, interrupted_cell, kept_ranks_error, not_interrupted_note

__all__ = ["ask", "interrupt", "INTERRUPT_WAIT"]

#: Seconds interrupted ranks are given to end their request.
INTERRUPT_WAIT = 1.5


def ask(group: RankGroup, request: Request, ranks: list[int], timeout: float, *, after_failure: float) -> Outcome:
    """Send ``request`` to ``ranks`` of ``group`` (each able to take it) and wait up to
    ``timeout`` seconds; the outcome when every one answered, else the error is raised.

    After a failure the others get ``after_failure`` seconds to finish on their own. Output
    goes to ``group.router``, flushed before this returns or raises.
    """
    try:
        outcome = group.request(request, ranks, timeout, fail_fast=False, after_failure=after_failure)
    except KeyboardInterrupt:
        busy = [r for r in ranks if group.ranks[r].state == "busy"]
        stuck = interrupt(group, busy)
        raise interrupted_cell(busy, stuck) from None
    finally:
        group.router.flush()
    if not outcome.ok:
        raise _error(group, outcome, request, timeout)
    return outcome


def interrupt(group: RankGroup, busy: list[int], announce: bool = True) -> list[int]:
    """Send SIGINT to the ``busy`` ranks; returns those still busy after :data:`INTERRUPT_WAIT`
    seconds (blocked in a communication call), with a note saying so when ``announce``."""
    if not busy:
        return []
    group.signal(signal.SIGINT, busy)
    deadline = time.monotonic() + INTERRUPT_WAIT
    while time.monotonic() < deadline and any(group.ranks[r].state == "busy" for r in busy):
        try:
            group.poll(0.05)
        except KeyboardInterrupt:
            break
    group.take_events()
    stuck = [r for r in busy if group.ranks[r].state == "busy"]
    if stuck and announce:
        group.router.note(not_interrupted_note(stuck))
    return stuck


def _error(group: RankGroup, outcome: Outcome, request: Request, timeout: float) -> LaunchError:
    """Interrupt the ranks still running, then the error for the request, saying what
    state the group is left in.

    Deadlocked ranks (``outcome.deadlock``) are blocked inside gloo, where an interrupt
    cannot reach them: they are not tried, and the error says to restart.
    """
    deadlocked = list(outcome.deadlock.ranks) if outcome.deadlock is not None else []
    stuck = interrupt(group, [r for r in outcome.pending if r not in deadlocked], announce=False)
    what = "The cell" if isinstance(request, Exec) else "The call"
    return kept_ranks_error(outcome, group.world_size, timeout, deadlocked=deadlocked, stuck=stuck, what=what)
