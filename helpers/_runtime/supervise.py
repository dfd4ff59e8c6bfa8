"""The process between the notebook and a command it runs: nothing the command starts outlives it.

Run as ``python -m helpers._runtime.supervise GRACE -- command args...``. This process

- dies with its parent (the kernel): ``PR_SET_PDEATHSIG``;
- is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): any process the command starts,
  even one in a new session (torchrun starts its workers that way) or one whose parent
  died, stays its descendant, so it can always find them all;
- on SIGTERM, SIGINT or SIGHUP (the stop button, a timeout, the kernel going away) sends
  SIGTERM to every descendant, waits ``GRACE`` seconds, then SIGKILLs what is left;
- when the command exits by itself, ends whatever it left behind the same way;
- exits with the command's exit code (128 + signal number when a signal ended it).

Linux only (the prctl calls); elsewhere it still runs the command and stops its process
group, without the subreaper guarantee.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def descendants(root: int) -> list[int]:
    """Every live (not yet exited) process below ``root``, from /proc."""
    children: dict[int, list[tuple[int, bytes]]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        children.setdefault(int(fields[1]), []).append((int(entry), fields[0]))
    found, queue = [], [root]
    while queue:
        for child, state in children.get(queue.pop(0), []):
            queue.append(child)
            if state not in (b"Z", b"X"):  # exited, waiting to be reaped
                found.append(child)
    return found


def _reap(keep: int) -> None:
    """Collect every exited child of this process except ``keep`` (the command: Popen collects it)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    me = str(os.getpid()).encode()
    for entry in entries:
        if not entry.isdigit() or int(entry) == keep:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == me and fields[0] in (b"Z", b"X"):
            try:
                os.waitpid(int(entry), os.WNOHANG)
            except ChildProcessError:
                pass


def end_all(grace: float, keep: int) -> None:
    """SIGTERM every descendant, wait up to ``grace`` s for them to go, SIGKILL the rest."""
    me = os.getpid()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        pids = descendants(me)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(keep)
            if not descendants(me):
                break
            time.sleep(0.02)
    _reap(keep)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m helpers._runtime.supervise GRACE -- command [args...]", file=sys.stderr)
        return 2
    grace, command = float(argv[0]), argv[2:]
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the line above took effect
        return 1
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGHUP, lambda signum, frame: stopping.append(signum))
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    while child.poll() is None and not stopping:
        time.sleep(0.02)
    if stopping:
        end_all(grace, child.pid)
    code = child.wait()
    end_all(grace, child.pid)  # whatever the command left running
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
