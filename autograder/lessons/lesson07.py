"""Lesson 07's graded exercise: 7.1, a launcher-ready training script's ``main()``.

The learner writes ``main()`` for a script that ``torchrun`` starts on every process:
set up the process group from the environment, shard the course's dataset with
``DistributedSampler`` (seed 0, ``set_epoch`` every epoch), train the course's model in
``DistributedDataParallel`` with SGD, and then, on global rank 0 only, print ``final loss
{value:.6f}`` (the trained model's loss on the whole dataset) and save
``{"model": model.module.state_dict()}`` to ``CHECKPOINT``; every process waits for the
save at a barrier and destroys its process group before it returns.

How the checks judge: the learner's ``main`` is written into a script with
:func:`helpers.export_script` (the course's ``make_model``, ``make_dataset`` and
constants replace the notebook's, so the data cannot differ), and a small wrapper
records, in each process, every ``torch.save`` and whether the process group was still
alive at exit, then runs the script. ``torchrun`` runs it for real: two agents of two
processes each (two simulated hosts), and one agent of three. A single process replays
the same global batches for the reference weights and loss. A run that does not end in
time is stopped with everything it started, and each process's stack (dumped by
``faulthandler`` just before) says where it was.

When a process fails, the feedback is that process's own account: the script runs under
torch's ``@record``, so its exception and traceback go to the error file its agent gave it
(``TORCHELASTIC_ERROR_FILE``); the agent is ``torch.distributed.run.main`` itself, and it
keeps what its ``ChildFailedError`` knows of each failed process (rank, local rank, exit
code, error file) in a JSON file; ``--log-dir`` keeps each process's stdout and stderr. The
first failure in time is shown: its rank, the exception, the learner's line and the
traceback's tail, or, for a process that a signal or ``os._exit`` ended, its exit code and
last lines on stderr.

Hidden test cells and the visible self-check::

    from autograder import exercise
    exercise("7.1").grade(main, "runs")   # "same_result", "rank_zero_only", "clean_exit", "any_topology"
    exercise("7.1").self_check(main)      # one agent of two processes
"""

from __future__ import annotations

import atexit
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from helpers._runtime.spec import free_port

from .kit import Attempt, Exercise, Part, plural

__all__ = ["EXERCISES", "exercise_7_1", "make_model", "make_dataset", "COURSE"]

SAMPLES, FEATURES, CLASSES = 48, 6, 3
EPOCHS, BATCH_SIZE, LR = 2, 4, 0.3
CHECKPOINT = "checkpoint.pt"
RUN_TIMEOUT = 90.0  # one torchrun job: 4-6 processes importing torch on 2 cores take 10-20 s


# -- the course's model and data (the notebook shows the same code) --------------------------


def make_model():
    """The model every process builds: the same weights everywhere (seed 0)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def make_dataset():
    """48 samples of 6 features in 3 classes, the same in every process."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 6, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return TensorDataset(x, y)


COURSE: dict[str, Any] = {"make_model": make_model, "make_dataset": make_dataset, "EPOCHS": EPOCHS,
                          "BATCH_SIZE": BATCH_SIZE, "LR": LR, "CHECKPOINT": CHECKPOINT}

# The last reference to a process group, or why the wrapper holds each group and imports
# torch.distributed.nn before the learner's script. Every gloo collective's work object keeps
# a Python object (its at::ThreadLocalState), and a gloo worker thread (pt_gloo_runloop) lets
# go of it, taking the GIL, just after the collective returned. Two ways this ended a right
# answer (both seen here, with torch 2.13, about once in 10 to 300 jobs; more under load):
# - at exit: DDP's constructor imports torch.distributed.nn, whose functions take
#   ``group=group.WORLD`` as a default argument evaluated at import, so imported after
#   init_process_group they keep the default group for good; destroy_process_group() cannot
#   free it, and when the worker lets go of that object during the interpreter's finalization,
#   the thread is ended inside a noexcept destructor: "terminate called without an active
#   exception", SIGABRT, after the process had recorded a clean exit (torchrun's
#   ChildFailedError with no traceback at all);
# - at main()'s return: with the defaults gone, DDP's Reducer held the group's last reference
#   and freed it with the GIL held (pybind's dealloc); ~ProcessGroupGloo joined a worker that
#   was waiting for the GIL: a deadlock, the job stopped after 90 s (gdb: Reducer::~Reducer ->
#   ~ProcessGroupGloo -> thread::join, and the worker in ~AsyncBarrierWork -> gil_scoped_acquire).
# So: torch.distributed.nn is imported before any group exists (its defaults are None), the
# wrapper keeps a reference to the default group from init_process_group on (no Reducer or
# tensor ever frees it), and when the script has returned it destroys the group if the script
# did not and drops those references: a ProcessGroup's own dealloc releases the GIL, the
# worker finishes, the threads are joined, and the process exits with no gloo thread left.

