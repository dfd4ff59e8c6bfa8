"""Run a learner's ``main()`` as a script under real ``torchrun`` agents, and read what each process did.

An exercise whose answer is a whole training script (lesson 07) is checked the way it will really run:
:func:`run_script` writes the learner's ``main`` into ``train.py`` with :func:`helpers.export_script`, starts
``nnodes`` agents of ``nproc`` processes each (``torch.distributed.run.main``, the function behind the ``torchrun``
command; several agents on this machine stand for several hosts), stops the job at a time limit with everything it
started, and returns a :class:`ScriptRun`: exit codes, output, and typed records written by the processes
themselves. :meth:`~autograder.kit.exercise.Attempt.torchrun` is how a part's check asks for one; it fails the part
with :func:`autograder.kit.torchrun_feedback.failure_text` when the job did not succeed.

Every process runs the learner's script inside a small wrapper (``torchrun_programs.WRAPPER``) that writes, as JSON
in the job's folder:

- ``saves.jsonl``: every ``torch.save`` (rank and path), and ``saved.jsonl`` when each returned;
- ``barriers.jsonl``: when each ``dist.barrier`` (or ``monitored_barrier``) returned, on which rank;
- ``exit-RANK.json``: whether the process group was still alive at exit, the group's rank and size, its threads
  (the Python ones still running when ``main()`` returned, with their frames: what keeps a process alive);
- ``error-RANK.json``: how the script ended when it did not return: the exception's type, message and frames (file,
  line, function, source), none for ``sys.exit`` (its output says why), and the command-line options the script
  declared with ``argparse``; feedback is built from these fields, never from the text of a traceback;
- ``stack-RANK.txt``: ``faulthandler``'s dump of every thread, shortly before the time limit.

The agent keeps what its ``ChildFailedError`` knows of each failed process (rank, local rank, exit code, time) in
``failures-NODE.json``; ``--log-dir`` keeps each process's stdout and stderr. The first failure in time is the root
cause. (No runnable example here: one job takes a minute on a busy 2-core machine; ``tests/test_lesson07.py`` runs
real ones.)
"""

from __future__ import annotations

import atexit
import inspect
import json
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from helpers._runtime.diagnose import parse_dump
from helpers._runtime.spec import free_port

from .agentpool import pool_available, start_agent
from .torchrun_programs import AGENT, WRAPPER, clip

__all__ = ["ScriptRun", "Failure", "Frame", "JobSpec", "run_script", "run_together", "cached_run", "source_key", "SCRIPT",
           "RUN_TIMEOUT", "STDERR_LINES"]

SCRIPT = "train.py"  # the learner's script, as the feedback names it
RUN_TIMEOUT = 90.0  # one job: 4-6 processes importing torch on 2 cores take 10-20 s
STDERR_LINES = 8  # a failed process's last lines shown in feedback
GRACE_AFTER_FAILURE = 15.0  # how long the other agents may take to end once one agent failed

@dataclass(frozen=True)
class Frame:
    """One frame of a process's traceback: file, line, function and the source line."""

    filename: str
    lineno: int
    name: str
    line: str = ""

    @property
    def in_script(self) -> bool:
        """Whether the frame is in the learner's script (not the wrapper, runpy, torch or Python)."""
        return Path(self.filename).name == SCRIPT


@dataclass
class Failure:
    """One process of a job that failed, as its agent and its own error record saw it.

    ``exc_type`` and ``exc_message`` are the exception that ended it, ``frames`` its traceback
    (outermost first) and ``options`` the command-line options its script declared, all from
    ``error-RANK.json``; they are empty when it died without a Python exception (a signal,
    ``os._exit``). ``stderr``/``stdout`` are its last lines on each stream; ``when`` orders failures.
    """

    agent: int
    rank: int
    local_rank: int | None
    exitcode: int | None
    when: float
    exc_type: str = ""
    exc_message: str = ""
    frames: list[Frame] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)

    @property
    def signal(self) -> str | None:
        """``SIGKILL`` for a process a signal ended (negative exit code), else None."""
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def exception(self) -> str:
        """``ValueError: bad batch``, or ``""`` without a Python exception."""
        return f"{self.exc_type}: {self.exc_message}" if self.exc_type and self.exc_message else self.exc_type


