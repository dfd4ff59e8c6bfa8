"""A group of ranks seen from the notebook: start them, talk to them, stop them.

:class:`RankGroup` is the one mechanism under both :func:`helpers.launch` (one call, then
exit) and persistent ranks (many calls between cells). It owns each rank's pipes, reads
their output while waiting, notices a rank that fails or dies,
reads the stacks of ranks that hang, and makes sure that every rank it started is gone
when it is closed, whatever happened.

Every wait is a loop in the calling thread around ``poll``: the Jupyter stop button's
``KeyboardInterrupt`` arrives right there, and output is printed from the thread that runs
the cell, so it lands under that cell.

Its pipe half (reading and writing each rank's pipes, a dying rank's last words, the
stacks of hung ranks) is :class:`~helpers._runtime.rankio.RankIO`; its ending (signals,
``stop``, ``close``) is :class:`~helpers._runtime.ending.GroupEnding`; what each rank is
told at start is :func:`~helpers._runtime.spec.group_spec`.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import time

from ..output import OutputRouter
from ..settings import LaunchSettings
from .board import Board, BoardRecord
from .deadlock import DeadlockWatch
from .ending import GroupEnding
from .factory import Factory, FactoryError
from .protocol import Death, Exited, Failure, GroupSpec, RankSpec, Request, Result, Spawned
from .rankio import RankIO, RankState
from .report import Outcome, earliest, in_distributed_call
from .spec import PG_TIMEOUT_MARGIN, group_spec

__all__ = ["RankGroup", "START_LIMIT", "start_limit"]

# After an error raised inside torch.distributed, how long to wait for a rank's death
# that may be its real cause (its peers' calls fail at once when it dies).
_ECHO_GRACE = 0.5

#: The least time ranks get to start a request, in seconds: to be forked (the factory may
#: first finish its warm-up import), join the process group and load what was sent (a
#: function's unpickling imports the modules it uses). Seconds each on a busy machine.
START_LIMIT = 60.0


def start_limit(timeout: float) -> float:
    """How long ranks get to start a request whose own ``timeout`` is given: :data:`START_LIMIT`, or more.

    >>> start_limit(2.0), start_limit(300.0)
    (60.0, 300.0)
    """
    return max(START_LIMIT, timeout)


class RankGroup(RankIO, GroupEnding):
    """``settings.world_size`` ranks forked by the factory, with their pipes open to this process.

    ``settings`` (:class:`~helpers.settings.LaunchSettings`) says how many ranks, on how
    many simulated hosts, with or without a process group, and which calls are switched off
    (see :meth:`helpers._runtime.instrument.Instrument.forbid`); ``settings.timeout`` is the
    longest a request will be given once every rank has started it (:meth:`request`), and
    the process group's own timeout is set above that and the start-up limit together (a
    rank that started first may wait in a collective for the last one all that time;
    :data:`~helpers._runtime.spec.PG_TIMEOUT_MARGIN`). ``init_backend`` is the backend the
    process group is made with (``settings.backend`` resolved, :func:`helpers.backend.resolve_backend`).
    """

    def __init__(
        self,
        factory: Factory,
        settings: LaunchSettings,
        *,
        init_backend: str,
        router: OutputRouter | None = None,
        devices: list[int] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.factory = factory
        self.settings = settings
        self.world_size = world_size = settings.world_size
        self.backend = init_backend
        self.nnodes = settings.nnodes
        self.init = settings.init
        self.pg_timeout = start_limit(settings.timeout) + settings.timeout + PG_TIMEOUT_MARGIN
        self.router = router or OutputRouter()
        self.devices = devices
        self.extra_env = extra_env or {}
        self.forbid = dict(settings.forbid)
        self.board: Board | None = None
        self.store_dir: str | None = None
        self.ranks = [RankState(r) for r in range(world_size)]
        self.events: list[Result | Failure | Death] = []
        self.factory_dead: str | None = None
        self._by_fd: dict[int, tuple[RankState, str]] = {}
        self._poller = select.poll()
        self._closed = False
        self._next_id = 0
        self.gid = factory.new_group(self._on_factory_event)

    # -- start ------------------------------------------------------------------------

    def _group_spec(self) -> GroupSpec:
        """What every rank of this group is told at start (its rendezvous folder is kept to remove)."""
        spec = group_spec(self.world_size, self.nnodes, self.backend, init=self.init, pg_timeout=self.pg_timeout,
                          extra_env=self.extra_env, forbid=self.forbid, cpus=(self.factory.info or {}).get("cpus"))
        self.store_dir = spec.store_dir
        return spec

    def start(self) -> "RankGroup":
        """Fork the ranks. Returns at once; they initialise while we go on."""
        group = self._group_spec()
        local_world = self.world_size // self.nnodes
        # The board: a few bytes per rank where each rank notes what it is doing.
        self.board = Board.create(self.world_size)
        specs, child_fds = [], []
        for state in self.ranks:
            r = state.rank
            theirs = self._open_pipes(state)
            specs.append(RankSpec(
                rank=r,
                fds=list(range(len(child_fds), len(child_fds) + len(theirs))),
                device=self.devices[r] if self.devices else None,
                env={"RANK": str(r), "LOCAL_RANK": str(r % local_world),
                     "GROUP_RANK": str(r // local_world), "ROLE_RANK": str(r)},
            ))
            child_fds.extend(theirs)
        try:
            self.factory.spawn(self.gid, specs, group, child_fds)
        finally:
            for fd in child_fds:
                os.close(fd)
        self._poller.register(self.factory.fileno(), select.POLLIN)
        return self

    # -- factory events ---------------------------------------------------------------

    def _on_factory_event(self, event: Spawned | Exited | None) -> None:
        if isinstance(event, Spawned):
            for state, pid in zip(self.ranks, event.pids):
                state.pid = pid
        elif isinstance(event, Exited):
            state = self.ranks[event.rank]
            state.exitcode = event.code
            state.state = "exited"
            self.events.append(Death(state.rank, event.code))
        else:  # the factory died, and every rank with it
            self.factory_dead = self.factory.dead
            for state in self.ranks:
                if state.state != "exited":
                    state.state = "exited"
                    state.exitcode = state.exitcode if state.exitcode is not None else -signal.SIGKILL

    # -- the wait loop (poll, send and take_events: RankIO) ------------------------------

    def request(
        self,
        request: Request,
        ranks: list[int],
        timeout: float,
        *,
        fail_fast: bool = True,
        after_failure: float = 0.0,
        start: float | None = None,
    ) -> Outcome:
        """Send ``request`` to ``ranks`` and wait for their answers.

        The wait has two parts. Start-up, up to ``start`` seconds (by default
        :func:`start_limit` of ``timeout``): until every rank has started the request (said
        :class:`~helpers._runtime.protocol.Started`, having set up, joined the process group
        and loaded what was sent; a rank that answered started too). Then the learner's
        code, up to ``timeout`` seconds from the moment the last rank started. Ranks that do
        not start in time are ``outcome.unstarted``; a hang is only ever reported about
        ranks that all started.

        Returns when every rank answered, at either limit, once a rank failed (at once
        with ``fail_fast``, else ``after_failure`` seconds later: time for the others to
        finish on their own), or about a second after ranks it waits for deadlocked in
        point-to-point calls (``outcome.deadlock``; see :mod:`helpers._runtime.deadlock`). Never
        raises for rank problems: the outcome carries the evidence (root cause, its crash
        stack, the board, hung ranks' stacks) and the caller decides.
        """
        self._next_id += 1
        rid = self._next_id
        request = dataclasses.replace(request, id=rid)
        marks = {r: len(self.ranks[r].diag) for r in ranks}
        outcome = Outcome()
        pending = set()
        for r in ranks:
            if self.ranks[r].state == "exited":
                outcome.failures.append(Death(r, self.ranks[r].exitcode, 0.0))
                continue
            self.ranks[r].state = "busy"
            self.send(r, request)
            pending.add(r)
        unstarted = set(pending)
        outcome.start_limit = start_limit(timeout) if start is None else start
        start_by = time.monotonic() + outcome.start_limit
        begun: float | None = None  # when the last rank started: the learner's time starts
        watch: DeadlockWatch | None = None
        failed_at = None
        while pending and not (fail_fast and outcome.failures):
            if outcome.failures and failed_at is None:
                failed_at = time.monotonic()
            if self.factory_dead:
                raise FactoryError(self.factory_dead)
            unstarted = {r for r in unstarted if r in pending and self.ranks[r].started != rid}
            if begun is None and not unstarted:
                begun = time.monotonic()
                # The deadlock rules rely on gloo's point-to-point semantics (helpers._runtime.deadlock).
                watch = DeadlockWatch(self.board if "gloo" in self.backend else None, ranks, begun,
                                      exited=lambda r: self.ranks[r].state == "exited")
            deadline = start_by if begun is None else begun + timeout
            if failed_at is not None:
                deadline = min(deadline, failed_at + after_failure)
            events = self.take_events()  # what arrived while we were doing something else
            if not events:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.poll(min(remaining, 0.25))
                events = self.take_events()
            for event in events:
                if isinstance(event, Death):
                    event = self._last_words(event, rid)
                    if event.rank in pending or isinstance(event, Failure):
                        outcome.failures.append(event)
                        pending.discard(event.rank)
                elif event.id not in (rid, None):
                    continue  # an answer to an earlier request that was given up on
                elif isinstance(event, Failure):
                    outcome.failures.append(event)
                    pending.discard(event.rank)
                else:
                    outcome.replies[event.rank] = event
                    pending.discard(event.rank)
            if watch is not None and pending and not outcome.failures:  # after a failure, its error is the story
                outcome.deadlock = watch.check(pending, outcome.replies)
                if outcome.deadlock is not None:
                    break
        outcome.pending = sorted(pending)
        outcome.unstarted = sorted(r for r in unstarted if r in pending and self.ranks[r].started != rid)
        return self._gather_evidence(outcome, rid, marks, aborted=fail_fast and bool(outcome.failures))

    def wait_ready(self, timeout: float) -> Outcome:
        """Wait until every rank has set up its process group (or one failed doing so);
        those that had not after ``timeout`` seconds are ``outcome.pending`` and ``outcome.unstarted``."""
        outcome = Outcome(start_limit=timeout)
        deadline = time.monotonic() + timeout
        while True:
            if self.factory_dead:
                raise FactoryError(self.factory_dead)
            for event in self.take_events():  # before the states: a rank that died is no longer "starting"
                if isinstance(event, Death):
                    event = self._last_words(event, None)
                if isinstance(event, (Failure, Death)):
                    outcome.failures.append(event)
            starting = [s.rank for s in self.ranks if s.state == "starting"]
            if outcome.failures or not starting:
                break
            if time.monotonic() > deadline:
                outcome.pending, outcome.unstarted = starting, list(starting)
                break
            self.poll(0.1)
        return self._gather_evidence(outcome, None, {}, aborted=bool(outcome.failures))

    def _gather_evidence(self, outcome: Outcome, rid: int | None, marks: dict[int, int], aborted: bool) -> Outcome:
        """Add what explains a failed request: the root cause and its crash stack, and the
        board and stacks of the ranks still running (unless waiting was ``aborted`` at the
        first failure: they are then about to be stopped, and not part of the story)."""
        outcome.main_threads = {s.rank: s.main_thread for s in self.ranks}
        if outcome.failures:
            if aborted and outcome.pending:
                self._wait_for_death(outcome, rid)
            outcome.cause = earliest(outcome.failures)
            rank = outcome.cause.rank
            outcome.diag = bytes(self.ranks[rank].diag[marks.get(rank, 0):]).decode("utf-8", "replace")
        if outcome.pending and not aborted:
            outcome.board = self.read_board()
            outcome.stacks = self.dump_stacks(outcome.pending)
        return outcome

    def _wait_for_death(self, outcome: Outcome, rid: int | None) -> None:
        """When the first error was raised inside torch.distributed it may be an echo of a
        rank that died (its peers' calls fail at once, and their errors can arrive before
        the factory reports the death): wait briefly for such a death."""
        if any(isinstance(f, Death) for f in outcome.failures) or not in_distributed_call(earliest(outcome.failures)):
            return
        known = {f.rank for f in outcome.failures}
        deadline = time.monotonic() + _ECHO_GRACE
        while time.monotonic() < deadline:
            self.poll(0.02)
            deaths = [e for e in self.take_events() if isinstance(e, Death) and e.rank not in known]
            if deaths:
                outcome.failures += [self._last_words(d, rid) for d in deaths]
                return

    # -- the board (the stacks: RankIO.dump_stacks) -------------------------------------

    def read_board(self) -> list[BoardRecord]:
        """What each rank notes it is doing right now (its phase, its torch.distributed call)."""
        return self.board.read() if self.board is not None else []
