"""What runs inside a rank, from the moment the factory forks it until it exits.

A rank sets itself up like a process that ``torchrun`` started (environment variables,
process group, one device), then serves requests from the notebook until its command
pipe closes: call a function, run a cell's source, set or get variables. One-shot
launches and persistent ranks are the same loop; a launch simply sends one call.

Every reply is one framed message on the reply pipe. A failure is a reply too, carrying
the exception's type, message and traceback, so the notebook can name the rank and the
learner's line. A rank never writes to the kernel's own streams: its stdout and stderr
are pipes the notebook reads and labels.
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
import time
import traceback
from datetime import timedelta
from typing import Any

from . import _wire

__all__ = ["main", "describe_exception"]

_PR_SET_PDEATHSIG = 1
_THIS_FILE = os.path.abspath(__file__)

# Fixed file descriptor order of the pipes a rank receives.
FD_NAMES = ("stdout", "stderr", "cmd", "reply", "diag", "board")


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the factory died before we asked
        os._exit(1)


def _text_stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )


def describe_exception(exc: BaseException, skip_own_frames: bool = True) -> dict:
    """A picklable description of an exception raised in a rank."""
    tb = exc.__traceback__
    if skip_own_frames:
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == _THIS_FILE:
            tb = tb.tb_next
    te = traceback.TracebackException(type(exc), exc, tb, capture_locals=False)
    frames = [
        {"filename": f.filename, "lineno": f.lineno, "name": f.name, "line": f.line}
        for f in te.stack
    ]
    try:
        import cloudpickle

        pickled = cloudpickle.dumps(exc)
    except Exception:
        pickled = None
    return {
        "type": type(exc).__qualname__,
        "module": type(exc).__module__,
        "message": str(exc),
        "text": "".join(te.format()),
        "frames": frames,
        "pickled": pickled,
        "time": time.time(),
    }


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
    def __init__(self, spec: dict, common: dict, fds: list[int]) -> None:
        self.spec = spec
        self.common = common
        self.fd = dict(zip(FD_NAMES, fds))
        self.namespace: dict[str, Any] = {}

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

        common, spec = self.common, self.spec
        os.environ.clear()
        os.environ.update(common["env"])
        os.environ.update(spec["env"])
        try:
            os.chdir(common["cwd"])
        except OSError:
            pass
        sys.path[:] = common["sys_path"]
        sys.argv = [f"rank{spec['rank']}"]
        for filename, lines in common.get("sources", {}).items():
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)

        import torch

        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(common["threads"])

    def init_process_group(self) -> None:
        import torch
        import torch.distributed as dist

        spec, common = self.spec, self.common
        rank, world = spec["rank"], common["world_size"]
        timeout = timedelta(seconds=common["pg_timeout"])
        # A FileStore in a folder of this launch's own: no port to pick or collide on.
        # (A TCPStore on a fresh port works as well, but in some sandboxes a loopback
        # connect now and then stalls for 5 s; a file never does.)
        store = dist.FileStore(common["store_path"], world)
        store.set_timeout(timeout)
        kwargs: dict[str, Any] = {}
        if common["backend"] == "nccl":
            device = torch.device("cuda", spec["device"])
            torch.cuda.set_device(device)
            kwargs["device_id"] = device
        dist.init_process_group(
            common["backend"], store=store, rank=rank, world_size=world, timeout=timeout, **kwargs
        )
        del store  # the process group keeps its own reference

    def instrument(self) -> None:
        """Wrap torch.distributed's calls (board always; events when a request traces)."""
        from ._instrument import Instrument

        if os.environ.get("HELPERS_NO_INSTRUMENT") == "1":  # for measuring the wrappers' cost
            return
        self.inst = Instrument(self.spec["rank"], self.fd.get("board"), self.common["world_size"])
        self.inst.install()
        forbid = self.common.get("forbid")
        if forbid:
            self.inst.forbid(list(forbid), self.common.get("forbid_reason") or "not allowed in this exercise")

    # -- channel ----------------------------------------------------------------------

    def send(self, message: dict) -> None:
        inst = getattr(self, "inst", None)
        if inst is not None and inst.tracing and message.get("ev") in ("result", "error"):
            message["trace"] = inst.take_events()
            inst.tracing = False
        _wire.write_frame(self.fd["reply"], message)

    def recv(self) -> Any:
        return _wire.read_frame(self.fd["cmd"])

    # -- requests ---------------------------------------------------------------------

    def serve(self) -> None:
        self.send(
            {"ev": "ready", "pid": os.getpid(), "main_thread": threading.main_thread().ident}
        )
        while True:
            try:
                message = self.recv()
            except KeyboardInterrupt:  # an interrupt that arrived while idle: nothing to stop
                continue
            if message is None:
                return
            self.handle(message)

    def _namespace(self) -> dict[str, Any]:
        if not self.namespace:
            import torch
            import torch.distributed as dist

            self.namespace.update(
                {
                    "__name__": "__main__",
                    "__builtins__": __builtins__,
                    "rank": self.spec["rank"],
                    "world_size": self.common["world_size"],
                    "local_rank": int(os.environ.get("LOCAL_RANK", self.spec["rank"])),
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

    def handle(self, message: dict) -> None:
        import cloudpickle

        op, rid = message["op"], message.get("id")
        inst = getattr(self, "inst", None)
        if inst is not None:
            inst.take_events()
            inst.tracing = bool(message.get("trace"))
        try:
            if op == "call":
                fn, args, kwargs = cloudpickle.loads(message["payload"])
                result = fn(self.spec["rank"], self.common["world_size"], *args, **kwargs)
            elif op == "exec":
                result = self._exec(message["source"], message["filename"])
            elif op == "push":
                self._namespace().update(cloudpickle.loads(message["payload"]))
                result = None
            elif op == "pull":
                namespace = self._namespace()
                missing = [n for n in message["names"] if n not in namespace]
                if missing:
                    raise NameError(
                        f"rank {self.spec['rank']} has no variable named {missing[0]!r}; "
                        "set it in a %%distributed cell or with push() first"
                    )
                result = [namespace[n] for n in message["names"]]
            else:
                raise ValueError(f"unknown request {op!r}")
        except BaseException as exc:  # noqa: BLE001 - every failure goes home
            sys.stdout.flush()
            sys.stderr.flush()
            self.send({"ev": "error", "id": rid, "error": describe_exception(exc)})
            if isinstance(exc, SystemExit):
                raise
            return
        sys.stdout.flush()
        sys.stderr.flush()
        if op == "exec":  # a cell's value is shown, so its text always goes home
            try:
                text = None if result is None else repr(result)
            except Exception as exc:  # noqa: BLE001
                text = f"<repr failed: {exc}>"
            try:
                data = cloudpickle.dumps(_to_cpu(result), protocol=5)
            except Exception:  # noqa: BLE001 - shown by its repr only
                data = None
            self.send({"ev": "result", "id": rid, "data": data, "repr": text})
            return
        try:
            data = cloudpickle.dumps(_to_cpu(result), protocol=5)
        except Exception as exc:  # noqa: BLE001
            error = describe_exception(exc)
            error["message"] = (
                f"the return value ({type(result).__name__}) could not be sent back to the "
                f"notebook: {exc}. Return tensors, numbers, strings, or lists, tuples and "
                "dicts of them."
            )
            self.send({"ev": "error", "id": rid, "error": error})
            return
        self.send({"ev": "result", "id": rid, "data": data})


def main(spec: dict, common: dict, fds: list[int], parent: int) -> None:
    """Run one rank. Never returns: the process exits here."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    _die_with_parent(parent)
    rank = _Rank(spec, common, fds)
    code = 0
    try:
        rank.setup_process()
        if common["init"]:
            try:
                rank.init_process_group()
            except BaseException as exc:  # noqa: BLE001
                error = describe_exception(exc, skip_own_frames=False)
                error["phase"] = "init"
                rank.send({"ev": "error", "id": None, "error": error})
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