# Runs in every process torchrun starts, before the learner's script: records each
# torch.save and, at exit, whether the process group was destroyed; dumps the stack
# if the process is still running shortly before the grader's timeout. The script runs
# under torch's own ``@record`` (torch.distributed.elastic.multiprocessing.errors), so an
# exception is written to the error file the agent gave this process (TORCHELASTIC_ERROR_FILE)
# and reaches the agent's failure report, as in lesson 07's section 1.
WRAPPER = """\
import atexit, faulthandler, json, os, runpy, sys
LOG = os.environ["COURSE_GRADING_LOG"]
RANK = os.environ.get("RANK", "?")
_stacks = open(os.path.join(LOG, f"stack-{RANK}.txt"), "w")
faulthandler.dump_traceback_later(float(os.environ["COURSE_STACKS_AFTER"]), file=_stacks)
import torch, torch.distributed as dist
try:  # before any process group exists: see the note on the last reference above
    import torch.distributed.nn
except ImportError:
    pass
try:
    from torch.distributed.elastic.multiprocessing.errors import record
except ImportError:  # no elastic package: the traceback still reaches stderr
    def record(fn):
        return fn
_save = torch.save
def _recorded_save(obj, f, *args, **kwargs):
    with open(os.path.join(LOG, "saves.jsonl"), "a") as out:
        out.write(json.dumps({"rank": RANK, "path": os.path.abspath(str(f)) if isinstance(f, (str, os.PathLike)) else repr(f)}) + "\\n")
    return _save(obj, f, *args, **kwargs)
torch.save = _recorded_save
def _native_threads():
    try:
        return [open(f"/proc/self/task/{t}/comm").read().strip() for t in sorted(os.listdir("/proc/self/task"))]
    except OSError:  # not Linux
        return []
_groups = []  # the process groups the script made, held here: see the note on the last reference above
_init_process_group = dist.init_process_group
def _kept_init_process_group(*args, **kwargs):
    result = _init_process_group(*args, **kwargs)
    _groups.append(dist.distributed_c10d._get_default_group())
    return result
dist.init_process_group = _kept_init_process_group
_finished = []
def _finish(release):
    if _finished:
        return
    _finished.append(True)
    faulthandler.cancel_dump_traceback_later()
    alive = dist.is_available() and dist.is_initialized()
    if release:  # the script returned: end its groups now, while Python is whole
        if alive:
            dist.destroy_process_group()
        del _groups[:]  # the last references; a ProcessGroup's dealloc lets go of the GIL while gloo's threads end
    with open(os.path.join(LOG, f"exit-{RANK}.json"), "w") as out:
        json.dump({"rank": RANK, "group_alive": alive, "threads": _native_threads()}, out)
atexit.register(_finish, False)
sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")] + sys.argv[1:]
record(runpy.run_path)(sys.argv[0], run_name="__main__")
_finish(True)
"""

