"""What a failed or stopped torchrun job tells the learner: who failed first, how, and where.

Everything here reads the typed records of a :class:`~autograder.kit.torchrun.ScriptRun`
(exit codes, each failed process's exception, frames and declared options, the stacks of a
job that was stopped), never the text of a traceback.
"""

from __future__ import annotations

from pathlib import Path

from .pieces import plural
from .torchrun import SCRIPT, STDERR_LINES, Failure, Frame, ScriptRun
from .torchrun_programs import clip

__all__ = ["failure_text", "describe_failure", "group_problem"]


def _short(filename: str, folder: Path) -> str:
    """``train.py`` for the job's files, ``torch/...`` for an installed package's, else the name as it is."""
    path = Path(filename)
    if path.parent == folder:
        return path.name
    parts = path.parts
    if "site-packages" in parts:
        return "/".join(parts[parts.index("site-packages") + 1:])
    return filename


def _frames_text(run: ScriptRun, frames: list[Frame]) -> list[str]:
    """The traceback from the script's first frame on, without the course's wrapper, two lines a frame."""
    first = next((i for i, f in enumerate(frames) if f.in_script), 0)
    shown = [f for f in frames[first:] if Path(f.filename).name != "graded_run.py"]
    lines = []
    for f in shown:
        lines.append(f'File "{_short(f.filename, run.folder)}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append("  " + f.line.strip())
    return lines[-2 * STDERR_LINES:]


def _in_brief(failure: Failure) -> str:
    """``ValueError: ...``, ``SIGTERM`` or ``exit code 3``: one failure in a few words."""
    if failure.exc_type:
        return clip(failure.exception.splitlines()[0], 120)
    return failure.signal or f"exit code {failure.exitcode}"


def describe_failure(run: ScriptRun, failure: Failure) -> str:
    """What one failed process did, in the words of the feedback: who, how it ended, its exception or last lines."""
    who = f"rank {failure.rank}"
    if run.nnodes > 1:
        who += f" (local rank {failure.local_rank} under torchrun agent {failure.agent})"
    if failure.exc_type:
        code = f" (exit code {failure.exitcode})" if failure.exitcode not in (None, 1) else ""
        text = f"{who} raised {failure.exception}{code}"
        mine = [f for f in failure.frames if f.in_script]
        if mine:
            at = mine[-1]
            source = run.source(at.lineno)
            text += f"\n  at {SCRIPT} line {at.lineno}, in {at.name}" + (f": {source}" if source else "")
        lines = _frames_text(run, failure.frames)
        if lines:
            text += "\nIts traceback ends:\n" + "\n".join("  " + clip(line, 200) for line in lines)
        return text
    if failure.signal:
        text = f"{who} was killed by {failure.signal} (exit code {failure.exitcode}), without a Python exception"
    else:
        text = (f"{who} exited with code {failure.exitcode} without a Python exception (sys.exit, os._exit, "
                "or an error outside Python ends a process this way)")
    stream, lines = ("stderr", failure.stderr) if failure.stderr else ("stdout", failure.stdout)
    if lines:
        text += f". Its last lines on {stream}:\n" + "\n".join("  " + clip(line, 200) for line in lines)
    else:
        text += ". It wrote nothing."
    return text


def _where_they_waited(run: ScriptRun) -> str:
    """Where each process was when the job was stopped: its innermost frame in the learner's script."""
    lines = []
    for rank, frames in sorted(run.stacks.items()):
        mine = next((f for f in frames if f.in_script), None)  # innermost first
        if mine:
            lines.append(f"  rank {rank} was at {SCRIPT} line {mine.lineno}, in {mine.name}: {run.source(mine.lineno)}")
    return "\n".join(lines)


def _beyond_python(frame: Frame) -> bool:
    """Whether ``frame`` is outside Python's own library: an installed package's, or the learner's script's."""
    return "site-packages" in Path(frame.filename).parts or frame.in_script


def _busy(frames: list[Frame]) -> bool:
    """Whether a thread with these frames was doing something (an idle pool worker waits in concurrent.futures or
    queue, and Python ends it at exit)."""
    return any(_beyond_python(f) for f in frames)


def _writing_checkpoint(stacks: list[list[Frame]]) -> bool:
    """Whether one of these threads was in torch.distributed.checkpoint (a save written in the background)."""
    return any("checkpoint" in Path(f.filename).parts for frames in stacks for f in frames)


def _threads_left(run: ScriptRun) -> str | None:
    """When every process returned from main() and the job still hung: the threads that kept them alive, and what to
    do about them (None when that is not what happened)."""
    if not run.timed_out or len(run.exits) < run.world_size:
        return None
    lines, checkpoint = [], False
    for rank, threads in sorted(run.waiting.items(), key=lambda item: (not item[0].isdigit(), item[0].zfill(6))):
        busy = [(name, frames) for name, frames in threads if _busy(frames)]
        if not busy:
            continue
        name, frames = busy[-1]  # the newest
        mine = next((f for f in frames if _beyond_python(f)), frames[0])
        checkpoint |= _writing_checkpoint([fs for _, fs in busy])
        many = f"{len(busy)} threads, the newest" if len(busy) > 1 else "a thread"
        lines.append(f"  rank {rank}: {many} named {name}, in {_short(mine.filename, run.folder)} line {mine.lineno}, "
                     f"in {mine.name}")
    if not lines:
        return None
    text = ("every process had returned from main() (its exit was recorded), yet the job did not end: before a "
            "process ends, Python waits for every thread it started that is not a daemon, and these were still "
            "running:\n" + "\n".join(lines))
    if checkpoint:
        text += ("\ndcp.async_save writes in a thread of its own and returns a future at once: call .result() on it "
                 "before the next save and before dist.destroy_process_group(). A write still running when its "
                 "process group is destroyed waits forever for the other ranks.")
    return text


def _saving_beside(run: ScriptRun) -> str:
    """A sentence when, as the job hung, a thread beside the script's was still writing a checkpoint (async_save)."""
    if not any(_writing_checkpoint(stacks) for stacks in run.beside.values()):
        return ""
    return ("\nMeanwhile a checkpoint was still being written in a thread of its own (dcp.async_save). Its collectives "
            "run on the default process group unless it is given another, and there they interleave with the "
            "training's (DDP's all-reduce in backward) in a different order on each rank: give it a group of its "
            "own, dcp.async_save(..., process_group=dist.new_group(backend=\"gloo\")).")


def _hint(run: ScriptRun) -> str:
    """A sentence for two mistakes of scripts moved from the old launcher, read from the processes' records."""
    if any(o in ("--local-rank", "--local_rank") for f in run.failures for o in f.options):
        return ("\ntorchrun does not pass --local-rank on the command line (only the old torch.distributed.launch "
                "did): read LOCAL_RANK from the environment, os.environ['LOCAL_RANK'].")
    if any(f.exc_type == "KeyError" and f.frames and Path(f.frames[-1].filename).stem in ("os", "<frozen os>")
           for f in run.failures):
        return "\nA variable your main() read from os.environ is not one torchrun sets."
    return ""


def failure_text(run: ScriptRun) -> str | None:
    """None when every agent exited 0 in time; else what went wrong, for the feedback."""
    if run.timed_out:
        left = _threads_left(run)
        if left:
            return f"under {run.where}, the job did not finish within {run.timeout:g} s and was stopped: {left}"
        where = _where_they_waited(run)
        return (f"under {run.where}, the job did not finish within {run.timeout:g} s and was stopped."
                + (f" Where the processes were:\n{where}" if where else "")
                + f"\nThe job's last lines:\n{run.tail()}\nA process that waits for a collective the others "
                  "never make hangs; so does a process group whose ranks disagree (a hard-coded rank)."
                + _saving_beside(run))
    failed = [(i, code) for i, code in enumerate(run.codes) if code != 0]
    if not failed:
        return None
    hint = _hint(run)
    if run.failures:  # what torchrun's agents recorded: the first failure in time is the root cause
        first, *others = run.failures
        also = ""
        if others:
            also = "\nAlso failed after it: " + "; ".join(f"rank {f.rank} ({_in_brief(f)})" for f in others[:3]) + (
                "; ..." if len(others) > 3 else "")
        return (f"under {run.where}, a process failed and torchrun stopped the job (agent {first.agent} exited with "
                f"code {run.codes[first.agent]}). The first to fail:\n{describe_failure(run, first)}{also}{hint}")
    agent, code = failed[0]  # no agent recorded a failed process (the agent itself failed): the job's last lines
    return f"under {run.where}, torchrun agent {agent} exited with code {code}. The job's last lines:\n{run.tail()}{hint}"


def group_problem(run: ScriptRun) -> str | None:
    """What was wrong with the process groups of the processes that exited (None: each joined one group of the whole
    job under its own global rank): a process that made none, or one of another size or rank."""
    for rank in sorted(run.exits, key=lambda r: (not r.isdigit(), int(r) if r.isdigit() else 0, r)):
        joined = run.joined.get(rank)
        if joined is None:
            return f"rank {rank} exited without ever making a process group (dist.init_process_group)"
        if joined[1] != run.world_size:
            return (f"rank {rank} made a process group of {plural(joined[1], 'process', 'processes')}; the job "
                    f"has {run.world_size} (WORLD_SIZE, which torchrun sets)")
        if str(joined[0]) != rank:
            return (f"the process torchrun started as global rank {rank} joined its process group as rank "
                    f"{joined[0]} (use RANK, not LOCAL_RANK)")
    return None
