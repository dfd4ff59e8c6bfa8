"""The rank factory's own process: a single-threaded loop that forks, signals and reaps ranks.

Started by :class:`helpers._runtime.factory.Factory` as ``python -c "from
helpers._runtime.factory_process import serve; serve(FD)"``; everything here runs in that
process (and :func:`_probe` in a throw-away child of it). It imports torch once, never
touches CUDA, runs no threads, and forks each rank from that clean, warm state; the
kernel's side of the socket is :mod:`helpers._runtime.factory`.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any

from .protocol import Exited, Fatal, Hello, Signal, Spawn, Spawned, Stop
from .wire import MAX_FDS, MAX_PACKET, send_message

__all__ = ["serve"]

# What the factory imports once it has been idle this long after starting (see _warm_up).
_WARM_UP_WHEN_IDLE_MS = 300
_WARM_UP_MODULES = ("torch._dynamo",)


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
        # Messages read while warming up and left for the loop, in the order they came
        # (None: the kernel's end of the socket closed); see _ServingSignals.
        self.deferred: list[tuple[Any, list[int]] | None] = []

    def serve(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts reach ranks through us
        # A hang report asks for stacks with SIGUSR1, whose default action ends a process.
        # A rank forked from here inherits SIG_IGN, so one asked before it has installed its
        # faulthandler (helpers._runtime.rank) sends no stack instead of dying of it.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        try:
            self._preload()
        except BaseException:
            send_message(self.sock, Fatal(traceback.format_exc()))
            return
        self._start_probe()
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        # "now": _preload has done it; "off": this process's ranks build no optimizer (see _warm_up).
        warm = os.environ.get("HELPERS_WARM_UP") in ("now", "off")
        while True:
            if self.deferred:
                if not self._handle(self.deferred.pop(0)):
                    self._shutdown()
                    return
                continue
            ready = poller.poll(None if warm else _WARM_UP_WHEN_IDLE_MS)
            if not ready and not warm:
                warm = True
                _warm_up(self)
                continue
            for fd, _ in ready:
                if fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                    self._reap()
                elif not self._handle(self._receive()):
                    self._shutdown()
                    return

    def _preload(self) -> None:
        preload()
        if os.environ.get("HELPERS_WARM_UP") == "now":
            _warm_up(self)

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
        send_message(self.sock, Hello(info))

    def _child_cleanup(self, keep: list[int]) -> None:
        """In a fresh child: drop the factory's sockets and handlers."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in (self.sock.fileno(), self.wake_r, self.wake_w):
            if fd not in keep:
                os.close(fd)

    def _receive(self) -> tuple[Any, list[int]] | None:
        """The next message from the kernel, with the file descriptors that came with it;
        None when the kernel's end of the socket has closed."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_PACKET, MAX_FDS)
        except ConnectionResetError:
            return None
        return (pickle.loads(data), fds) if data else None

    def _handle(self, packet: tuple[Any, list[int]] | None) -> bool:
        """Act on a message from :meth:`_receive`; False when the factory is to stop."""
        if packet is None:
            return False
        message, fds = packet
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
        send_message(self.sock, Spawned(gid, pids))

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

    def _reap(self, only: list[int] | None = None) -> None:
        """Collect the children that exited, reporting the ranks; ``only``: of these alone."""
        while True:
            pid = _exited(os.P_ALL, 0) if only is None else next((p for p in only if _exited(os.P_PID, p)), 0)
            if not pid:
                return
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
                send_message(self.sock, Exited(gid, rank, pid, code))
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


def _warm_up(server: _Server) -> None:
    """Import, once the factory is idle, what ranks would otherwise each import again.

    Building the first optimizer imports ``torch._dynamo`` (about 1 s, and more while
    several ranks do it at once on few cores). Done here, every later rank inherits
    it. It runs only after the factory has sat idle for a moment, so it never delays
    the first launch; it neither starts threads nor touches CUDA. ``HELPERS_WARM_UP=now``
    does it before the factory says it is ready instead: for a process that launches at
    once and keeps its ranks (the clean re-grade, whose checks build optimizers on kept
    ranks that would each import it again).

    Ranks may be alive meanwhile, and the import takes seconds on a busy machine (ten on
    two loaded cores): the signals asked for them are sent, and those that exit reaped, while
    it runs (:class:`_ServingSignals`), so that a hang report still gets the ranks' stacks, an
    interrupt still reaches them and a stop is not held up.

    ``HELPERS_WARM_UP=off`` never does it: for a process whose ranks build no optimizer, where
    it would be a second of CPU spent for nothing (the grader sets it for the lessons whose
    ranks never build one, :func:`autograder.kit.registry.ranks_build_optimizers`).
    """
    serving = _ServingSignals(server)
    sys.meta_path.insert(0, serving)
    try:
        for name in _WARM_UP_MODULES:
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 - an older torch without it: ranks import what they need
                pass
    finally:
        sys.meta_path.remove(serving)


class _ServingSignals:
    """An import hook that finds no module: while the factory warms up, it is asked before
    each module the warm-up imports, and does meanwhile what ranks alive cannot wait for.

    It reaps the ranks that exited (none of the import's own children), so that the kernel
    hears of it (a group's stop waits for that), and reads the kernel's requests in order: a :class:`~helpers._runtime.protocol.Signal`
    is sent at once; anything else (a Spawn: no fork in the middle of an import, or the end
    of the socket) stops the reading, and it and all after it are left, in order, in
    ``server.deferred`` for the loop. A signal for a group whose Spawn waits there waits too.
    """

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.messages, self.exits = select.poll(), select.poll()
        self.messages.register(server.sock, select.POLLIN)
        self.exits.register(server.wake_r, select.POLLIN)
        self.busy = False  # what it does may import: that import is not served again

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        server = self.server
        if self.busy:
            return None
        self.busy = True
        try:
            if self.exits.poll(0):  # a child exited; the loop reaps any the import itself started
                server._reap(only=[p for p in (*server.ranks, server.probe_pid) if p is not None])
            while not server.deferred and self.messages.poll(0):
                packet = server._receive()
                if packet is not None and isinstance(packet[0], Signal):
                    server._handle(packet)
                else:
                    server.deferred.append(packet)
        finally:
            self.busy = False
        return None


def _exited(idtype: int, ident: int) -> int:
    """The process id of a child that has exited, among those ``os.waitid(idtype, ident)``
    looks at, left unreaped; 0 when there is none."""
    try:
        info = os.waitid(idtype, ident, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0
    return info.si_pid if info is not None else 0


def preload() -> None:
    """Import what every rank uses, once, in the factory (or, before it forks one, in the process it is forked from)."""
    import cloudpickle  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.nn  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.optim  # noqa: F401

    from . import rank as _rank  # noqa: F401


def serve(fd: int) -> None:
    """Entry point of the factory process."""
    sock = socket.socket(fileno=fd)
    try:
        _Server(sock).serve()
    finally:
        os._exit(0)
