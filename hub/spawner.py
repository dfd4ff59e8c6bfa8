"""The course hub's spawner: JupyterHub's LocalProcessSpawner without its port race.

LocalProcessSpawner asks the kernel for a free port (bind to port 0, read it, close the socket)
and hands the number to the single-user server, which binds it a few seconds later, once Python
and Jupyter are imported. In between, anything on the machine may take that port: a learner's
ranks (every gloo rendezvous picks its ports the same way), a kernel, another server starting.
Then the server stops with "port ... is not available" and the learner's spawn fails; worse, if
the port was taken by a process that listens there, the hub would send that learner's browser,
and its token, to whoever listens.

:class:`CourseSpawner` starts the server and returns only once the server's own process listens
on the port it was given, read from ``/proc`` (the hub runs as root on the same machine): the
socket's inode among the server's file descriptors. A server that exits before that (its port
was taken) is started again on another port, up to ``port_attempts`` times, each logged. Example
(hub/jupyterhub_config.py)::

    c.JupyterHub.spawner_class = CourseSpawner
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from typing import Awaitable, Callable, Iterable

from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.utils import random_port
from traitlets import Integer

__all__ = ["CourseSpawner", "listening_ports", "start_listening", "PortsTaken"]


class PortsTaken(RuntimeError):
    """The server exited before it listened, on every port tried."""


def _tree(pid: int) -> list[int]:
    """``pid`` and every process under it (from /proc/PID/task/*/children: no scan of every process)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                todo.extend(int(child) for child in open(f"/proc/{current}/task/{task}/children").read().split())
            except OSError:
                pass
    return found


def listening_ports(pids: Iterable[int]) -> set[int]:
    """The TCP ports on which one of ``pids`` holds a listening socket (IPv4 or IPv6)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def start_listening(start: Callable[[int], Awaitable[subprocess.Popen]], attempts: int = 5,
                          choose: Callable[[], int] = random_port, log: Callable[[str], None] = print,
                          timeout: float = 120.0) -> int:
    """Start a server with ``start(port)`` until its process listens on ``port``; return that port.

    A process that exits first lost its port to another process: it is started again on a port
    from ``choose()``, ``attempts`` times in all; then :class:`PortsTaken`. One that neither
    listens nor exits within ``timeout`` seconds is left to the caller (the hub's own start-up
    limit then ends it).
    """
    tried = []
    for _ in range(attempts):
        port = choose()
        tried.append(port)
        proc = await start(port)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if port in listening_ports(_tree(proc.pid)):
                return port
            await asyncio.sleep(0.2)
        if proc.poll() is None:
            return port
        log(f"the server on port {port} exited with status {proc.returncode} before it listened (the port was "
            "taken in between, or the server failed: its log is above); starting it on another port")
    raise PortsTaken(f"the server exited before it listened on each of the ports {tried}; see its log above")


class CourseSpawner(LocalProcessSpawner):
    """LocalProcessSpawner whose ``start`` returns once the server listens on its own port (module docstring)."""

    port_attempts = Integer(5, help="How many ports a server is started on before its spawn fails.").tag(config=True)

    async def start(self):
        async def once(port: int) -> subprocess.Popen:
            self.port = port
            await super(CourseSpawner, self).start()
            return self.proc

        def log(message: str) -> None:
            self.log.warning("server of %s: %s", self.user.name, message)

        port = await start_listening(once, self.port_attempts, log=log, timeout=self.start_timeout)
        return (self.ip or "127.0.0.1", port)
