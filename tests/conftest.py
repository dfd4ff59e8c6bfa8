"""Shared helpers for the launcher tests: finding rank processes, and driving a Jupyter kernel.

Rank processes are found only as children of the rank factory (``/proc/<pid>/task/*/children``),
never by name, and the tests only ever signal process ids they obtained that way or started
themselves.
"""

from __future__ import annotations

import os
import queue
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

# The shared checks of the grading and benchmark tests (tests/_grading.py, tests/_bench.py)
# report their failures as pytest does a test's.
pytest.register_assert_rewrite("_grading", "_bench")

ROOT = Path(__file__).resolve().parents[1]
# devtools/ (course copies, free ports) is imported from the repository root, not installed.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# --------------------------------------------------------------------------- processes


def proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` from ``/proc/<pid>/stat`` (R, S, D, Z, ...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses: the state follows the last ')'.
    return stat.rsplit(")", 1)[1].split()[0]


def is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs: missing, or a zombie (dead, waiting to be reaped)."""
    return proc_state(pid) in (None, "Z", "X", "x")


def children_of(pid: int) -> list[int]:
    """Live (not zombie) direct children of ``pid``."""
    kids: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(k) for k in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return sorted(k for k in kids if not is_gone(k))


def descendants_of(pid: int) -> list[int]:
    """Live children, grandchildren, ... of ``pid``."""
    out: list[int] = []
    todo = children_of(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children_of(child))
    return sorted(out)


def factory_pid() -> int:
    from helpers._runtime.factory import get_factory

    return get_factory().pid


def rank_children() -> list[int]:
    """Live processes under this test process's rank factory (ranks and anything they started)."""
    return descendants_of(factory_pid())


def describe_pids(pids: list[int]) -> str:
    parts = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            cmd = "?"
        parts.append(f"{pid} [{proc_state(pid)}] {cmd}")
    return "; ".join(parts)


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


@pytest.fixture(scope="session")
def factory():
    """This test process's rank factory, started and warm (torch imported)."""
    from helpers._runtime.factory import get_factory

    return get_factory()


@pytest.fixture
def no_leftover_ranks(factory):
    """After the test, no process may remain under the rank factory."""
    from helpers._runtime.factory import get_factory

    yield
    fac = get_factory()  # the factory may have been restarted by the test
    left = descendants_of(fac.pid)
    if left:
        # Say whether they linger or leak, then clean up so the next test starts clean.
        lingering = wait_until(lambda: not descendants_of(fac.pid), 3.0)
        detail = describe_pids(left)
        from helpers import shutdown

        shutdown()
        pytest.fail(
            f"rank processes left under the factory (pid {fac.pid}) after the test: {detail}"
            + (" (they exited within 3 s)" if lingering else " (still running 3 s later)")
        )


# --------------------------------------------------------------------------- kernel


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
        # A frontend shows a cell's stream messages by their parent, also those that reach it after the
        # idle status (the kernel's IO thread sends them); take those that come within a short grace too.
        grace = time.monotonic() + 0.2
        while (left := grace - time.monotonic()) > 0:
            try:
                msg = kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                break
            if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "stream":
                messages.append(msg)
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
    """Start a kernel and check that it runs this venv's interpreter."""
    kernel = Kernel()
    try:
        executable = kernel.value("__import__('sys').executable")
        assert os.path.realpath(executable) == os.path.realpath(sys.executable), (
            f"the kernel runs {executable}, not this venv's {sys.executable}"
        )
    except BaseException:
        kernel.close()
        raise
    return kernel


@pytest.fixture
def make_kernel():
    """Start kernels on demand; every one is shut down after the test."""
    kernels: list[Kernel] = []

    def start() -> Kernel:
        kernels.append(start_kernel())
        return kernels[-1]

    yield start
    for kernel in kernels:
        kernel.close()


# --------------------------------------------------------------------------- one graded class


@pytest.fixture(scope="session")
def graded_class(request, tmp_path_factory):
    """One `python -m autograder grade` run for every learner that this session's grading tests hand in.

    Each test module that reads its grades from this run says what its learners hand in:
    either ``HANDED_IN`` (lesson -> learner -> the exercise cells they filled in, written
    by :func:`devtools.scratch.hand_in`), or, for hand-ins that need more (deleted or edited
    cells), ``LESSONS`` (the lessons it hands in) and ``hand_in(root, submissions)`` (writes
    its learners' notebooks). The modules collected in this session are asked, their
    learners graded together in one throw-away copy of the course, and the run's root
    folder and printed output returned: one grading run instead of one per module, graded
    the way an instructor grades a class (two at a time). Running a single module grades
    only its own learners.
    """
    from devtools.scratch import course_copy, hand_in, run_instructor_command

    modules = sorted({item.module for item in request.session.items
                      if hasattr(item.module, "hand_in") or hasattr(item.module, "HANDED_IN")},
                     key=lambda module: module.__name__)
    lessons = {lesson for m in modules for lesson in getattr(m, "LESSONS", ())}
    lessons |= {lesson for m in modules for lesson in getattr(m, "HANDED_IN", {})}
    tmp = tmp_path_factory.mktemp("graded-class")
    root = course_copy(tmp / "course", lessons=sorted(lessons))
    for module in modules:
        if hasattr(module, "hand_in"):
            module.hand_in(root, tmp / "submissions")
        for lesson, answers in getattr(module, "HANDED_IN", {}).items():
            hand_in(root, tmp / "submissions", lesson, answers)
    done = run_instructor_command(root, "grade", str(tmp / "submissions"), "--jobs", "2")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    return root, done.stdout


@pytest.fixture(scope="module")
def graded_lesson(request, graded_class):
    """The test module's one lesson of :func:`graded_class` (its ``HANDED_IN``), as a :class:`_grading.GradedLesson`."""
    from _grading import GradedLesson
    from devtools.scratch import layout

    ((lesson, answers),) = request.module.HANDED_IN.items()
    return GradedLesson(graded_class[0], lesson, tuple(answers), *layout(lesson))
