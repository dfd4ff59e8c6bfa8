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

When the kernel goes away, for whatever reason, the socket reaches end of file: the
factory kills every rank's process group and exits. Each rank also asks Linux to kill it
if the factory dies (``PR_SET_PDEATHSIG``).

Example (kernel side)::

    >>> from helpers._runtime.factory import get_factory
    >>> factory = get_factory()   # starts it if needed, waits until torch is imported
    >>> factory.info["torch"]     # what the factory found in a throwaway probe rank
    '2.13.0+cpu'
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable

from . import wire as _wire
from .protocol import Exited, Fatal, GroupSpec, Hello, RankSpec, Signal, Spawn, Spawned, Stop

__all__ = ["Factory", "get_factory", "shutdown_factory", "FactoryError"]

_MAX_PACKET = 1 << 20
# What the factory imports once it has been idle this long after starting (see _warm_up).
_WARM_UP_WHEN_IDLE_MS = 300
_WARM_UP_MODULES = ("torch._dynamo",)
_MAX_FDS = 250


class FactoryError(RuntimeError):
    """The rank factory could not be started or stopped answering."""


# --------------------------------------------------------------------------------------
# Factory side: runs in the factory process.
# --------------------------------------------------------------------------------------


def _send(sock: socket.socket, message: Any, fds: list[int] = ()) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > _MAX_PACKET:
        raise ValueError(f"factory message of {len(data)} bytes is over {_MAX_PACKET}")
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def _probe() -> dict:
    """What this machine offers; runs in a forked child so CUDA never starts in the factory."""
    import torch
    import torch.distributed as dist

    info: dict[str, Any] = {
        "torch": str(torch.__version__),  # a plain str: unpickling must not import torch here
        "cuda_build": torch.version.cuda,
        "cuda_count": 0,
        "gpus": [],
        "gloo": bool(dist.is_available() and dist.is_gloo_available()),
        "nccl": bool(dist.is_available() and dist.is_nccl_available()),
        "mpi": bool(dist.is_available() and dist.is_mpi_available()),
        "cpus": os.cpu_count() or 1,
    }
    try:
        if torch.cuda.is_available():
            info["cuda_count"] = torch.cuda.device_count()
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(info["cuda_count"])]
    except Exception as exc:  # a broken driver is reported, not fatal
        info["cuda_error"] = f"{type(exc).__name__}: {exc}"
    return info


