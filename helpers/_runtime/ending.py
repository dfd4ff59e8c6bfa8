"""How a group of ranks ends: signals, waiting for the ranks to exit, stopping, closing.

:class:`GroupEnding` is the half of :class:`~helpers._runtime.group.RankGroup` that ends
it, whatever happened before: ``close`` lets the ranks exit on their own (the end of their
command pipe), ``stop`` makes them (escalating signals), and both end with every rank
reaped and the group's pipes, board and rendezvous folder freed. Signals go through the
rank factory, which forked the ranks (:meth:`~helpers._runtime.factory.Factory.signal`).

Like :class:`~helpers._runtime.rankio.RankIO` it keeps no state of its own: it works on the
group's ``ranks``, ``factory``, ``gid``, ``board``, ``store_dir``, ``router`` and its poller,
and waits with ``poll``. A stop button pressed while a group ends cuts a wait short, never
the reaping: no rank outlives its group.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

from .factory import FactoryError

__all__ = ["GroupEnding"]


class GroupEnding:
    """Signalling, stopping and closing a group of ranks; a base of :class:`~helpers._runtime.group.RankGroup`."""

    @property
    def live(self) -> list[int]:
        """The ranks that have not exited."""
        return [s.rank for s in self.ranks if s.state != "exited"]

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        """Send ``sig`` to ``ranks`` (all when None) through the factory; nothing if none is alive."""
        if self.factory_dead or not self.live:
            return
        try:
            self.factory.signal(self.gid, sig, ranks)
        except FactoryError:
            pass

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every rank to exit; whether they all did."""
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