@dataclass
class ScriptRun:
    """What one job of the learner's script did."""

    nnodes: int
    nproc: int
    folder: Path
    codes: list[int | None]
    output: list[str]
    timed_out: bool = False
    timeout: float = RUN_TIMEOUT
    saves: list[dict] = field(default_factory=list)
    saved: dict[str, list[float]] = field(default_factory=dict)  # rank -> when each of its torch.save calls returned
    barriers: dict[str, list[float]] = field(default_factory=dict)  # rank -> when each of its barriers returned
    exits: dict[str, bool] = field(default_factory=dict)  # rank -> group still alive at exit
    joined: dict[str, list[int] | None] = field(default_factory=dict)  # rank -> [rank, world size] of its group
    threads: dict[str, list[str]] = field(default_factory=dict)  # rank -> its threads' names at exit (Linux)
    children: dict[str, list[str]] = field(default_factory=dict)  # rank -> its child processes still alive at exit
    waiting: dict[str, list[tuple[str, list[Frame]]]] = field(default_factory=dict)  # rank -> live threads
    stacks: dict[str, list[Frame]] = field(default_factory=dict)  # rank -> its main thread's stack, innermost first
    beside: dict[str, list[list[Frame]]] = field(default_factory=dict)  # rank -> its other threads' stacks
    failures: list[Failure] = field(default_factory=list)  # first in time first

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(code == 0 for code in self.codes)

    @property
    def where(self) -> str:
        each = f"{self.nproc} process{'es' if self.nproc != 1 else ''}"
        return (f"{self.nnodes} torchrun agents (simulated hosts) of {each} each" if self.nnodes > 1
                else f"one torchrun agent of {each}")

    def source(self, lineno: int) -> str:
        """Line ``lineno`` of the learner's script, stripped ("" when there is none)."""
        try:
            return (self.folder / SCRIPT).read_text().splitlines()[lineno - 1].strip()
        except (OSError, IndexError):
            return ""

    def tail(self, n: int = 12) -> str:
        lines = [line for line in self.output if line.strip("* ")]
        return "\n".join("  " + clip(line, 200) for line in lines[-n:]) or "  (no output)"


_runs: dict[tuple, ScriptRun] = {}
_folders: list[Path] = []  # every job's folder, removed when this process ends


@atexit.register
def _remove_folders() -> None:
    for folder in _folders:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class JobSpec:
    """One job: the learner's ``fn`` under ``nnodes`` agents of ``nproc`` processes. ``fork``: the processes are
    forked from the agent (``torchrun --run-path --start-method=fork``), which imported torch once; ``env`` adds
    variables; ``prepare(folder)`` fills the job's folder first (a checkpoint to resume from, a fault plan's files)."""

    fn: Callable
    nnodes: int
    nproc: int
    replace: Mapping[str, Any] | None = None
    timeout: float = RUN_TIMEOUT
    label: str = "the torchrun job"
    fork: bool = False
    max_restarts: int = 0
    env: Mapping[str, str] | None = None
    prepare: Callable[[Path], None] | None = None


def run_script(fn: Callable, nnodes: int, nproc: int, **options: Any) -> ScriptRun:
    """Run ``fn`` as ``main()`` of a script under ``nnodes`` torchrun agents of ``nproc`` processes.

    ``options`` are :class:`JobSpec`'s: ``replace`` names what the script gets from the course
    instead of the notebook (see :func:`helpers.export_script`), and so on. The job is stopped,
    with every process it started, at ``timeout`` seconds, or shortly after one agent failed.
    """
    return run_together([JobSpec(fn, nnodes, nproc, **options)])[0]


def run_together(specs: list[JobSpec]) -> list[ScriptRun]:
    """Run several jobs at the same time (their waits overlap), each as :func:`run_script` would."""
    from helpers import Interrupted

    started = [_start(spec) for spec in specs]
    try:
        while True:
            now, busy = time.monotonic(), False
            for job in started:
                busy |= _still_running(job, now)
            if not busy:
                break
            time.sleep(0.05)
    except KeyboardInterrupt:  # the stop button
        raise Interrupted(f"{specs[0].label} was interrupted; every process it started was stopped.") from None
    finally:
        for job in started:
            for agent in job["agents"]:
                agent.stop()
    return [_finished(job) for job in started]


