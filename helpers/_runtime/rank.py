"""What runs inside a rank, from the moment the factory forks it until it exits.

A rank sets itself up like a process that ``torchrun`` started (environment variables,
process group, one device), then serves requests from the notebook until its command
pipe closes: call a function, run a cell's source, set or get variables. One-shot
launches and persistent ranks are the same loop; a launch simply sends one call.

Every reply is one framed message on the reply pipe. A failure is a reply too, carrying
the exception's type, message and traceback, so the notebook can name the rank and the
learner's line. A rank never writes to the kernel's own streams: its stdout and stderr
are pipes the notebook reads and labels.

Before the learner's part of a request runs, the rank says
:class:`~helpers._runtime.protocol.Started`: what came before (setting up, joining the
process group, unpickling the function and its arguments, which imports the modules they
use) is start-up, which the request's timeout does not count. Until the rank installs its
own ``SIGUSR1`` handler (the stack dump of a hang report) it ignores that signal, as the
factory it was forked from does.
"""

from __future__ import annotations

import ctypes
import faulthandler
import io
import linecache
import os
import signal
import sys
import threading
import traceback
from datetime import timedelta
from typing import Any, Callable

from . import wire as _wire
from .board import Board
from .protocol import (
    FD_NAMES,
    Call,
    Exec,
    Failure,
    GroupSpec,
    Pull,
    Push,
    RankException,
    RankSpec,
    Ready,
    Request,
    Result,
    Started,
)

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1
_THIS_FILE = os.path.abspath(__file__)


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the factory died before we asked
        os._exit(1)


_libc: ctypes.CDLL | None = None


