"""torchrun agents forked from one warm process: a grading imports torch once for all its jobs, not once a job.

:func:`start_agent` asks a *zygote* (one Python process per grading process, started on first use,
which imports torch, ``torch._dynamo``, DCP, DDP and torchrun's elastic agent and then only forks)
for a new agent: the zygote forks, the child starts a session of its own, moves to the job's folder,
takes the job's environment, sends its output to a file and runs the agent's program
(``graded_agent.py``: ``torch.distributed.run.main``); the zygote reports the child's pid and, when it
ends, its exit code. The agent forks its processes in turn (``--start-method=fork``), so a job costs
no torch import at all. :class:`Agent` has the small part of :class:`helpers.Job`'s interface the
torchrun checks use (``running``, ``returncode``, ``lines``, ``label``, ``stop``); :meth:`Agent.stop`
ends the agent's whole process group (its processes are in it), SIGTERM then SIGKILL.

The zygote never starts a thread, so forking it is safe; it dies with the process that started it
(``PR_SET_PDEATHSIG``), and each agent dies with the zygote. Linux only; elsewhere (and with
``COURSE_AGENT_POOL=0``) agents are started as fresh processes through :func:`helpers.start`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["Agent", "start_agent", "pool_available"]

ZYGOTE = r"""
import ctypes, json, os, runpy, select, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # die with the grading process
import torch, torch._dynamo, torch.distributed.checkpoint, torch.distributed.nn, torch.nn.parallel, torch.optim  # noqa
import torch.distributed.run, torch.distributed.elastic.multiprocessing.errors  # noqa
out = sys.stdout
def say(**message):
    out.write(json.dumps(message) + "\n")
    out.flush()
say(ready=os.getpid())
buffer, alive = b"", set()
while True:
    ready, _, _ = select.select([0], [], [], 0.05)
    if ready:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            job = json.loads(line)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.setsid()
                    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # die with the zygote
                    os.chdir(job["cwd"])
                    os.environ.clear()
                    os.environ.update(job["env"])
                    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    devnull = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(devnull, 0)
                    sys.argv = [job["program"], *job["args"]]
                    runpy.run_path(job["program"], run_name="__main__")
                    code = 0
                except SystemExit as end:
                    code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
                except BaseException:
                    import traceback
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            alive.add(pid)
            say(started=pid, key=job["key"])
    for pid in list(alive):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            alive.discard(pid)
            say(ended=pid, code=os.waitstatus_to_exitcode(status))
"""

_lock = threading.Lock()
_zygote: dict = {}


def pool_available() -> bool:
    return sys.platform.startswith("linux") and os.environ.get("COURSE_AGENT_POOL", "1") != "0"


class Agent:
    """One agent forked from the zygote: its pid, its exit code once it ended, its output (from its log file)."""

    def __init__(self, label: str, log: Path) -> None:
        self.label, self.log = label, log
        self.pid: int | None = None
        self.code: int | None = None
        self.started = threading.Event()

    def running(self) -> bool:
        return self.code is None

    @property
    def returncode(self) -> int | None:
        return self.code

    @property
    def lines(self) -> list[str]:
        try:
            return self.log.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def stop(self, grace: float = 3.0) -> int | None:
        """End the agent and every process of its group: SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.pid is None:
            return self.code
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    os.killpg(self.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.02)
            else:
                continue
            break
        deadline = time.monotonic() + 5.0
        while self.code is None and time.monotonic() < deadline:  # the zygote reports the exit code
            time.sleep(0.02)
        return self.code


def _zygote_process() -> dict:
    with _lock:
        if _zygote.get("proc") is not None and _zygote["proc"].poll() is None:
            return _zygote
        proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": ""}, start_new_session=True)
        first = json.loads(proc.stdout.readline() or b"{}")
        if "ready" not in first:
            raise RuntimeError(f"the agents' zygote did not start (exit code {proc.wait()})")
        _zygote.update(proc=proc, agents={})
        threading.Thread(target=_read_reports, args=(proc, _zygote["agents"]), daemon=True,
                         name="course-agent-zygote").start()
        atexit.register(_close, proc)
        return _zygote


def _read_reports(proc: subprocess.Popen, agents: dict) -> None:
    by_pid: dict[int, Agent] = {}
    for raw in iter(proc.stdout.readline, b""):
        report = json.loads(raw)
        if "started" in report:
            agent = agents.pop(report["key"])
            agent.pid = report["started"]
            by_pid[agent.pid] = agent
            agent.started.set()
        elif "ended" in report and report["ended"] in by_pid:
            by_pid.pop(report["ended"]).code = report["code"]
    for agent in by_pid.values():  # the zygote went away: so did its agents
        agent.code = agent.code if agent.code is not None else -signal.SIGKILL


def _close(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def start_agent(program: Path, args: list[str], *, cwd: Path, env: dict[str, str], label: str) -> Agent:
    """Fork an agent running ``program args`` in ``cwd`` with ``env`` added to this process's environment."""
    zygote = _zygote_process()
    agent = Agent(label, Path(cwd) / f"{label.replace(' ', '-')}.log")
    key = f"{id(agent)}-{time.monotonic_ns()}"
    with _lock:
        zygote["agents"][key] = agent
        zygote["proc"].stdin.write((json.dumps({"key": key, "program": str(program), "args": args, "cwd": str(cwd),
                                                "env": {**os.environ, "PYTHONUNBUFFERED": "1", **env},
                                                "log": str(agent.log)}) + "\n").encode())
        zygote["proc"].stdin.flush()
    if not agent.started.wait(30):
        raise RuntimeError(f"the agents' zygote did not start {label} within 30 s")
    return agent