def _start(spec: JobSpec) -> dict:
    from helpers import export_script, start

    folder = Path(tempfile.mkdtemp(prefix="course-script-"))
    _folders.append(folder)
    export_script(spec.fn, folder / SCRIPT, setup=False, replace=dict(spec.replace or {}))
    (folder / "graded_run.py").write_text(WRAPPER)
    (folder / "graded_agent.py").write_text(AGENT)
    if spec.prepare is not None:
        spec.prepare(folder)
    port = free_port()
    env = {"COURSE_GRADING_LOG": str(folder), "COURSE_STACKS_AFTER": str(max(spec.timeout - 10, 1.0)),
           "PYTHONPATH": "", "OMP_NUM_THREADS": "1", "HELPERS_PRESTART": "0", **dict(spec.env or {})}
    program = ["--run-path", "--start-method=fork", str(folder / "graded_run.py")] if spec.fork else ["graded_run.py"]
    agents = []
    for node in range(spec.nnodes):
        rendezvous = (["--standalone"] if spec.nnodes == 1 else
                      [f"--nnodes={spec.nnodes}", f"--node-rank={node}", "--master-addr=127.0.0.1",
                       f"--master-port={port}"])
        # --log-dir keeps each process's stdout, stderr and error file; --tee=3 still shows them in the output.
        logs = ["--tee=3", f"--log-dir={folder / f'logs-{node}'}"]
        args = [*rendezvous, f"--nproc-per-node={spec.nproc}", f"--max-restarts={spec.max_restarts}", *logs, *program]
        agent_env = {**env, "COURSE_AGENT_FAILURES": str(folder / f"failures-{node}.json")}
        agents.append(start_agent(folder / "graded_agent.py", args, cwd=folder, env=agent_env, label=f"agent {node}")
                      if spec.fork and pool_available() else  # forked from a process that imported torch once
                      start([sys.executable, str(folder / "graded_agent.py"), *args], cwd=folder, env=agent_env,
                            output="quiet", label=f"agent {node}"))
    return {"spec": spec, "folder": folder, "agents": agents, "deadline": time.monotonic() + spec.timeout, "timed_out": False,
            "done": False}


def _still_running(job: dict, now: float) -> bool:
    """Whether ``job`` still runs; marks it timed out (and done) at its deadline."""
    agents = job["agents"]
    if job["done"] or not any(agent.running() for agent in agents):
        job["done"] = True
        return False
    failed = any(agent.returncode not in (None, 0) for agent in agents)
    if now >= job["deadline"]:
        job["timed_out"] = not failed  # a stop after an agent failed is that failure's doing, not a hang
        job["done"] = True
        for agent in agents:
            agent.stop()
        return False
    if failed:  # one agent failed: the others get a short grace period, not the whole timeout
        job["deadline"] = min(job["deadline"], now + GRACE_AFTER_FAILURE)
    return True


def _finished(job: dict) -> ScriptRun:
    spec, folder, agents = job["spec"], job["folder"], job["agents"]
    run = ScriptRun(spec.nnodes, spec.nproc, folder, [agent.returncode for agent in agents],
                    [f"[{agent.label}] {line}" for agent in agents for line in agent.lines], job["timed_out"],
                    spec.timeout)
    (folder / "output.txt").write_text("\n".join(run.output) + "\n")  # the whole job's output, for instructors
    _read_records(run)
    return run


def cached_run(fn: Callable, nnodes: int, nproc: int, *, key: Any = None, **options: Any) -> ScriptRun:
    """:func:`run_script`, once per source of ``fn``, shape and ``key``: the parts of one exercise share a job."""
    whole = (source_key(fn), nnodes, nproc, key)
    if whole not in _runs:
        _runs[whole] = run_script(fn, nnodes, nproc, **options)
    return _runs[whole]


