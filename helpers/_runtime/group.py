"""A group of ranks seen from the notebook: start them, talk to them, stop them.

:class:`RankGroup` is the one mechanism under both :func:`helpers.launch` (one call, then
exit) and persistent ranks (many calls between cells). It owns each rank's pipes, reads
their output while waiting, notices a rank that fails or dies,
reads the stacks of ranks that hang, and makes sure that every rank it started is gone
when it is closed, whatever happened.

Every wait is a loop in the calling thread around ``poll``: the Jupyter stop button's
``KeyboardInterrupt`` arrives right there, and output is printed from the thread that runs
the cell, so it lands under that cell.
"""

from __future__ import annotations

import dataclasses
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field

from . import wire as _wire
from .factory import Factory, FactoryError
from .report import Outcome, earliest, in_distributed_call
from .deadlock import DeadlockWatch
from ..output import OutputRouter
from .board import Board, BoardRecord
from .protocol import FD_NAMES, Death, Exited, Failure, GroupSpec, RankSpec, Ready, Request, Result, Spawned

__all__ = ["RankGroup", "RankState", "free_port", "kernel_sources", "PG_TIMEOUT_MARGIN"]

#: The last line of a rank's main-thread stack in a faulthandler dump: its outermost frame is
#: the rank factory's `python -c` module (see helpers._runtime.factory).
_DUMP_END = b'File "<string>", line'