class _Server:
    """The factory's single-threaded event loop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.ranks: dict[int, tuple[int, int]] = {}  # pid -> (group id, rank)
        self.scratch: dict[int, str] = {}  # group id -> its rendezvous folder
        self.probe_pid: int | None = None

    def serve(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts reach ranks through us
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        try:
            self._preload()
        except BaseException:
            _send(self.sock, Fatal(traceback.format_exc()))
            return
        self._start_probe()
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        warm = False
        while True:
            ready = poller.poll(None if warm else _WARM_UP_WHEN_IDLE_MS)
            if not ready and not warm:
                warm = True
                self._warm_up()
                continue
            for fd, _ in ready:
                if fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                    self._reap()
                elif not self._handle_packet():
                    self._shutdown()
                    return

    def _preload(self) -> None:
        import cloudpickle  # noqa: F401
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
        import torch.nn  # noqa: F401
        import torch.nn.parallel  # noqa: F401
        import torch.optim  # noqa: F401

        from . import rank as _rank  # noqa: F401

        if os.environ.get("HELPERS_WARM_UP") == "now":
            self._warm_up()

    def _warm_up(self) -> None:
        """Import, once the factory is idle, what ranks would otherwise each import again.

        Building the first optimizer imports ``torch._dynamo`` (about 1 s, and more while
        several ranks do it at once on few cores). Done here, every later rank inherits
        it. It runs only after the factory has sat idle for a moment, so it never delays
        the first launch; it neither starts threads nor touches CUDA. ``HELPERS_WARM_UP=now``
        does it before the factory says it is ready instead: for a process that launches at
        once and keeps its ranks (the clean re-grade, whose checks build optimizers on kept
        ranks that would each import it again).
        """
        for name in _WARM_UP_MODULES:
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 - an older torch without it: ranks import what they need
                pass

    def _start_probe(self) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the probe child
            try:
                os.close(r)
                self._child_cleanup([w])
                data = pickle.dumps(_probe())
            except BaseException:
                data = pickle.dumps({"probe_error": traceback.format_exc()})
            os.write(w, data)
            os._exit(0)
        os.close(w)
        self.probe_pid = pid
        self.probe_fd = r

    def _finish_probe(self) -> None:
        chunks = []
        while chunk := os.read(self.probe_fd, 65536):
            chunks.append(chunk)
        os.close(self.probe_fd)
        try:
            info = pickle.loads(b"".join(chunks))
        except Exception:
            info = {"probe_error": "the probe process died before answering"}
        info["factory_pid"] = os.getpid()
        _send(self.sock, Hello(info))

    def _child_cleanup(self, keep: list[int]) -> None:
        """In a fresh child: drop the factory's sockets and handlers."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in (self.sock.fileno(), self.wake_r, self.wake_w):
            if fd not in keep:
                os.close(fd)

    def _handle_packet(self) -> bool:
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, _MAX_PACKET, _MAX_FDS)
        except ConnectionResetError:
            return False
        if not data:
            return False
        message = pickle.loads(data)
        if isinstance(message, Spawn):
            self._spawn(message, fds)
            return True
        for fd in fds:
            os.close(fd)
        if isinstance(message, Signal):
            self._signal(message)
        return not isinstance(message, Stop)

    def _spawn(self, message: Spawn, fds: list[int]) -> None:
        from . import rank as _rank

        gid = message.gid
        pids = []
        for spec in message.ranks:
            own = [fds[i] for i in spec.fds]
            pid = os.fork()
            if pid == 0:
                try:
                    self._child_cleanup(own)
                    for fd in fds:
                        if fd not in own:
                            os.close(fd)
                    _rank.main(spec, message.group, own, parent=os.getppid())
                finally:
                    os._exit(70)
            try:
                os.setpgid(pid, pid)  # also done in the child; whichever runs first wins
            except OSError:
                pass
            self.ranks[pid] = (gid, spec.rank)
            pids.append(pid)
        for fd in fds:
            os.close(fd)
        if message.group.store_dir:
            self.scratch[gid] = message.group.store_dir
        _send(self.sock, Spawned(gid, pids))

    def _signal(self, message: Signal) -> None:
        gid, sig, only = message.gid, message.sig, message.ranks
        whole_group = sig in (signal.SIGTERM, signal.SIGKILL)
        for pid, (g, rank) in list(self.ranks.items()):
            if g != gid or (only is not None and rank not in only):
                continue
            try:
                if whole_group:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError:  # the child has not called setpgid yet
                os.kill(pid, sig)

    def _reap(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            if pid in self.ranks:
                # The rank is a zombie, so its process id and group id are still ours:
                # sweep whatever it started before it died, then collect it.
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            _, status = os.waitpid(pid, 0)
            if pid == self.probe_pid:
                self.probe_pid = None
                self._finish_probe()
            elif pid in self.ranks:
                gid, rank = self.ranks.pop(pid)
                code = os.waitstatus_to_exitcode(status)
                _send(self.sock, Exited(gid, rank, pid, code))
                if not any(g == gid for g, _ in self.ranks.values()):
                    self._remove_scratch(gid)

    def _remove_scratch(self, gid: int) -> None:
        """The group's last rank is gone: remove its rendezvous folder (the notebook
        normally has already; this covers a notebook that died first)."""
        import shutil

        path = self.scratch.pop(gid, None)
        if path:
            shutil.rmtree(path, ignore_errors=True)

    def _shutdown(self) -> None:
        for pid in list(self.ranks):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        while self.ranks and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            self.ranks.pop(pid, None)
        for gid in list(self.scratch):
            self._remove_scratch(gid)


def serve(fd: int) -> None:
    """Entry point of the factory process."""
    sock = socket.socket(fileno=fd)
    try:
        _Server(sock).serve()
    finally:
        os._exit(0)


# --------------------------------------------------------------------------------------
# Kernel side.
# --------------------------------------------------------------------------------------


class Factory:
    """The kernel's handle on its rank factory."""

    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = (
            "import sys; sys.path.insert(0, %r); "
            "from helpers._runtime.factory import serve; serve(%d)" % (package_parent, child.fileno())
        )
        env = dict(os.environ)
        env.pop("MPLBACKEND", None)
        env["HELPERS_PRESTART"] = "0"  # importing helpers in there must not start another
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
                    _send(self.sock, Stop())
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
                _send(self.sock, message, fds)
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
                    data = self.sock.recv(_MAX_PACKET, socket.MSG_DONTWAIT)
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
    global _factory
    if _factory is not None:
        try:
            _factory.sock.close()
        except OSError:
            pass
        _factory = None


os.register_at_fork(after_in_child=_forget_in_forked_child)
atexit.register(shutdown_factory)
