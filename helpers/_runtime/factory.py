"""The rank factory: one warm Python process per notebook kernel that forks the ranks.

Why a separate process? Ranks must start fast and clean. Forking the notebook kernel is
fast but breaks once the kernel touched CUDA or used OpenMP threads; starting a fresh
interpreter per rank costs 1.5-2 s for ``import torch``. The factory imports torch once,
never touches CUDA, runs no threads, and forks each rank from that clean, warm state.

The kernel talks to the factory over a Unix ``SOCK_SEQPACKET`` socket: one pickled message
per packet, with the ranks' pipe ends passed along as file descriptors. The factory forks,
reaps, and signals ranks on request, and reports each rank's exit status. Only the factory
signals ranks, and only ranks it has forked and not yet reaped, so a stale process id can
never hit an unrelated process.

A process that has just imported torch and run nothing else (the grader's clean re-grade)
may instead make its factory a fork of itself (:func:`fork_factory`): that child is in the
state a fresh factory reaches after its imports, and the second ``import torch`` (a second
or more of CPU) is saved.

When the kernel goes away, for whatever reason, the socket reaches end of file: the
factory kills every rank's process group and exits. Each rank also asks Linux to kill it
if the factory dies (``PR_SET_PDEATHSIG``).

This module is the kernel's side; the factory process's own loop is
:mod:`helpers._runtime.factory_process`.

Example (kernel side)::

    >>> from helpers._runtime.factory import get_factory
    >>> factory = get_factory()   # starts it if needed, waits until torch is imported
    >>> factory.info["torch"]     # what the factory found in a throwaway probe rank
    '2.13.0+cpu'
"""

from __future__ import annotations

import atexit
import gc
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from . import wire as _wire
from .wire import MAX_PACKET, send_message
from .protocol import Exited, Fatal, GroupSpec, Hello, RankSpec, Signal, Spawn, Spawned, Stop

__all__ = ["Factory", "get_factory", "start_ahead", "start_after_cell", "fork_factory", "shutdown_factory",
           "FactoryError"]

class FactoryError(RuntimeError):
    """The rank factory could not be started or stopped answering."""