#: The process group's own timeout is the request timeout plus this: ours must fire
#: first, so that a hang is diagnosed rather than ended by a gloo error.
PG_TIMEOUT_MARGIN = 30.0
# After an error raised inside torch.distributed, how long to wait for a rank's death
# that may be its real cause (its peers' calls fail at once when it dies).
_ECHO_GRACE = 0.5


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (for code that binds its own store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def kernel_sources(limit: int = 4 << 20) -> dict[str, list[str]]:
    """Source lines of code typed in notebook cells, so ranks can show them in tracebacks."""
    import linecache

    out, size = {}, 0
    for filename, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[1] is None and isinstance(entry[2], list):
            size += entry[0] or 0
            if size > limit:
                break
            out[filename] = entry[2]
    return out


@dataclass
class RankState:
    """What the notebook knows about one rank."""

    rank: int
    pid: int | None = None
    state: str = "starting"  # starting, idle, busy, exited
    exitcode: int | None = None
    main_thread: int | None = None
    fds: dict[str, int] = field(default_factory=dict)
    writer: _wire.FrameWriter | None = None
    reader: _wire.FrameReader = field(default_factory=_wire.FrameReader)
    diag: bytearray = field(default_factory=bytearray)


class RankGroup:
    """``world_size`` ranks forked by the factory, with their pipes open to this process.

    ``timeout`` is the longest a request will be given; the process group's own timeout
    is set above it (:data:`PG_TIMEOUT_MARGIN`). ``forbid`` maps call names to the reason
    shown when a rank calls one (see :meth:`helpers._runtime.instrument.Instrument.forbid`).
    """

    def __init__(
        self,
        factory: Factory,
        world_size: int,
        *,
        backend: str,
        timeout: float,
        nnodes: int = 1,
        init: bool = True,
        router: OutputRouter | None = None,
        devices: list[int] | None = None,
        extra_env: dict[str, str] | None = None,
        forbid: dict[str, str] | None = None,
    ) -> None:
        self.factory = factory
        self.world_size = world_size
        self.backend = backend
        self.nnodes = nnodes
        self.init = init
        self.pg_timeout = timeout + PG_TIMEOUT_MARGIN
        self.router = router or OutputRouter()
        self.devices = devices
        self.extra_env = extra_env or {}
        self.forbid = dict(forbid or {})
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
        world, nnodes = self.world_size, self.nnodes
        local_world = world // nnodes
        env = dict(os.environ)
        env.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(local_world),
                "GROUP_WORLD_SIZE": str(nnodes),
                "ROLE_WORLD_SIZE": str(world),
                "MPLBACKEND": "Agg",
                "PYTHONUNBUFFERED": "1",
                "HELPERS_PRESTART": "0",  # a rank that imports helpers starts no factory
            }
        )
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host
        env.update(self.extra_env)
        cpus = (self.factory.info or {}).get("cpus") or os.cpu_count() or 1
        store_path = None
        if self.init:  # the rendezvous store: a file in a folder of this group's own
            self.store_dir = tempfile.mkdtemp(prefix="helpers-rdzv-")
            store_path = os.path.join(self.store_dir, "store")
        return GroupSpec(
            world_size=world,
            backend=self.backend,
            init=self.init,
            pg_timeout=self.pg_timeout,
            env=env,
            cwd=os.getcwd(),
            sys_path=list(sys.path),
            threads=max(1, cpus // local_world) if nnodes == 1 else max(1, cpus // world),
            sources=kernel_sources(),
            store_path=store_path,
            store_dir=self.store_dir,  # the factory removes it if we cannot
            forbid=self.forbid,
        )

    def _open_pipes(self, state: RankState) -> list[int]:
        """Make one rank's pipes; keep our ends, return theirs in FD_NAMES order."""
        theirs: list[int] = []
        for name in FD_NAMES:
            if name == "board":
                theirs.append(os.dup(self.board.fd))
                continue
            read_end, write_end = os.pipe()
            ours, child = (write_end, read_end) if name == "cmd" else (read_end, write_end)
            theirs.append(child)
            state.fds[name] = ours
            os.set_blocking(ours, False)
            if name == "cmd":
                state.writer = _wire.FrameWriter(ours)
            else:
                self._by_fd[ours] = (state, name)
                self._poller.register(ours, select.POLLIN)
        return theirs

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

    # -- the wait loop ----------------------------------------------------------------

    def poll(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds for anything, and handle all that arrived.

        A request larger than a pipe holds (64 KiB: a function sent with its data) is
        written as the rank reads it: its command pipe is watched for room while part of
        it waits, so the rest goes as soon as there is room, not at the next wake-up.
        """
        ms = None if timeout is None else max(0, int(timeout * 1000))
        writing = [s.fds["cmd"] for s in self.ranks if s.writer is not None and s.writer.waiting and "cmd" in s.fds]
        for fd in writing:
            self._poller.register(fd, select.POLLOUT)
        try:
            ready = self._poller.poll(ms)
        finally:
            for fd in writing:
                self._poller.unregister(fd)
        # Output first: what a rank printed before it replied must appear before the reply.
        # Factory events last: a rank's reply is written before its exit can be reported.
        ready.sort(key=self._order)
        for fd, _ in ready:
            if fd == self.factory.fileno():
                self.factory.pump()
                continue
            entry = self._by_fd.get(fd)
            if entry is None:
                continue
            state, name = entry
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._close_fd(fd)
                if name in ("stdout", "stderr"):
                    self.router.flush(state.rank)
                continue
            if name in ("stdout", "stderr"):
                self.router.feed(state.rank, name, data)
            elif name == "diag":
                state.diag += data
            elif name == "reply":
                state.reader.feed(data)
                for reply in state.reader.messages():
                    self._on_reply(state, reply)
        for state in self.ranks:
            if state.writer is not None and state.writer.waiting:
                try:
                    state.writer.flush()
                except OSError:
                    state.writer = None

    def _order(self, item: tuple[int, int]) -> int:
        entry = self._by_fd.get(item[0])
        if entry is None:
            return 2
        return 0 if entry[1] in ("stdout", "stderr") else 1

    def _on_reply(self, state: RankState, reply: Ready | Result | Failure) -> None:
        if isinstance(reply, Ready):
            state.state = "idle"
            state.main_thread = reply.main_thread
            return
        if state.state == "busy":
            state.state = "idle"
        self.events.append(reply)

    def _close_fd(self, fd: int) -> None:
        try:
            self._poller.unregister(fd)
        except KeyError:
            pass
        self._by_fd.pop(fd, None)
        try:
            os.close(fd)
        except OSError:
            pass

    def send(self, rank: int, request: Request) -> None:
        """Queue a request for one rank; written as the pipe takes it."""
        state = self.ranks[rank]
        if state.writer is None:
            return
        try:
            state.writer.queue(request)
        except OSError:  # the rank is gone; its exit is reported separately
            state.writer = None

    def take_events(self) -> list[Result | Failure | Death]:
        events, self.events = self.events, []
        return events

    def _last_words(self, death: Death, rid: int | None) -> Failure | Death:
        """A rank died: the error it sent as it died, if any (its own cause), else the death.

        Reads its reply pipe to the end first, so nothing it sent is missed; other events
        read meanwhile stay queued.
        """
        fd = self.ranks[death.rank].fds.get("reply")
        deadline = time.monotonic() + 1.0
        while fd in self._by_fd and time.monotonic() < deadline:
            self.poll(0.02)
        last: Failure | Death = death
        keep = []
        for event in self.take_events():
            if isinstance(event, Failure) and event.rank == death.rank and event.id in (rid, None):
                last = event
            else:
                keep.append(event)
        self.events[:0] = keep
        return last

    def request(
        self,
        request: Request,
        ranks: list[int],
        timeout: float,
        *,
        fail_fast: bool = True,
        after_failure: float = 0.0,
    ) -> Outcome:
        """Send ``request`` to ``ranks`` and wait for their answers.

        Returns when every rank answered, at the timeout, once a rank failed (at once
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
        started = time.monotonic()
        deadline = started + timeout
        # The deadlock rules rely on gloo's point-to-point semantics (helpers._runtime.deadlock).
        watch = DeadlockWatch(self.board if "gloo" in self.backend else None, ranks, started,
                              exited=lambda r: self.ranks[r].state == "exited")
        failed_at = None
        while pending and not (fail_fast and outcome.failures):
            if outcome.failures and failed_at is None:
                failed_at = time.monotonic()
                deadline = min(deadline, failed_at + after_failure)
            if self.factory_dead:
                raise FactoryError(self.factory_dead)
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
            if pending and not outcome.failures:  # after a failure, its error is the story
                outcome.deadlock = watch.check(pending, outcome.replies)
                if outcome.deadlock is not None:
                    break
        outcome.pending = sorted(pending)
        return self._gather_evidence(outcome, rid, marks, aborted=fail_fast and bool(outcome.failures))

    def wait_ready(self, timeout: float) -> Outcome:
        """Wait until every rank has set up its process group (or one failed doing so)."""
        outcome = Outcome()
        deadline = time.monotonic() + timeout
        while True:
            if self.factory_dead:
                raise FactoryError(self.factory_dead)
            starting = [s.rank for s in self.ranks if s.state == "starting"]
            if not starting:
                break
            if time.monotonic() > deadline:
                outcome.pending = starting
                break
            self.poll(0.1)
            for event in self.take_events():
                if isinstance(event, Death):
                    event = self._last_words(event, None)
                if isinstance(event, (Failure, Death)):
                    outcome.failures.append(event)
            if outcome.failures:
                break
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

    # -- state ------------------------------------------------------------------------

    @property
    def live(self) -> list[int]:
        return [s.rank for s in self.ranks if s.state != "exited"]

    # -- signals and stacks -----------------------------------------------------------

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        if self.factory_dead or not self.live:
            return
        try:
            self.factory.signal(self.gid, sig, ranks)
        except FactoryError:
            pass

    def dump_stacks(self, ranks: list[int], wait: float = 3.0) -> dict[int, str]:
        """Ask ranks for their Python stacks; returns rank -> faulthandler dump text.

        The dumps usually arrive within milliseconds. ``wait`` is long because the signal
        goes through the rank factory, which is deaf for a second or two while it does its
        one idle warm-up import (helpers._runtime.factory); a shorter wait then found no stack.
        """
        ranks = [r for r in ranks if self.ranks[r].state != "exited"]
        if not ranks:
            return {}
        before = {r: len(self.ranks[r].diag) for r in ranks}
        self.signal(signal.SIGUSR1, ranks)
        deadline = time.monotonic() + wait

        def complete(r: int) -> bool:
            # faulthandler writes a dump line by line, innermost frame first; a rank's main
            # thread ends with the factory's start-up frame, File "<string>". A pause in the
            # middle of a dump (a busy machine) must not cut it short: that would lose the
            # learner's own frame, which comes after torch's.
            if self.ranks[r].state == "exited":
                return True
            text = self.ranks[r].diag[before[r]:]
            end = text.rfind(_DUMP_END)
            return end >= 0 and b"\n" in text[end:]

        while time.monotonic() < deadline and not all(complete(r) for r in ranks):
            self.poll(0.05)
        return {r: bytes(self.ranks[r].diag[before[r]:]).decode("utf-8", "replace") for r in ranks}

    def read_board(self) -> list[BoardRecord]:
        """What each rank notes it is doing right now (its phase, its torch.distributed call)."""
        return self.board.read() if self.board is not None else []

    # -- stop -------------------------------------------------------------------------

    def wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.live and not self.factory_dead:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.poll(min(remaining, 0.05))
        return True

    def stop(self, escalate: tuple[tuple[int, float], ...] | None = None) -> None:
        """Stop every rank still running, escalating signals; always ends with none left.

        The default sequence is SIGTERM, then SIGKILL after 1 s. A second interrupt while
        stopping goes straight to SIGKILL.
        """
        steps = escalate or ((signal.SIGTERM, 1.0),)
        try:
            for sig, grace in steps:
                if not self.live:
                    break
                self.signal(sig)
                if self.wait_exit(grace):
                    break
        except KeyboardInterrupt:
            pass
        finally:
            self._kill_and_reap()

    def _kill_and_reap(self) -> None:
        deadline = time.monotonic() + 10
        while self.live and not self.factory_dead and time.monotonic() < deadline:
            self.signal(signal.SIGKILL)
            try:
                self.wait_exit(1.0)
            except KeyboardInterrupt:
                continue

    def close(self, grace: float = 5.0) -> None:
        """Close the command pipes (ranks exit cleanly), then make sure all are gone."""
        if self._closed:
            return
        try:
            deadline = time.monotonic() + grace
            for state in self.ranks:
                # Let queued requests go out before the end-of-file tells the rank to exit.
                while state.writer is not None and state.writer.waiting and time.monotonic() < deadline:
                    self.poll(0.01)
                if state.fds.get("cmd") is not None:
                    try:
                        os.close(state.fds.pop("cmd"))
                    except OSError:
                        pass
                    state.writer = None
            if not self.wait_exit(max(0.0, deadline - time.monotonic())):
                self.stop()
        finally:
            self._kill_and_reap()
            self._release()

    def _release(self) -> None:
        # Drain what is left of the output so the last lines are not lost, then close all.
        end = time.monotonic() + 0.5
        while any(name in ("stdout", "stderr") for _, name in self._by_fd.values()) and time.monotonic() < end:
            try:
                self.poll(0.02)
            except KeyboardInterrupt:
                break
        self.router.flush()
        for fd in list(self._by_fd):
            self._close_fd(fd)
        for state in self.ranks:
            fd = state.fds.pop("cmd", None)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
            state.writer = None
        try:
            self._poller.unregister(self.factory.fileno())
        except (KeyError, ValueError):
            pass
        self.factory.forget_group(self.gid)
        if self.board is not None:
            self.board.close()
            self.board = None
        if self.store_dir is not None:
            shutil.rmtree(self.store_dir, ignore_errors=True)
            self.store_dir = None
        self._closed = True
