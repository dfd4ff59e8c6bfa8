"""The pipe half of a group of ranks: each rank's pipes, read and written without blocking.

:class:`RankIO` is what :class:`~helpers._runtime.group.RankGroup` waits with: ``poll``
reads what the ranks printed (to the output router), their replies (to ``events``) and
their diagnostics (kept per rank), and writes queued requests as the pipes take them.
It keeps no state of its own: it works on the group's ``ranks``, ``router``, ``factory``,
``events`` and its poller.
"""

from __future__ import annotations

import os
import select
import signal
import time
from dataclasses import dataclass, field

from . import wire as _wire
from .diagnose import dump_complete
from .protocol import FD_NAMES, Death, Failure, Ready, Request, Result, Started

__all__ = ["RankIO", "RankState"]

#: The most reads of one output pipe when a rank's reply arrives (:meth:`RankIO.drain_output`):
#: 16 of up to 64 KiB, four times what a pipe holds.
_DRAIN_READS = 16


@dataclass
class RankState:
    """What the notebook knows about one rank."""

    rank: int
    pid: int | None = None
    state: str = "starting"  # starting, idle, busy, exited
    started: int | None = None  # the last request whose learner's part it began (Started)
    exitcode: int | None = None
    main_thread: int | None = None
    fds: dict[str, int] = field(default_factory=dict)
    writer: _wire.FrameWriter | None = None
    reader: _wire.FrameReader = field(default_factory=_wire.FrameReader)
    diag: bytearray = field(default_factory=bytearray)


class RankIO:
    """Reading and writing the ranks' pipes; a base of :class:`~helpers._runtime.group.RankGroup`."""

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
            data = self._read(fd, state, name)
            if not data:
                continue
            if name in ("stdout", "stderr"):
                self.router.feed(state.rank, name, data)
            elif name == "diag":
                state.diag += data
            elif name == "reply":
                state.reader.feed(data)
                for reply in state.reader.messages():
                    if isinstance(reply, (Result, Failure)):
                        # Everything the rank printed before this reply is in its pipes by
                        # now, but those pipes may not have been ready when this wait began
                        # (the rank printed and replied while we were on our way here).
                        self.drain_output(state)
                    self._on_reply(state, reply)
        for state in self.ranks:
            if state.writer is not None and state.writer.waiting:
                try:
                    state.writer.flush()
                except OSError:
                    state.writer = None

    def _read(self, fd: int, state: RankState, name: str) -> bytes | None:
        """One read from a rank's pipe: its bytes, None when there are none now, ``b""`` at
        its end (the pipe is then closed, and an output stream's unfinished line passed on)."""
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:
            self._close_fd(fd)
            if name in ("stdout", "stderr"):
                self.router.flush(state.rank)
        return data

    def drain_output(self, state: RankState) -> None:
        """Pass on everything a rank's stdout and stderr pipes hold right now, without waiting.

        Called when a rank's reply arrives (and when it died): what it wrote before then is
        readable, so its lines reach the request they belong to, not the next one. A pipe
        holds 64 KiB; a thread of the rank's own that goes on printing after the reply could
        keep it filling, so at most :data:`_DRAIN_READS` reads are made per stream.
        """
        for name in ("stdout", "stderr"):
            fd = state.fds.get(name)
            reads = 0
            # Only while the descriptor is still this pipe's: once closed, its number may be reused.
            while (fd is not None and reads < _DRAIN_READS and (entry := self._by_fd.get(fd)) is not None
                   and entry[0] is state and entry[1] == name):
                reads += 1
                data = self._read(fd, state, name)
                if not data:
                    break
                self.router.feed(state.rank, name, data)

    def _order(self, item: tuple[int, int]) -> int:
        entry = self._by_fd.get(item[0])
        if entry is None:
            return 2
        return 0 if entry[1] in ("stdout", "stderr") else 1

    def _on_reply(self, state: RankState, reply: Ready | Started | Result | Failure) -> None:
        if isinstance(reply, Ready):
            if state.state == "starting":  # else a launch's request already waits for it: busy
                state.state = "idle"
            state.main_thread = reply.main_thread
            return
        if isinstance(reply, Started):
            state.started = reply.id
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
        self.drain_output(self.ranks[death.rank])  # what it printed as it died goes with its error
        last: Failure | Death = death
        keep = []
        for event in self.take_events():
            if isinstance(event, Failure) and event.rank == death.rank and event.id in (rid, None):
                last = event
            else:
                keep.append(event)
        self.events[:0] = keep
        return last

    def dump_stacks(self, ranks: list[int], wait: float = 3.0) -> dict[int, str]:
        """Ask ranks for their Python stacks; returns rank -> faulthandler dump text.

        The signal goes through the rank factory, which sends it at once even during its
        warm-up import (seconds on a busy machine: :func:`helpers._runtime.factory_process._warm_up`),
        and the dumps usually arrive within milliseconds. Waiting ends as soon as every dump
        is whole; ``wait`` only bounds it for a rank too starved of CPU to write one.
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
            return dump_complete(bytes(self.ranks[r].diag[before[r]:]))

        while time.monotonic() < deadline and not all(complete(r) for r in ranks):
            self.poll(0.05)
        return {r: bytes(self.ranks[r].diag[before[r]:]).decode("utf-8", "replace") for r in ranks}