class Factory:
    """The kernel's handle on its rank factory.

    ``prelude`` is Python source the factory process runs before its loop (empty for the
    kernel's own factory; the tests use it to hold new ranks at a point of their start-up).
    ``fork`` makes the factory a fork of this process instead of a fresh interpreter (see
    :func:`fork_factory`, which says when that is right).
    """

    def __init__(self, prelude: str = "", fork: bool = False) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.forked = fork and not prelude
        if self.forked:
            self.process: subprocess.Popen | _ForkedProcess = _ForkedProcess(child)
        else:
            package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            code = (
                "import sys; sys.path.insert(0, %r)\n%s\n"
                "from helpers._runtime.factory_process import serve; serve(%d)" % (package_parent, prelude, child.fileno())
            )
            env = dict(os.environ)
            env.pop("MPLBACKEND", None)
            self.process = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # Never the kernel's stderr: ipykernel forwards it into the running cell.
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # the stop button's SIGINT is ours to forward
                env=env,
            )
        child.close()
        self.sock = parent
        self.pid = self.process.pid
        self.owner_pid = os.getpid()
        self.info: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._listeners: dict[int, Callable[[dict], None]] = {}
        self._next_gid = 0
        self.dead: str | None = None

    # -- life cycle -------------------------------------------------------------------

    def wait_ready(self, timeout: float = 120.0) -> dict:
        """Block until the factory has imported torch and probed the machine."""
        deadline = time.monotonic() + timeout
        while self.info is None:
            if self.dead:
                raise FactoryError(self.dead)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FactoryError(
                    f"the rank factory (pid {self.pid}) did not start within {timeout:.0f} s; "
                    "is `import torch` working in this environment?"
                )
            ready, _, _ = select.select([self.sock], [], [], min(remaining, 0.5))
            if ready:
                self.pump()
        return self.info

    def close(self) -> None:
        """Stop the factory; it kills any rank still running."""
        with self._lock:
            if self.sock.fileno() >= 0:
                try:
                    send_message(self.sock, Stop())
                except OSError:
                    pass
                self.sock.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.dead = self.dead or "the rank factory was shut down"

    @property
    def alive(self) -> bool:
        return self.dead is None and self.process.poll() is None

    # -- requests ---------------------------------------------------------------------

    def new_group(self, listener: Callable[[Spawned | Exited | None], None]) -> int:
        """Register a group; ``listener`` gets its events, and None if the factory dies."""
        with self._lock:
            self._next_gid += 1
            self._listeners[self._next_gid] = listener
            return self._next_gid

    def forget_group(self, gid: int) -> None:
        with self._lock:
            self._listeners.pop(gid, None)

    def spawn(self, gid: int, ranks: list[RankSpec], group: GroupSpec, fds: list[int]) -> None:
        self._request(Spawn(gid, ranks, group), fds)

    def signal(self, gid: int, sig: int, ranks: list[int] | None = None) -> None:
        self._request(Signal(gid, int(sig), ranks))

    def _request(self, message: Spawn | Signal, fds: list[int] = ()) -> None:
        with self._lock:
            if self.dead:
                raise FactoryError(self.dead)
            try:
                send_message(self.sock, message, fds)
            except OSError as exc:
                self._died(f"the rank factory (pid {self.pid}) stopped answering ({exc})")
                raise FactoryError(self.dead) from None

    # -- events -----------------------------------------------------------------------

    def fileno(self) -> int:
        return self.sock.fileno()

    def pump(self) -> None:
        """Read every waiting event and hand each to its group's listener."""
        with self._lock:
            while not self.dead:
                try:
                    data = self.sock.recv(MAX_PACKET, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return
                except OSError as exc:
                    data = b""
                    reason = str(exc)
                else:
                    reason = "end of file"
                if not data:
                    code = self.process.poll()
                    self._died(
                        f"the rank factory (pid {self.pid}) exited unexpectedly "
                        f"({reason}, exit code {code}); its ranks were killed with it. "
                        "The next launch starts a new one."
                    )
                    return
                self._dispatch(_wire.loads(data))

    def _dispatch(self, event: Hello | Fatal | Spawned | Exited) -> None:
        if isinstance(event, Hello):
            self.info = event.info
        elif isinstance(event, Fatal):
            self._died("the rank factory could not start:\n" + event.error)
        else:
            listener = self._listeners.get(event.gid)
            if listener is not None:
                listener(event)

    def _died(self, reason: str) -> None:
        self.dead = reason
        for listener in list(self._listeners.values()):
            listener(None)


class _ForkedProcess:
    """The factory as a fork of this process, with what :class:`Factory` uses of a
    :class:`subprocess.Popen` (``pid``, ``poll``, ``wait``, ``kill``).

    The child is set up as the fresh interpreter would be: a session of its own, its standard
    streams on ``/dev/null``, no file descriptor of this process but its end of the socket,
    Python's signal handlers back to their defaults and no plotting backend, readable by its own user. ``gc.freeze()`` comes first, so that no object it inherited
    is ever collected there (one would close a descriptor whose number a rank's pipe has since).
    """

    def __init__(self, sock: socket.socket) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        fd = sock.fileno()
        pid = os.fork()
        if pid == 0:  # the factory; it never returns from here
            try:
                gc.freeze()
                os.setsid()
                null = os.open(os.devnull, os.O_RDWR)
                for std in (0, 1, 2):
                    os.dup2(null, std)
                os.closerange(3, fd)
                os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
                signal.set_wakeup_fd(-1)
                for sig in signal.valid_signals():
                    try:
                        if callable(signal.getsignal(sig)):
                            signal.signal(sig, signal.SIG_DFL)
                    except (OSError, ValueError, TypeError):
                        pass
                os.environ.pop("MPLBACKEND", None)
                _set_dumpable()
                from .factory_process import serve

                serve(fd)
            finally:
                os._exit(0)
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone all the same
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank factory {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _set_dumpable() -> None:
    """Let the forked factory's own user read it, as a fresh process may be read (the grader's
    clean re-grade makes itself unreadable to the learner's ranks; its factory need not be)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


_factory: Factory | None = None
_factory_lock = threading.Lock()


def get_factory(wait: bool = True) -> Factory:
    """The kernel's rank factory, started on first use and restarted if it died."""
    global _factory
    with _factory_lock:
        if _factory is None or not _factory.alive or _factory.owner_pid != os.getpid():
            if _factory is not None and _factory.owner_pid == os.getpid():
                _factory.close()
            _factory = Factory()
        factory = _factory
    if wait:
        factory.wait_ready()
    return factory


def start_ahead() -> None:
    """Start the rank factory in the background unless it runs, and return at once: for a caller that knows ranks
    will be wanted soon (the first launch then finds torch imported). A factory that cannot start says why at
    that launch. ``HELPERS_START_AHEAD=0`` in the environment leaves the factory to the first launch (grading's
    kernel sets it: it launches nothing)."""
    if os.environ.get("HELPERS_START_AHEAD") == "0":
        return
    try:
        get_factory(wait=False)
    except OSError:
        pass


def start_after_cell(shell: Any) -> None:
    """Have ``shell`` (an IPython kernel's shell) call :func:`start_ahead` once the cell it runs now has ended.

    ``import helpers`` asks for this in a notebook kernel: the importing cell is the lesson's set-up, and the
    factory's ``import torch`` then runs while the learner reads on. It happens once; a launch in that same cell
    starts the factory itself, and the call then finds it running.
    """

    def ended(*_: Any) -> None:
        shell.events.unregister("post_run_cell", ended)
        start_ahead()

    shell.events.register("post_run_cell", ended)


def fork_factory() -> Factory:
    """Start this process's rank factory as a fork of it, and return it (not waiting until it is ready).

    Call it only in a process that has imported what the factory imports and has run nothing
    else yet: no torch operation (one running OpenMP's threads leaves a fork that hangs in its
    first parallel region), no CUDA, no thread of its own, no process group. Such a child is in
    the very state a fresh factory reaches after its imports, so no second ``import torch`` is
    paid. Where any of that cannot be told to hold (CUDA initialised, a process group, a second
    Python thread), the factory is started fresh as usual. The grader's clean re-grade
    (:mod:`autograder.grading.clean`) calls it first thing; a notebook kernel never can.
    """
    global _factory
    from .factory_process import preload

    preload()  # what the factory imports, imported here before the fork
    import torch
    import torch.distributed as dist

    safe = (threading.active_count() == 1 and not torch.cuda.is_initialized()
            and not (dist.is_available() and dist.is_initialized()))
    with _factory_lock:
        if _factory is None or not _factory.alive or _factory.owner_pid != os.getpid():
            if _factory is not None and _factory.owner_pid == os.getpid():
                _factory.close()
            _factory = Factory(fork=safe)
        return _factory


def shutdown_factory() -> None:
    """Stop the rank factory (it is started again by the next launch)."""
    global _factory
    with _factory_lock:
        if _factory is not None and _factory.owner_pid == os.getpid():
            _factory.close()
        _factory = None


def _forget_in_forked_child() -> None:
    # A fork of the kernel must not keep the factory's socket open: the factory would then
    # outlive the kernel, since it only exits when every copy of the socket is closed.
    # The lock too: a fork made while it was held (fork_factory) would otherwise never get it.
    global _factory, _factory_lock
    _factory_lock = threading.Lock()
    if _factory is not None:
        try:
            _factory.sock.close()
        except OSError:
            pass
        _factory = None


os.register_at_fork(after_in_child=_forget_in_forked_child)
atexit.register(shutdown_factory)