# The agent: torch.distributed.run.main, the very function the ``torchrun`` command runs, with
# one addition: when processes fail, what the agent knows of each (ChildFailedError.failures:
# rank, local rank, exit code, error file, the message read from it) is kept in a JSON file, so
# the checks read those fields instead of the text of its report. Its output and exit code are
# torchrun's own.
AGENT = """\
import json, os, sys
from torch.distributed.run import main
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
sys.argv[0] = "torchrun"
try:
    main()
except ChildFailedError as failed:
    kept = []
    for rank, failure in failed.failures.items():
        kept.append({"rank": rank, "local_rank": getattr(failure, "local_rank", None),
                     "exitcode": getattr(failure, "exitcode", None), "pid": getattr(failure, "pid", None),
                     "error_file": getattr(failure, "error_file", None),
                     "message": getattr(failure, "message", None), "timestamp": getattr(failure, "timestamp", None)})
    with open(os.environ["COURSE_AGENT_FAILURES"], "w") as out:
        json.dump(kept, out, default=str)
    raise
"""
STDERR_LINES = 8  # a failed process's last lines shown in feedback
GRACE_AFTER_FAILURE = 15.0  # how long the other agents may take to end once one agent failed


@dataclass
class Failure:
    """One process of a torchrun job that failed, as its agent saw it.

    ``exception`` is the process's exception line and ``traceback`` its Python traceback,
    both from the error file ``@record`` wrote (empty when it died without one: a signal,
    ``os._exit``, ``sys.exit``); ``stderr``/``stdout`` are its last lines on each stream,
    from the files torchrun's ``--log-dir`` keeps per process; ``when`` orders failures.
    """

    agent: int
    rank: int
    local_rank: int | None
    exitcode: int | None
    when: float
    exception: str = ""
    traceback: str = ""
    stderr: list[str] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)

    @property
    def signal(self) -> str | None:
        """``SIGKILL`` for a process a signal ended (negative exit code), else None."""
        import signal

        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


@dataclass
class Run:
    """What one torchrun job of the learner's script did."""

    nnodes: int
    nproc: int
    folder: Path
    codes: list[int | None]
    output: list[str]
    timed_out: bool = False
    saves: list[dict] = field(default_factory=list)
    exits: dict[str, bool] = field(default_factory=dict)  # rank -> group still alive at exit
    threads: dict[str, list[str]] = field(default_factory=dict)  # rank -> its threads' names at exit (Linux)
    stacks: dict[str, str] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)  # first in time first

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    @property
    def where(self) -> str:
        hosts = f"{self.nnodes} torchrun agents (simulated hosts) of {plural(self.nproc, 'process', 'processes')} each"
        return hosts if self.nnodes > 1 else f"one torchrun agent of {self.nproc} processes"

    def final_losses(self) -> list[float]:
        return [float(m[1]) for line in self.output if (m := re.search(r"final loss (-?[\d.]+(?:e-?\d+)?)", line))]

    def tail(self, n: int = 12) -> str:
        lines = [line for line in self.output if "OMP_NUM_THREADS" not in line and not line.strip("*").strip() == ""]
        return "\n".join("  " + line[:200] for line in lines[-n:]) or "  (no output)"


_runs: dict[tuple, Run] = {}
_folders: list[Path] = []  # every job's folder, removed when this process ends


@atexit.register
def _remove_folders() -> None:
    for folder in _folders:
        shutil.rmtree(folder, ignore_errors=True)


