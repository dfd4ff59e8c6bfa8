"""A group of ranks seen from the notebook: start them, talk to them, stop them.

:class:`RankGroup` is the one mechanism under both :func:`helpers.launch` (one call, then
exit) and persistent ranks (many calls between cells). It owns each rank's pipes, reads
their output while waiting, relays the rendezvous port, notices a rank that fails or dies,
reads the stacks of ranks that hang, and makes sure that every rank it started is gone
when it is closed, whatever happened.

Every wait is a loop in the calling thread around ``poll``: the Jupyter stop button's
``KeyboardInterrupt`` arrives right there, and output is printed from the thread that runs
the cell, so it lands under that cell.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from . import _wire
from ._factory import Factory, FactoryError
from ._instrument import BOARD_SLOT, read_board
from ._rank import FD_NAMES
from .output import OutputRouter

__all__ = ["RankGroup", "RankState", "Outcome", "free_port", "kernel_sources"]


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
    replies: list[dict] = field(default_factory=list)


@dataclass
class Outcome:
    """How a request to several ranks ended."""

    replies: dict[int, dict] = field(default_factory=dict)  # rank -> result message
    failures: list[dict] = field(default_factory=list)  # error replies and unexpected exits
    pending: list[int] = field(default_factory=list)  # ranks still busy at the deadline


class RankGroup:
    """``world_size`` ranks forked by the factory, with their pipes open to this process."""

    def __init__(
        self,
        factory: Factory,
        world_size: int,
        *,
        backend: str,
        nnodes: int = 1,
        init: bool = True,
        pg_timeout: float = 300.0,
        router: OutputRouter | None = None,
        devices: list[int] | None = None,
        extra_env: dict[str, str] | None = None,
        forbid: tuple[str, ...] = (),
        forbid_reason: str = "",
    ) -> None:
        self.factory = factory
        self.world_size = world_size
        self.backend = backend
        self.nnodes = nnodes
        self.init = init
        self.pg_timeout = pg_timeout
        self.router = router or OutputRouter()
        self.devices = devices
        self.extra_env = extra_env or {}
        self.forbid = tuple(forbid)
        self.forbid_reason = forbid_reason
        self.board = None
        self.board_fd = None
        self.store_dir: str | None = None
        self.ranks = [RankState(r) for r in range(world_size)]
        self.events: list[dict] = []
        self.factory_dead: str | None = None
        self._by_fd: dict[int, tuple[RankState, str]] = {}
        self._poller = select.poll()
        self._closed = False
        self.gid = factory.new_group(self._on_factory_event)

    # -- start ------------------------------------------------------------------------

    def start(self) -> "RankGroup":
        """Fork the ranks. Returns at once; they initialise while we go on."""
        world, nnodes = self.world_size, self.nnodes
        local_world = world // nnodes
        master_port = free_port()
        env = dict(os.environ)
        env.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master_port),
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
        common = {
            "world_size": world,
            "backend": self.backend,
            "init": self.init,
            "master_addr": "127.0.0.1",
            "pg_timeout": self.pg_timeout,
            "env": env,
            "cwd": os.getcwd(),
            "sys_path": list(sys.path),
            "threads": max(1, cpus // local_world) if nnodes == 1 else max(1, cpus // world),
            "sources": kernel_sources(),
        }
        if self.init:  # the rendezvous store: a file in a folder of this group's own
            self.store_dir = tempfile.mkdtemp(prefix="helpers-rdzv-")
            common["store_path"] = os.path.join(self.store_dir, "store")
            common["store_dir"] = self.store_dir  # the factory removes it if we cannot
        if self.forbid:
            common["forbid"] = list(self.forbid)
            common["forbid_reason"] = self.forbid_reason
        # The board: a few bytes per rank where each rank notes the call it is in.
        self.board_fd = os.memfd_create("helpers-board", os.MFD_CLOEXEC)
        os.ftruncate(self.board_fd, BOARD_SLOT * world)
        self.board = mmap.mmap(self.board_fd, BOARD_SLOT * world)
        specs, child_fds = [], []
        for state in self.ranks:
            r = state.rank
            ours: dict[str, int] = {}
            theirs: list[int] = []
            for name in FD_NAMES:
                if name == "board":
                    theirs.append(os.dup(self.board_fd))
                    continue
                read_end, write_end = os.pipe()
                if name == "cmd":  # we write, the rank reads
                    ours[name], child = write_end, read_end
                else:
                    ours[name], child = read_end, write_end
                theirs.append(child)
            specs.append(
                {
                    "rank": r,
                    "fds": list(range(len(child_fds), len(child_fds) + len(theirs))),
                    "device": self.devices[r] if self.devices else None,
                    "env": {
                        "RANK": str(r),
                        "LOCAL_RANK": str(r % local_world),
                        "GROUP_RANK": str(r // local_world),
                        "ROLE_RANK": str(r),
                    },
                }
            )
            child_fds.extend(theirs)
            state.fds = ours
            for name, fd in ours.items():
                os.set_blocking(fd, False)
                if name == "cmd":
                    state.writer = _wire.FrameWriter(fd)
                else:
                    self._by_fd[fd] = (state, name)
                    self._poller.register(fd, select.POLLIN)
        try:
            self.factory.spawn(self.gid, specs, common, child_fds)
        finally:
            for fd in child_fds:
                os.close(fd)
        self._poller.register(self.factory.fileno(), select.POLLIN)
        return self

    # -- factory events ---------------------------------------------------------------

    def _on_factory_event(self, event: dict) -> None:
        kind = event["ev"]
        if kind == "spawned":
            for state, pid in zip(self.ranks, event["pids"]):
                state.pid = pid
        elif kind == "exit":
            state = self.ranks[event["rank"]]
            state.exitcode = event["code"]
            state.state = "exited"
            self.events.append({"ev": "exit", "rank": state.rank, "code": event["code"], "time": time.time()})
        elif kind == "factory_died":
            self.factory_dead = event["reason"]
            for state in self.ranks:
                if state.state != "exited":
                    state.state = "exited"
                    state.exitcode = state.exitcode if state.exitcode is not None else -signal.SIGKILL

    # -- the wait loop ----------------------------------------------------------------

    def poll(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds for anything, and handle all that arrived."""
        ms = None if timeout is None else max(0, int(timeout * 1000))
        ready = self._poller.poll(ms)
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
                for message in state.reader.messages():
                    self._on_reply(state, message)
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

    def drain(self, rank: int, timeout: float = 1.0) -> None:
        """Read a rank's reply pipe to its end (after it exited), so no reply is missed."""
        fd = self.ranks[rank].fds.get("reply")
        deadline = time.monotonic() + timeout
        while fd in self._by_fd and time.monotonic() < deadline:
            self.poll(0.02)

    def _on_reply(self, state: RankState, message: dict) -> None:
        kind = message["ev"]
        if kind == "ready":
            state.state = "idle"
            state.main_thread = message["main_thread"]
        else:
            if message.get("id") is not None or kind == "error":
                state.state = "idle" if state.state == "busy" else state.state
            message["rank"] = state.rank
            message.setdefault("time", time.time())
            state.replies.append(message)
            self.events.append(message)

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

    def send(self, rank: int, message: dict) -> None:
        """Queue a request for one rank; written as the pipe takes it."""
        state = self.ranks[rank]
        if state.writer is None:
            return
        try:
            state.writer.queue(message)
        except OSError:  # the rank is gone; its exit is reported separately
            state.writer = None

    def take_events(self) -> list[dict]:
        events, self.events = self.events, []
        return events

    def request(
        self,
        message: dict,
        ranks: list[int],
        timeout: float,
        *,
        fail_fast: bool = True,
        after_failure: float = 0.0,
    ) -> Outcome:
        """Send ``message`` to ``ranks`` and wait for their answers.

        Returns when every rank answered, at the timeout, or once a rank failed: at once
        with ``fail_fast``, else ``after_failure`` seconds later (time for the others to
        finish on their own). Never raises for rank problems; the caller decides.
        """
        self._next_id = getattr(self, "_next_id", 0) + 1
        rid = self._next_id
        outcome = Outcome()
        pending = set()
        for r in ranks:
            if self.ranks[r].state == "exited":
                outcome.failures.append({"ev": "exit", "rank": r, "code": self.ranks[r].exitcode, "time": 0.0})
                continue
            self.ranks[r].state = "busy"
            self.send(r, {**message, "id": rid})
            pending.add(r)
        deadline = time.monotonic() + timeout
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
                r = event["rank"]
                if event["ev"] == "exit":
                    self.drain(r)
                    for late in self.take_events():  # an error the rank sent as it died
                        if late["ev"] == "error" and late["rank"] == r and late.get("id") in (rid, None):
                            event = late
                    if r in pending or event["ev"] == "error":
                        outcome.failures.append(event)
                        pending.discard(r)
                elif event.get("id") not in (rid, None):
                    continue  # an answer to an earlier request that was given up on
                elif event["ev"] == "error":
                    outcome.failures.append(event)
                    pending.discard(r)
                elif event["ev"] == "result":
                    outcome.replies[r] = event
                    pending.discard(r)
        outcome.pending = sorted(pending)
        return outcome

    # -- state ------------------------------------------------------------------------

    @property
    def live(self) -> list[int]:
        return [s.rank for s in self.ranks if s.state != "exited"]

    @property
    def pids(self) -> list[int | None]:
        return [s.pid for s in self.ranks]

    def wait_spawned(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while any(s.pid is None for s in self.ranks) and not self.factory_dead:
            if time.monotonic() > deadline:
                raise FactoryError("the rank factory did not answer a start request in time")
            self.poll(0.05)
        if self.factory_dead:
            raise FactoryError(self.factory_dead)

    # -- signals and stacks -----------------------------------------------------------

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        if self.factory_dead or not self.live:
            return
        try:
            self.factory.signal(self.gid, sig, ranks)
        except FactoryError:
            pass

    def dump_stacks(self, ranks: list[int], wait: float = 1.0) -> dict[int, str]:
        """Ask ranks for their Python stacks; returns rank -> faulthandler dump text."""
        ranks = [r for r in ranks if self.ranks[r].state != "exited"]
        if not ranks:
            return {}
        before = {r: len(self.ranks[r].diag) for r in ranks}
        self.signal(signal.SIGUSR1, ranks)
        deadline = time.monotonic() + wait
        quiet_since = None
        while time.monotonic() < deadline:
            sizes = {r: len(self.ranks[r].diag) for r in ranks}
            self.poll(0.05)
            grew = any(len(self.ranks[r].diag) != sizes[r] for r in ranks)
            everyone = all(len(self.ranks[r].diag) > before[r] or self.ranks[r].state == "exited" for r in ranks)
            if everyone and not grew:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 0.1:
                    break
            else:
                quiet_since = None
        return {r: bytes(self.ranks[r].diag[before[r]:]).decode("utf-8", "replace") for r in ranks}

    def read_board(self) -> list[dict]:
        """What each rank notes it is doing right now (its current torch.distributed call)."""
        if self.board is None:
            return []
        return read_board(self.board, self.world_size)

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
            os.close(self.board_fd)
            self.board = None
        if self.store_dir is not None:
            shutil.rmtree(self.store_dir, ignore_errors=True)
            self.store_dir = None
        self._closed = True
