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

Before it starts a server, :func:`ensure_home` makes a missing home folder (the user's, mode of
HOME_MODE, as pam_mkhomedir would: the hub opens no PAM session) and refuses, with the reason on
the user's page, a home that is unusable (none in passwd, a file, another user's, on a folder
that does not exist); without it the server stops at start ("No such directory") and the spawn
would fail after every port was tried, blaming the ports.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from typing import Awaitable, Callable, Iterable

from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.utils import random_port
from traitlets import Integer

__all__ = ["CourseSpawner", "ensure_home", "home_mode", "listening_ports", "start_listening", "HomeUnusable", "PortsTaken"]


class PortsTaken(RuntimeError):
    """The server exited before it listened, on every port tried."""


class HomeUnusable(RuntimeError):
    """A user's home folder cannot be made or used; the message says why and what to do (shown on their page)."""


def home_mode(login_defs: str = "/etc/login.defs") -> int:
    """The mode ``useradd -m`` gives a home here (HOME_MODE in /etc/login.defs), 0700 when it sets none."""
    try:
        found = re.search(r"^\s*HOME_MODE\s+(0?[0-7]{3})\s*$", open(login_defs).read(), re.M)
    except OSError:
        found = None
    return int(found.group(1), 8) if found else 0o700


def ensure_home(name: str, skel: str = "/etc/skel") -> str:
    """``name``'s home folder, made when missing as pam_mkhomedir would; :class:`HomeUnusable` when it cannot be.

    A department's accounts (LDAP, SSSD) often have no home until first login, when PAM's session
    step (pam_mkhomedir) makes it; the hub opens no PAM session, so that step never runs here. A
    missing home is made with the user's uid and primary group, the mode of HOME_MODE in
    /etc/login.defs (else 0700), and the top-level files of ``skel``. Nothing that exists is
    changed: a home that is a file, or belongs to another user, is refused with the reason. Returns
    what it did, for the hub's log ("" when the home was there).
    """
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise HomeUnusable(f"{name!r} is not a Unix user of this machine; ask the instructor to check the "
                           f"account (`getent passwd {name}`).") from None
    home = user.pw_dir
    fix = f"the machine's administrator fixes the account (`usermod -d /home/{name} -m {name}`), then {name} logs in again"
    if not home or not os.path.isabs(home) or os.path.normpath(home) in ("/", "/nonexistent"):
        raise HomeUnusable(f"{name}'s account has no usable home folder (its passwd entry says {home!r}): "
                           f"the server keeps the learner's lessons there. {fix[0].upper()}{fix[1:]}.")
    if os.path.lexists(home):
        info = os.lstat(home)
        if not stat.S_ISDIR(info.st_mode):
            raise HomeUnusable(f"{name}'s home {home} is not a folder; it was left as it is. {fix[0].upper()}{fix[1:]}.")
        if info.st_uid != user.pw_uid:
            try:
                owner = pwd.getpwuid(info.st_uid).pw_name
            except KeyError:
                owner = f"uid {info.st_uid}"
            raise HomeUnusable(f"{name}'s home {home} belongs to {owner}, not to {name}; it was left as it is (the "
                               f"server would save {name}'s work in someone else's folder). The administrator gives "
                               f"it to them (`chown -R {name}: {home}`) or sets another home, then {name} logs in "
                               "again.")
        return ""
    parent = os.path.dirname(os.path.normpath(home))
    if not os.path.isdir(parent):
        raise HomeUnusable(f"{name}'s home {home} does not exist, nor its folder {parent} (a network home not "
                           f"mounted?); nothing was made. Mount it or {fix}.")
    mode = home_mode()
    os.mkdir(home, 0o700)  # closed until it is theirs
    os.chown(home, user.pw_uid, user.pw_gid)
    copied = []
    if os.path.isdir(skel):
        for entry in os.scandir(skel):
            if entry.is_file(follow_symlinks=False):
                target = os.path.join(home, entry.name)
                shutil.copyfile(entry.path, target)
                os.chown(target, user.pw_uid, user.pw_gid)
                copied.append(entry.name)
    os.chmod(home, mode)
    return (f"made {name}'s missing home {home} (owner {name}, group {user.pw_gid}, mode {mode:04o}, "
            f"{len(copied)} files of {skel}), as pam_mkhomedir would at a first login")


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
        made = ensure_home(self.user.name)  # the server's root folder is the home: without it, it cannot start
        if made:
            self.log.warning("server of %s: %s", self.user.name, made)

        async def once(port: int) -> subprocess.Popen:
            self.port = port
            await super(CourseSpawner, self).start()
            return self.proc

        def log(message: str) -> None:
            self.log.warning("server of %s: %s", self.user.name, message)

        port = await start_listening(once, self.port_attempts, log=log, timeout=self.start_timeout)
        return (self.ip or "127.0.0.1", port)