def run_script(fn: Callable, nnodes: int, nproc: int, timeout: float = RUN_TIMEOUT) -> Run:
    """Run ``fn`` as ``main()`` of a script under ``nnodes`` torchrun agents of ``nproc`` processes."""
    import time

    from helpers import Interrupted, export_script, start

    folder = Path(tempfile.mkdtemp(prefix="course-ex7_1-"))
    _folders.append(folder)
    export_script(fn, folder / "train.py", setup=False, replace=COURSE)
    (folder / "graded_run.py").write_text(WRAPPER)
    (folder / "graded_agent.py").write_text(AGENT)
    port = free_port()
    env = {"COURSE_GRADING_LOG": str(folder), "COURSE_STACKS_AFTER": str(timeout - 10), "PYTHONPATH": "",
           "OMP_NUM_THREADS": "1"}
    jobs = []
    for node in range(nnodes):
        rendezvous = (["--standalone"] if nnodes == 1 else
                      [f"--nnodes={nnodes}", f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}"])
        # --log-dir keeps each process's stdout, stderr and error file; --tee=3 still shows them in the output.
        logs = ["--tee=3", f"--log-dir={folder / f'logs-{node}'}"]
        jobs.append(start([sys.executable, str(folder / "graded_agent.py"), *rendezvous, f"--nproc-per-node={nproc}",
                           "--max-restarts=0", *logs, "graded_run.py"],
                          cwd=folder, env={**env, "COURSE_AGENT_FAILURES": str(folder / f"failures-{node}.json")},
                          output="quiet", label=f"agent {node}"))
    timed_out = False
    deadline = time.monotonic() + timeout
    try:
        while any(job.running() for job in jobs):
            now = time.monotonic()
            failed = any(job.returncode not in (None, 0) for job in jobs)
            if now >= deadline:
                timed_out = not failed  # a stop after an agent failed is that failure's doing, not a hang
                break
            if failed:  # one agent failed: the others get a short grace period, not the whole timeout
                deadline = min(deadline, now + GRACE_AFTER_FAILURE)
            time.sleep(0.05)
    except KeyboardInterrupt:  # the stop button
        raise Interrupted("Exercise 7.1's torchrun job was interrupted; every process it started was stopped.") from None
    finally:
        for job in jobs:
            job.stop()
    run = Run(nnodes, nproc, folder, [job.returncode for job in jobs],
              [f"[{job.label}] {line}" for job in jobs for line in job.lines], timed_out)
    (folder / "output.txt").write_text("\n".join(run.output) + "\n")  # the whole job's output, for instructors
    saves = folder / "saves.jsonl"
    if saves.is_file():
        run.saves = [json.loads(line) for line in saves.read_text().splitlines() if line.strip()]
    for f in folder.glob("exit-*.json"):
        record = json.loads(f.read_text())
        run.exits[record["rank"]] = record["group_alive"]
        run.threads[record["rank"]] = record.get("threads", [])
    for f in folder.glob("stack-*.txt"):
        text = f.read_text().strip()
        if text:
            run.stacks[f.stem.split("-", 1)[1]] = text
    # The first failure in time is the root cause. A process ended by SIGTERM or SIGINT was most likely
    # stopped by its agent because another one had failed: it comes after every other failure.
    run.failures = sorted((failure for node in range(nnodes) for failure in _read_failures(folder, node)),
                          key=lambda failure: (failure.signal in ("SIGTERM", "SIGINT"), failure.when, failure.agent,
                                               failure.rank))
    return run


def _last_lines(path: Path | None, n: int = STDERR_LINES) -> list[str]:
    if path is None or not path.is_file():
        return []
    lines = [line.rstrip() for line in path.read_text(errors="replace").splitlines()]
    return [line for line in lines if line.strip()][-n:]


def _process_logs(folder: Path, node: int, local_rank: int | None) -> Path | None:
    """The folder where agent ``node``'s ``--log-dir`` keeps this process's stdout.log, stderr.log, error.json."""
    if local_rank is None:
        return None
    found = sorted((folder / f"logs-{node}").glob(f"**/attempt_*/{local_rank}"))  # <run id>_<random>/attempt_0/<local rank>
    return found[-1] if found else None


def _read_failures(folder: Path, node: int) -> list[Failure]:
    """What agent ``node`` recorded of its failed processes (see AGENT), with each one's error file and logs."""
    path = folder / f"failures-{node}.json"
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    failures = []
    for record in records:
        local_rank = record.get("local_rank")
        logs = _process_logs(folder, node, local_rank)
        error_file = Path(str(record.get("error_file") or ""))
        if not error_file.is_file() and logs is not None:
            error_file = logs / "error.json"
        message = record.get("message")
        if error_file.is_file() and not isinstance(message, dict):
            try:
                message = json.loads(error_file.read_text()).get("message")
            except (OSError, ValueError, AttributeError):
                pass
        exception = traceback = ""
        if isinstance(message, dict):  # written by @record: {"message": "Type: text", "extraInfo": {"py_callstack": ...}}
            exception = str(message.get("message") or "")
            extra = message.get("extraInfo")
            traceback = str(extra.get("py_callstack") or "") if isinstance(extra, dict) else ""
        try:  # when the process wrote its error file: finer than the agent's whole seconds
            when = error_file.stat().st_mtime if error_file.is_file() else float(record.get("timestamp") or 0)
        except (OSError, ValueError):
            when = 0.0
        failures.append(Failure(
            agent=node, rank=int(record.get("rank", -1)), local_rank=local_rank, exitcode=record.get("exitcode"),
            when=when, exception=exception, traceback=traceback,
            stderr=_last_lines(logs / "stderr.log" if logs else None),
            stdout=_last_lines(logs / "stdout.log" if logs else None)))
    return failures


def _cached_run(attempt: Attempt, nnodes: int, nproc: int) -> Run:
    import inspect

    try:
        key = (inspect.getsource(attempt.fn), nnodes, nproc)
    except (OSError, TypeError):
        key = (id(attempt.fn), nnodes, nproc)
    if key not in _runs:
        _runs[key] = run_script(attempt.fn, nnodes, nproc)
    return _runs[key]


def _stack_summary(run: Run) -> str:
    """Where each process was when it hung: its innermost frame in train.py."""
    lines = []
    for rank, text in sorted(run.stacks.items()):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', text)
        mine = [f for f in frames if f[0].endswith("train.py")]
        if mine:
            path, line, func = mine[0]  # faulthandler prints the innermost frame first
            source = (run.folder / "train.py").read_text().splitlines()[int(line) - 1].strip()
            lines.append(f"  rank {rank} was at train.py line {line}, in {func}: {source}")
    return "\n".join(lines)


def _short_paths(text: str, folder: Path) -> str:
    """A traceback with the job's folder and the site-packages prefix cut: ``train.py``, ``torch/...``."""
    text = text.replace(str(folder) + "/", "")
    return re.sub(r'File "[^"]*?/site-packages/', 'File "', text)


def _learner_line(failure: Failure, folder: Path) -> str:
    """``train.py line 41, in main: raise ValueError(...)``: the innermost frame of the learner's script."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', failure.traceback)
    mine = [f for f in frames if Path(f[0]).name == "train.py"]
    if not mine:
        return ""
    _, line, func = mine[-1]
    try:
        source = (folder / "train.py").read_text().splitlines()[int(line) - 1].strip()
    except (OSError, IndexError):
        source = ""
    return f"train.py line {line}, in {func}" + (f": {source}" if source else "")


def _in_brief(failure: Failure) -> str:
    """``ValueError: ...``, ``SIGTERM`` or ``exit code 3``: one failure in a few words."""
    if failure.exception:
        line = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", failure.exception.splitlines()[0])  # gloo's source path
        return line[:120] + ("..." if len(line) > 120 else "")
    return failure.signal or f"exit code {failure.exitcode}"


def describe_failure(run: Run, failure: Failure) -> str:
    """What one failed process did, in the words of the feedback: who, how it ended, its exception or last lines."""
    who = f"rank {failure.rank}"
    if run.nnodes > 1:
        who += f" (local rank {failure.local_rank} under torchrun agent {failure.agent})"
    if failure.exception:
        code = f" (exit code {failure.exitcode})" if failure.exitcode not in (None, 1) else ""
        text = f"{who} raised {failure.exception}{code}"
        where = _learner_line(failure, run.folder)
        if where:
            text += f"\n  at {where}"
        lines = _short_paths(failure.traceback, run.folder).strip().splitlines()
        mine = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "train.py"')]
        tail = lines[mine[0]:] if mine else lines  # from the script's first frame: not the wrapper's or runpy's
        wrapper = [i for i, line in enumerate(tail) if line.lstrip().startswith('File "graded_run.py"')]
        tail = [line for i, line in enumerate(tail) if i not in wrapper and i - 1 not in wrapper  # and its kept init
                and line.strip().strip("^~")]  # nor Python's markers under a line
        tail = tail[-2 * STDERR_LINES:]
        if tail:
            text += "\nIts traceback ends:\n" + "\n".join("  " + line[:200] for line in tail)
        return text
    if failure.signal:
        text = f"{who} was killed by {failure.signal} (exit code {failure.exitcode}), without a Python exception"
    else:
        text = (f"{who} exited with code {failure.exitcode} without a Python exception (sys.exit, os._exit, "
                "or an error outside Python ends a process this way)")
    stream, lines = ("stderr", failure.stderr) if failure.stderr else ("stdout", failure.stdout)
    if lines:
        text += f". Its last lines on {stream}:\n" + "\n".join("  " + line[:200] for line in lines)
    else:
        text += ". It wrote nothing."
    return text


def _require_success(attempt: Attempt, run: Run) -> None:
    if run.timed_out:
        where = _stack_summary(run)
        attempt.fail(
            f"under {run.where}, the job did not finish within {RUN_TIMEOUT:g} s and was stopped."
            + (f" Where the processes were:\n{where}" if where else "")
            + f"\nThe job's last lines:\n{run.tail()}\nA process that waits for a collective the others "
              "never make hangs; so does a process group whose ranks disagree (a hard-coded rank).")
    failed = [(i, code) for i, code in enumerate(run.codes) if code != 0]
    if not failed:
        return
    text = "\n".join(run.output)
    hint = ""
    if "--local-rank" in text or "--local_rank" in text:
        hint = ("\ntorchrun does not pass --local-rank on the command line (only the old torch.distributed.launch "
                "did): read LOCAL_RANK from the environment, os.environ['LOCAL_RANK'].")
    elif any(f.exception.startswith("KeyError") for f in run.failures) or ("KeyError" in text and "environ" in text):
        hint = "\nA variable your main() read from os.environ is not one torchrun sets."
    agent, code = failed[0]
    if run.failures:  # what torchrun's agents recorded: the first failure in time is the root cause
        first, *others = run.failures
        agent, code = first.agent, run.codes[first.agent]
        also = ""
        if others:
            also = "\nAlso failed after it: " + "; ".join(f"rank {f.rank} ({_in_brief(f)})" for f in others[:3]) + (
                "; ..." if len(others) > 3 else "")
        attempt.fail(f"under {run.where}, a process failed and torchrun stopped the job (agent {agent} exited with "
                     f"code {code}). The first to fail:\n{describe_failure(run, first)}{also}{hint}")
    # No agent recorded a failed process (the agent itself failed, or was stopped): its own words.
    errors = [line for line in run.output if re.search(r"Error\b|error:", line)
              and "error_file" not in line and "debug_logger" not in line]
    shown = "\n".join("  " + line[:200] for line in dict.fromkeys(errors[:6])) if errors else run.tail()
    attempt.fail(f"under {run.where}, torchrun agent {agent} exited with code {code}. "
                 f"{'Its errors' if errors else 'The job' + chr(39) + 's last lines'}:\n{shown}{hint}")


def _reference(world_size: int) -> tuple[list, float]:
    """One process taking the same global batches: the weights and the final loss the job should reach."""
    import torch
    import torch.nn.functional as F

    data = make_dataset()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = data.tensors
    per_rank = SAMPLES // world_size
    for epoch in range(EPOCHS):
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch)).tolist()  # DistributedSampler's
        shards = [order[r::world_size] for r in range(world_size)]
        for start in range(0, per_rank, BATCH_SIZE):
            batch = [i for shard in shards for i in shard[start:start + BATCH_SIZE]]
            opt.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
    with torch.no_grad():
        loss = F.cross_entropy(model(x), y).item()
    return [p.detach() for p in model.state_dict().values()], loss


def _judge_result(attempt: Attempt, run: Run) -> None:
    import torch

    weights, loss = _reference(run.world_size)
    path = run.folder / CHECKPOINT
    if not path.is_file():
        attempt.fail(f"under {run.where}, no file {CHECKPOINT} was written in the job's folder: save "
                     f"{{'model': model.module.state_dict()}} to CHECKPOINT on rank 0.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        got = list(state["model"].values())
    except Exception as exc:  # noqa: BLE001 - whatever the learner saved
        attempt.fail(f"under {run.where}, {CHECKPOINT} could not be read as {{'model': state_dict}} "
                     f"({type(exc).__name__}: {exc}).")
    if len(got) != len(weights) or any(g.shape != w.shape for g, w in zip(got, weights)):
        attempt.fail(f"under {run.where}, the checkpoint's model has tensors of shapes {[tuple(g.shape) for g in got]}; "
                     f"the course's model has {[tuple(w.shape) for w in weights]}. Save model.module.state_dict().")
    worst = max((g - w).abs().max().item() for g, w in zip(got, weights))
    if worst > 1e-4:
        attempt.fail(
            f"under {run.where} ({run.world_size} processes), the saved weights differ from one process taking "
            f"the same global batches by up to {worst:.3g}. Each process must train on its own shard: "
            "DistributedSampler(dataset, num_replicas=world_size, rank=rank) with the global RANK (not LOCAL_RANK), "
            f"shuffle on with seed 0, set_epoch(epoch) every epoch, batches of BATCH_SIZE, {EPOCHS} epochs of SGD with LR."
        )
    losses = run.final_losses()
    if not losses:
        attempt.fail(f"under {run.where}, no process printed 'final loss <value>'; rank 0 should print the trained "
                     "model's loss on the whole dataset.")
    if abs(losses[0] - loss) > 1e-4:
        attempt.fail(f"under {run.where}, the printed final loss is {losses[0]:.6f}; the trained model's loss on the "
                     f"whole dataset is {loss:.6f}.")


def _runs_part(attempt: Attempt) -> None:
    _require_success(attempt, _cached_run(attempt, 2, 2))


def _same_result(attempt: Attempt) -> None:
    run = _cached_run(attempt, 2, 2)
    _require_success(attempt, run)
    _judge_result(attempt, run)


def _rank_zero_only(attempt: Attempt, run: Run | None = None) -> None:
    run = run or _cached_run(attempt, 2, 2)
    _require_success(attempt, run)
    writers = [s["rank"] for s in run.saves]
    if len(writers) != 1 or writers[0] != "0":
        attempt.fail(
            f"under {run.where}, torch.save was called {plural(len(writers), 'time')}"
            + (f", by ranks {sorted(writers)}" if writers else "")
            + ". Exactly one process, global rank 0, must write the checkpoint: "
              "the others would write the same file at the same moment. (LOCAL_RANK is 0 once per host.)")
    losses = run.final_losses()
    if len(losses) != 1:
        attempt.fail(f"under {run.where}, 'final loss' was printed {plural(len(losses), 'time')}; log on rank 0 only.")


def _clean_exit(attempt: Attempt, run: Run | None = None) -> None:
    run = run or _cached_run(attempt, 2, 2)
    _require_success(attempt, run)
    alive = sorted(rank for rank, still in run.exits.items() if still)
    if alive:
        attempt.fail(f"under {run.where}, ranks {alive} still had their process group when they exited: call "
                     "dist.destroy_process_group() at the end of main(), after the last collective.")
    if len(run.exits) != run.world_size:
        attempt.fail(f"under {run.where}, only {len(run.exits)} of {run.world_size} processes exited normally.")


def _any_topology(attempt: Attempt) -> None:
    run = _cached_run(attempt, 1, 3)
    _require_success(attempt, run)
    _judge_result(attempt, run)
    _rank_zero_only(attempt, run)


def _self_check(attempt: Attempt) -> str:
    run = _cached_run(attempt, 1, 2)
    _require_success(attempt, run)
    _judge_result(attempt, run)
    _rank_zero_only(attempt, run)
    _clean_exit(attempt, run)
    return ("Self-check passed: under torchrun with one agent of 2 processes your main() trained to the weights and "
            "loss of one process on the same batches, rank 0 alone printed and saved, and every process destroyed "
            "its group. The hidden tests run two agents of two processes (two simulated hosts) and one of three.")


exercise_7_1 = Exercise(
    number="7.1",
    function="main",
    title="a launcher-ready training script",
    parts=(
        Part("runs", 2, "two torchrun agents of two processes each: every process exits 0.", _runs_part),
        Part("same_result", 3, "the saved weights and printed loss equal one process on the same batches.",
             _same_result),
        Part("rank_zero_only", 2, "global rank 0 alone saves the checkpoint and prints the loss.", _rank_zero_only),
        Part("clean_exit", 1, "every process destroys its process group before exiting.", _clean_exit),
        Part("any_topology", 2, "one agent of three processes: right result, one writer.", _any_topology),
    ),
    visible_check=_self_check,
)

EXERCISES = (exercise_7_1,)