def _flush_c_stdio() -> None:
    """Write out what C and C++ code in this process left in the C library's stdout buffer
    (fully buffered on a pipe), so that it too reaches the notebook before the reply."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None)
        _libc.fflush(None)
    except (OSError, AttributeError):
        pass


def _text_stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )


def _to_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value.detach()
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


class _Rank:
    def __init__(self, spec: RankSpec, group: GroupSpec, fds: list[int]) -> None:
        self.spec = spec
        self.group = group
        self.rank = spec.rank
        self.fd = dict(zip(FD_NAMES, fds))
        self.namespace: dict[str, Any] = {}
        self.board = Board.attach(self.fd["board"])
        self.inst = None

    # -- set-up -----------------------------------------------------------------------

    def setup_process(self) -> None:
        fd = self.fd
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(fd["stdout"], 1)
        os.dup2(fd["stderr"], 2)
        os.close(fd["stdout"])
        os.close(fd["stderr"])
        sys.stdin = open(os.devnull)
        sys.stdout = sys.__stdout__ = _text_stream(1)
        sys.stderr = sys.__stderr__ = _text_stream(2)
        self.diag = os.fdopen(fd["diag"], "w", buffering=1)
        faulthandler.enable(file=self.diag, all_threads=True)
        faulthandler.register(signal.SIGUSR1, file=self.diag, all_threads=True, chain=False)

        group, spec = self.group, self.spec
        os.environ.clear()
        os.environ.update(group.env)
        os.environ.update(spec.env)
        try:
            os.chdir(group.cwd)
        except OSError:
            pass
        sys.path[:] = group.sys_path
        sys.argv = [f"rank{spec.rank}"]
        for filename, lines in group.sources.items():
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)

        import torch

        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(group.threads)

    def init_process_group(self) -> None:
        import torch
        import torch.distributed as dist

        group = self.group
        timeout = timedelta(seconds=group.pg_timeout)
        # A FileStore in a folder of this launch's own: no port to pick or collide on.
        # (A TCPStore on a fresh port works as well, but in some sandboxes a loopback
        # connect now and then stalls for 5 s; a file never does.)
        store = dist.FileStore(group.store_path, group.world_size)
        store.set_timeout(timeout)
        kwargs: dict[str, Any] = {}
        if "nccl" in group.backend:  # "nccl", or "cpu:gloo,cuda:nccl" from backend="auto"
            device = torch.device("cuda", self.spec.device)
            torch.cuda.set_device(device)
            kwargs["device_id"] = device
        dist.init_process_group(
            group.backend, store=store, rank=self.rank, world_size=group.world_size, timeout=timeout, **kwargs
        )
        del store  # the process group keeps its own reference

    def instrument(self) -> None:
        """Wrap torch.distributed's calls (board always; events when a request traces)."""
        from .instrument import Instrument

        if os.environ.get("HELPERS_NO_INSTRUMENT") == "1":  # for measuring the wrappers' cost
            return
        self.inst = Instrument(self.rank, self.board, self.group.world_size)
        self.inst.install()
        if self.group.forbid:
            self.inst.forbid(self.group.forbid)

    # -- channel ----------------------------------------------------------------------

    def post(self, phase: str) -> None:
        """Write this rank's phase on the board, keeping the counts of collectives it made.

        A rank that returned still shows how many collectives it entered, so a hang report
        can tell a rank that never reached a collective from one that made it and returned.
        """
        if self.inst is not None:
            self.inst.post(phase)
        else:
            self.board.post(self.rank, phase)

    def send(self, reply: Ready | Started | Result | Failure) -> None:
        _wire.write_frame(self.fd["reply"], reply)

    # -- requests ---------------------------------------------------------------------

    def serve(self) -> None:
        # The board says "ready" before the notebook hears it, never after.
        self.post("ready")
        self.send(Ready(self.rank, os.getpid(), threading.main_thread().ident))
        while True:
            try:
                request = _wire.read_frame(self.fd["cmd"])
            except KeyboardInterrupt:  # an interrupt that arrived while idle: nothing to stop
                continue
            if request is None:
                return
            self.post("running")
            self.handle(request)

    def _namespace(self) -> dict[str, Any]:
        if not self.namespace:
            import torch
            import torch.distributed as dist

            self.namespace.update(
                {
                    "__name__": "__main__",
                    "__builtins__": __builtins__,
                    "rank": self.rank,
                    "world_size": self.group.world_size,
                    "local_rank": int(os.environ.get("LOCAL_RANK", self.rank)),
                    "torch": torch,
                    "dist": dist,
                }
            )
        return self.namespace

    def _exec(self, source: str, filename: str) -> Any:
        """Run a cell's source in this rank's namespace; return its last expression's value."""
        import ast

        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        tree = ast.parse(source, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        namespace = self._namespace()
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            return eval(compile(last, filename, "eval"), namespace)
        return None

    def _load(self, request: Request) -> Callable[[], Any]:
        """The start-up part of a request: unpickle what came with it (which imports the
        modules the function and its arguments use); returns the learner's part, to run."""
        import cloudpickle

        if isinstance(request, Call):
            fn, args, kwargs = cloudpickle.loads(request.payload)
            return lambda: fn(self.rank, self.group.world_size, *args, **kwargs)
        if isinstance(request, Exec):
            return lambda: self._exec(request.source, request.filename)
        if isinstance(request, Push):
            values = cloudpickle.loads(request.payload)
            return lambda: self._namespace().update(values)
        if isinstance(request, Pull):
            return lambda: self._pull(request.names)
        raise TypeError(f"unknown request {request!r}")

    def _pull(self, names: list[str]) -> list[Any]:
        namespace = self._namespace()
        missing = [n for n in names if n not in namespace]
        if missing:
            raise NameError(
                f"rank {self.rank} has no variable named {missing[0]!r}; "
                "set it in a %%distributed cell or with push() first"
            )
        return [namespace[n] for n in names]

    def handle(self, request: Request) -> None:
        import cloudpickle

        inst = self.inst
        if inst is not None:
            inst.take_events()
            inst.tracing = request.trace
            forbid = getattr(request, "forbid", None)
            inst.refuse_only(self.group.forbid if forbid is None else forbid)
        phase = "load"
        try:
            run = self._load(request)
            # Start-up ends here: the notebook starts the request's timeout once every rank said so.
            self.send(Started(self.rank, request.id))
            phase = "run"
            value = run()
        except BaseException as exc:  # noqa: BLE001 - every failure goes home
            self._finish(Failure(self.rank, request.id, RankException.capture(exc, _THIS_FILE, phase=phase)))
            if isinstance(exc, SystemExit):
                raise
            return
        # A cell's value is shown, so its text always goes home.
        text = None
        if isinstance(request, Exec) and value is not None:
            try:
                text = repr(value)
            except Exception as exc:  # noqa: BLE001
                text = f"<repr failed: {exc}>"
        try:
            data = cloudpickle.dumps(_to_cpu(value), protocol=5)
        except Exception as exc:  # noqa: BLE001
            if isinstance(request, Exec):  # shown by its repr only
                data = None
            else:
                error = RankException.capture(exc, _THIS_FILE)
                error.message = (
                    f"the return value ({type(value).__name__}) could not be sent back to the "
                    f"notebook: {exc}. Return tensors, numbers, strings, or lists, tuples and "
                    "dicts of them."
                )
                self._finish(Failure(self.rank, request.id, error))
                return
        self._finish(Result(self.rank, request.id, data, text))

    def _finish(self, reply: Result | Failure) -> None:
        """Send a request's reply, with its trace, after everything it printed."""
        sys.stdout.flush()
        sys.stderr.flush()
        _flush_c_stdio()
        inst = self.inst
        if isinstance(reply, Result) and inst is not None and inst.tracing:
            reply.trace = inst.take_events()
        if inst is not None:
            inst.tracing = False
        self.post("ready")
        self.send(reply)


def main(spec: RankSpec, group: GroupSpec, fds: list[int], parent: int) -> None:
    """Run one rank. Never returns: the process exits here."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    _die_with_parent(parent)
    rank = _Rank(spec, group, fds)
    code = 0
    try:
        rank.setup_process()
        if group.init:
            try:
                rank.init_process_group()
            except BaseException as exc:  # noqa: BLE001
                rank.send(Failure(spec.rank, None, RankException.capture(exc, phase="init")))
                raise SystemExit(1)
        rank.instrument()
        rank.serve()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - last resort, written where the notebook reads it
        traceback.print_exc()
        code = 1
    finally:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except BaseException:  # noqa: BLE001
            pass
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)
