"""A real Jupyter kernel (ipykernel through jupyter_client) and a way to run cells in it.

Tests (``tests/conftest.py``) and benchmarks run learners' cells this way: each cell's
messages are the kernel's iopub messages whose parent is that cell's request, as a notebook
frontend shows them.

    >>> kernel = start_kernel()                      # doctest: +SKIP
    >>> kernel.run("print(1 + 1)")                   # doctest: +SKIP
    '2\\n'
    >>> kernel.close()                               # doctest: +SKIP
"""

from __future__ import annotations

import os
import queue
import sys
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["Kernel", "start_kernel", "ROOT"]

#: The repository root: the kernel's working folder (so ``devtools`` imports there too).
ROOT = Path(__file__).resolve().parents[1]


class Kernel:
    """A real ipykernel started with this interpreter, and a way to run cells in it."""

    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        # jupyter_client replaces the kernel spec's "python" with sys.executable, so the
        # kernel runs in this venv; start_kernel() below checks it.
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
        self.cell = 0

    def execute(
        self,
        code: str,
        timeout: float = 60.0,
        interrupt_after: float | None = None,
        interrupt_when: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Run one cell; return its stdout, stderr, error content, all iopub messages and time.

        With ``interrupt_after``, the kernel is interrupted that many seconds after the cell
        starts, or later, once ``interrupt_when(stdout so far)`` is true (10 s at most more).
        """
        kc = self.kc
        started = time.monotonic()
        msg_id = kc.execute(code)
        self.cell += 1
        messages: list[dict] = []
        stdout: list[str] = []
        pending_interrupt = interrupt_after is not None
        deadline = started + timeout
        while True:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"cell did not finish within {timeout} s:\n{code}\n{messages}")
            if pending_interrupt and now >= started + interrupt_after and (
                interrupt_when is None or interrupt_when("".join(stdout)) or now >= started + interrupt_after + 10
            ):
                self.km.interrupt_kernel()
                self.interrupted_at = time.monotonic()
                pending_interrupt = False
            wait = deadline - now
            if pending_interrupt:
                wait = min(wait, max(0.01, started + interrupt_after - now), 0.05)
            try:
                msg = kc.get_iopub_msg(timeout=wait)
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            messages.append(msg)
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                stdout.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        reply = kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        while reply.get("parent_header", {}).get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        streams = [m["content"] for m in messages if m["msg_type"] == "stream"]
        errors = [m["content"] for m in messages if m["msg_type"] == "error"]
        return {
            "stdout": "".join(s["text"] for s in streams if s["name"] == "stdout"),
            "stderr": "".join(s["text"] for s in streams if s["name"] == "stderr"),
            "stderr_messages": [s for s in streams if s["name"] == "stderr"],
            "error": errors[0] if errors else None,
            "status": reply["content"]["status"],
            "execution_count": reply["content"].get("execution_count"),
            "messages": messages,
            "seconds": time.monotonic() - started,
            "finished_at": time.monotonic(),
        }

    def run(self, code: str, timeout: float = 60.0) -> str:
        """Run a cell that must succeed; return its stdout."""
        out = self.execute(code, timeout)
        if out["error"] is not None or out["status"] != "ok":
            err = out["error"] or {}
            raise AssertionError(
                f"cell failed: {err.get('ename')}: {err.get('evalue')}\n"
                + "\n".join(err.get("traceback", []))
                + f"\n--- cell ---\n{code}\n--- stderr ---\n{out['stderr']}"
            )
        return out["stdout"]

    def value(self, expression: str, timeout: float = 60.0) -> Any:
        """Evaluate ``expression`` in the kernel and bring back its repr as a Python literal."""
        import ast

        text = self.run(f"print(repr({expression}))", timeout)
        return ast.literal_eval(text.strip().splitlines()[-1])

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def close(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            if self.km.is_alive():
                self.km.shutdown_kernel(now=True)


def start_kernel() -> Kernel:
    """Start a kernel and check that it runs this interpreter."""
    kernel = Kernel()
    try:
        executable = kernel.value("__import__('sys').executable")
        assert os.path.realpath(executable) == os.path.realpath(sys.executable), (
            f"the kernel runs {executable}, not {sys.executable}"
        )
    except BaseException:
        kernel.close()
        raise
    return kernel