def source_key(fn: Callable) -> Any:
    """What identifies an answer between the checks of one grading: its source (or, without one, the object)."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return id(fn)



# -- reading what the processes wrote ------------------------------------------------------------


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _attempt_of(path: Path) -> int:
    """The attempt in a record's name: ``exit-RANK-ATTEMPT.json`` (torchrun's restart count)."""
    tail = path.stem.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _read_records(run: ScriptRun) -> None:
    folder = run.folder
    saves = folder / "saves.jsonl"
    if saves.is_file():
        run.saves = [json.loads(line) for line in saves.read_text().splitlines() if line.strip()]
    for name, times, key in (("saved.jsonl", run.saved, "ended"), ("barriers.jsonl", run.barriers, "returned")):
        path = folder / name
        for line in path.read_text().splitlines() if path.is_file() else []:
            if line.strip():
                record = json.loads(line)
                times.setdefault(record["rank"], []).append(record[key])
    for path in sorted(folder.glob("exit-*.json"), key=_attempt_of):  # a restarted process's last attempt counts
        record = _json(path) or {}
        if (rank := record.get("rank")) is not None:
            run.exits[rank] = bool(record.get("group_alive"))
            run.joined[rank] = record.get("joined")
            run.threads[rank] = record.get("threads", [])
            run.children[rank] = record.get("children", [])
            run.waiting[rank] = [(t["name"], [Frame(*f) for f in t["frames"][::-1]]) for t in record.get("python_threads", [])]
    for path in sorted(folder.glob("stack-*.txt"), key=_attempt_of):
        stacks = [[Frame(f["filename"], f["lineno"], f["name"]) for f in t["frames"]] for t in parse_dump(path.read_text())]
        # The thread running the learner's script (the watchdog that dumps them is not it), and the others.
        mine = next((frames for frames in stacks if any(f.in_script for f in frames)), stacks[0] if stacks else [])
        if mine:
            run.stacks[path.stem.split("-")[1]] = mine
            run.beside[path.stem.split("-")[1]] = [frames for frames in stacks if frames is not mine]
    # The first failure in time is the root cause. A process ended by SIGTERM or SIGINT was most likely stopped by
    # its agent because another one had failed, and one whose backend lost its connection to a peer failed because
    # that peer had gone: they come after every other failure. (A killed process has only its agent's time of
    # noticing, whole seconds and late on a busy machine; its peers' "connection reset" could otherwise come first.)
    failures = [failure for node in range(run.nnodes) for failure in _read_failures(folder, node)]
    run.failures = sorted(failures, key=lambda f: (f.signal in ("SIGTERM", "SIGINT"), lost_a_peer(f), f.when,
                                                   f.agent, f.rank))


#: What gloo and NCCL raise in a process whose peer went away (its socket closed under it).
_PEER_GONE = re.compile(r"Connection (reset|closed) by peer|Broken pipe|ECONNRESET|EPIPE", re.I)


def lost_a_peer(failure: Failure) -> bool:
    """Whether ``failure`` is a process's backend losing its connection to another process: the
    consequence of that process's end, not a cause of its own."""
    return bool(failure.exc_type) and bool(_PEER_GONE.search(failure.exc_message))


def _last_lines(path: Path | None, n: int = STDERR_LINES) -> list[str]:
    if path is None or not path.is_file():
        return []
    lines = [line.rstrip() for line in path.read_text(errors="replace").splitlines()]
    return [line for line in lines if line.strip()][-n:]


def _process_logs(folder: Path, node: int, local_rank: int | None) -> Path | None:
    """The folder where agent ``node``'s ``--log-dir`` keeps this process's stdout.log and stderr.log."""
    if local_rank is None:
        return None
    found = sorted((folder / f"logs-{node}").glob(f"**/attempt_*/{local_rank}"))  # <run id>_<random>/attempt_0/<local rank>
    return found[-1] if found else None


def _read_failures(folder: Path, node: int) -> list[Failure]:
    """What agent ``node`` recorded of its failed processes, with each one's own error record and logs."""
    failures = []
    records = _json(folder / f"failures-{node}.json") or []
    procs = folder / f"failures-{node}.json.procs"  # forked processes: every exit code the agent saw at the failure
    if records and procs.is_file():
        seen = {r.get("local_rank") for r in records}
        last = [json.loads(line) for line in procs.read_text().splitlines() if line.strip()][-1]
        base = int(records[0]["rank"]) - int(records[0]["local_rank"] or 0)
        records += [{"rank": base + p["local_rank"], "local_rank": p["local_rank"], "exitcode": p["exitcode"],
                     "timestamp": p["time"]} for p in last if p["local_rank"] not in seen]
    for record in records:
        rank, local_rank = int(record.get("rank", -1)), record.get("local_rank")
        logs = _process_logs(folder, node, local_rank)
        errors = sorted(folder.glob(f"error-{rank}-*.json"), key=_attempt_of)
        error_path = errors[-1] if errors else folder / f"error-{rank}-0.json"
        error = _json(error_path) or {}
        try:  # when the process wrote its error record: finer than the agent's whole seconds
            when = error_path.stat().st_mtime if error else float(record.get("timestamp") or 0)
        except (OSError, ValueError):
            when = 0.0
        failures.append(Failure(
            agent=node, rank=rank, local_rank=local_rank, exitcode=record.get("exitcode"), when=when,
            exc_type=str(error.get("type") or ""), exc_message=str(error.get("message") or ""),
            frames=[Frame(str(f[0]), int(f[1]), str(f[2]), str(f[3])) for f in error.get("frames", [])],
            options=[str(o) for o in error.get("options", [])],
            stderr=_last_lines(logs / "stderr.log" if logs else None),
            stdout=_last_lines(logs / "stdout.log" if logs else None)))
    return failures
