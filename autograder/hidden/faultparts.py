"""Exercise 7.2's hidden parts: the learner's script under faults the grader plants (instructor only).

Five jobs, each one torchrun agent whose processes are forked from it (one torch import per job),
started two rounds at a time so that their waits overlap:

1. ``straight``: 4 processes, no fault: the reference for the same world size, and the checkpoint
   the reshard jobs start from; ``killed``: 4 processes, one SIGKILLed in the forward of a random
   step (a random rank); ``torn``: 4 processes, one SIGKILLed halfway through writing a checkpoint
   file (one of the ranks that wrote the first checkpoint, other than 0 when there is one, so a
   missing barrier shows);
2. ``on_two`` and ``on_three``: ``straight``'s checkpoint resumed on 2 and on 3 processes for
   RESHARD_STEPS in all.

The faults come from :func:`~autograder.lessons.faults.fault_seed`, named in every message so that
``COURSE_FAULT_SEED=<seed>`` replays them. Every part judges only what it names: ``atomic`` asks
that the restarted job began from the previous complete checkpoint and ended, not that its weights
match (``resumes`` judges that), so one mistake costs the parts that name it.
"""

from __future__ import annotations

from typing import Any

from autograder.lessons import faultjudge as judge
from autograder.lessons import faults
from autograder.kit.exercise import Attempt, GradingFailure
from autograder.kit.torchrun import ScriptRun, run_together, source_key
from autograder.kit.torchrun_feedback import failure_text, group_problem
from autograder.kit.torchrun_programs import clip

__all__ = ["resumes", "no_repeat", "atomic", "reshard", "clean_exit", "RESHARD_STEPS"]

RESHARD_STEPS = faults.STEPS + 6  # the reshard jobs go on past the 4-process job's end, mid-epoch
_jobs: dict[tuple, dict[str, Any]] = {}


def _round_one(attempt: Attempt) -> dict[str, Any]:
    key = (source_key(attempt.fn), faults.fault_seed())
    if key not in _jobs:
        seed = faults.fault_seed()
        kill, write_kill = faults.step_kill(seed, 4), faults.write_kill(seed)
        course = faults.course_72()
        straight, killed, torn = run_together([
            faults.job(attempt.fn, 4, course, label="the uninterrupted job"),
            faults.job(attempt.fn, 4, course, kill=kill, label="the killed job"),
            faults.job(attempt.fn, 4, course, kill=write_kill, label="the job killed while writing")])
        _jobs[key] = {"seed": seed, "straight": straight, "killed": killed, "kill": kill, "torn": torn,
                      "write_kill": write_kill}
    return _jobs[key]


def _round_two(attempt: Attempt) -> dict[str, Any]:
    jobs = _round_one(attempt)
    if "on_two" not in jobs:
        straight = jobs["straight"]
        course = faults.course_72()
        on_two, on_three = run_together([
            faults.job(attempt.fn, 2, course, steps=RESHARD_STEPS, resume_from=straight.folder,
                       label="the 4-process checkpoint resumed on 2"),
            faults.job(attempt.fn, 3, course, steps=RESHARD_STEPS, resume_from=straight.folder,
                       label="the 4-process checkpoint resumed on 3")])
        jobs.update(on_two=on_two, on_three=on_three)
    return jobs


def _straight(attempt: Attempt, jobs: dict[str, Any]) -> ScriptRun:
    straight = jobs["straight"]
    judge.ran(attempt, straight)
    weights, loss = faults.reference(faults.STEPS)
    judge.same_result(attempt, straight, weights, loss, faults.CLOSE, "one process taking the same global batches")
    return straight


def resumes(attempt: Attempt) -> None:
    jobs = _round_one(attempt)
    straight = _straight(attempt, jobs)
    killed = jobs["killed"]
    timeline = faults.Timeline.read(killed.folder)
    fault = faults.where(jobs["kill"], jobs["seed"], died=timeline.kill())
    judge.ran(attempt, killed, fault)
    judge.resumed(attempt, killed, timeline, fault)
    try:
        judge.same_result(attempt, killed, faults.final_weights(straight), judge.printed_loss(straight), faults.SAME,
                          "the uninterrupted job's")
    except GradingFailure as failure:
        newest = timeline.resumed_after(1) or 0
        detail = judge.why_it_differs(timeline, newest)
        attempt.fail(f"{failure.text} The fault: {fault}." + (f" The first step after the restart differed:\n{detail}"
                                                               if detail else ""))


def no_repeat(attempt: Attempt) -> None:
    jobs = _round_one(attempt)
    killed = jobs["killed"]
    timeline = faults.Timeline.read(killed.folder)
    fault = faults.where(jobs["kill"], jobs["seed"], died=timeline.kill())
    judge.ran(attempt, killed, fault)
    if timeline.kill() is None:
        attempt.fail(f"under {killed.where}, the planned fault never happened ({fault}): train STEPS steps with the "
                     "course's model.")
    judge.in_order(attempt, killed, timeline, faults.STEPS, fault)


def _one_file(run: ScriptRun) -> str:
    """The first checkpoint file several processes wrote with torch.save, in words ("" when none)."""
    by_path: dict[tuple, set] = {}
    timeline = faults.Timeline.read(run.folder)
    for e in timeline.of("save", 0):  # files the script named (DCP's own torch.save calls write into streams)
        if e["api"] == "torch.save" and timeline.in_checkpoints(e["path"]):
            by_path.setdefault((e["path"], e["n"]), set()).add(e["rank"])
    for (path, n), ranks in sorted(by_path.items(), key=lambda item: item[0][1]):
        if len(ranks) > 1:
            return (f"ranks {sorted(ranks)} all wrote {path.rsplit('/', 1)[-1]} after step {n}: processes writing one "
                    "file at once leave it torn. One process writes a file; with DCP every process writes its own.")
    return ""


def atomic(attempt: Attempt) -> None:
    jobs = _round_one(attempt)
    clash = _one_file(jobs["straight"])  # from the records, whether or not the job got through
    if clash:
        attempt.fail(f"under {jobs['straight'].where}, {clash}")
    judge.ran(attempt, jobs["straight"])
    torn, kill = jobs["torn"], jobs["write_kill"]
    timeline = faults.Timeline.read(torn.folder)
    died = timeline.kill()
    fault = faults.where(kill, jobs["seed"], died["rank"] if died else None)
    if died is None:
        attempt.fail(f"under {torn.where}, the planned fault never happened: no process wrote a checkpoint file under "
                     f"CKPT_DIR ({faults.CKPT_DIR}) after step {kill['arm']} ({fault}). Save every checkpoint under "
                     "CKPT_DIR, every CKPT_EVERY steps.")
    notes = []
    half = died.get("path", "")
    loaded = [e for e in timeline.of("load") if e["attempt"] > 0 and half and
              (half == e["path"] or half.startswith(e["path"].rstrip("/") + "/"))]
    if loaded:
        notes.append(f"after the restart, rank {loaded[0]['rank']} loaded {loaded[0]['path']}, the checkpoint rank "
                     f"{died['rank']} was writing when it was killed: a checkpoint must count only once every process "
                     "finished writing it (DCP's .metadata, or a marker written after a barrier)")
    # Another process marked the checkpoint the killed one was still writing (same step, before the kill).
    marked = [e for e in timeline.of("rename", 0) if e["rank"] != died["rank"] and e["n"] == died["n"]
              and e["t"] <= died["t"]]
    if marked:
        notes.append(f"rank {marked[0]['rank']} marked a checkpoint complete ({marked[0]['api']} to "
                     f"{marked[0]['dst'].rsplit('/', 1)[-1]}) while rank {died['rank']} was still writing its part: "
                     "call dist.barrier() before marking the newest checkpoint complete")
    detail = "".join(f"\n  {note}" for note in notes)
    problem = failure_text(torn)
    if problem:
        attempt.fail(f"{problem}\nThe fault: {fault}." + detail)
    previous = max([n for n in timeline.checkpoints(0) if n <= died["n"]], default=0)
    start = timeline.resumed_after(1)
    if previous == 0:
        attempt.fail(f"under {torn.where}, no checkpoint was complete before {fault}.")
    if start != previous:
        began = "the initial weights" if start == 0 else "weights of no complete checkpoint" if start is None \
            else f"step {start}'s weights"
        attempt.fail(f"under {torn.where}, after {fault}, the restarted job began from {began}; the previous complete "
                     f"checkpoint was step {previous}." + detail)


def reshard(attempt: Attempt) -> None:
    jobs = _round_two(attempt)
    straight = jobs["straight"]
    judge.ran(attempt, straight)
    saved = max(faults.Timeline.read(straight.folder).checkpoints(0), default=0)
    weights, loss = faults.reference(RESHARD_STEPS)
    for name in ("on_two", "on_three"):
        run = jobs[name]
        judge.ran(attempt, run)
        timeline = faults.Timeline.read(run.folder)
        taken = len(timeline.steps(0))
        if saved == 0 or taken != RESHARD_STEPS - saved:
            attempt.fail(f"under {run.where}, given the 4-process job's checkpoints (the newest of step {saved}), the "
                         f"job took {taken} steps to reach step {RESHARD_STEPS}; resuming takes "
                         f"{RESHARD_STEPS - saved}. Load the newest complete checkpoint whatever the world size.")
        first = timeline.global_ids(0, 0)
        if first != faults.schedule(saved):
            attempt.fail(f"under {run.where}, the first step after resuming at step {saved} trained on samples {first}; "
                         f"the data's order gives {faults.schedule(saved)}. Keep the global batch at GLOBAL_BATCH "
                         "samples (GLOBAL_BATCH // world_size per process) and resume at the saved step.")
        judge.same_result(attempt, run, weights, loss, faults.CLOSE,
                          f"one process taking the same global batches for {RESHARD_STEPS} steps")


def clean_exit(attempt: Attempt) -> None:
    jobs = _round_two(attempt)
    judge.ran(attempt, jobs["straight"])  # a job must end for its exits to be judged; the faulted ones are judged
    problem = group_problem(jobs["straight"])
    if problem:  # a process that never made a group has none to destroy: that proves nothing
        attempt.fail(f"under {jobs['straight'].where}, {problem}: this part pays for every process destroying the "
                     "group it trained in, so each must first have joined the job's group.")
    for name in ("straight", "killed", "torn", "on_two", "on_three"):  # where they ended (their failures are
        run = jobs[name]                                                 # the other parts' business)
        if not run.ok:
            continue
        alive = sorted(rank for rank, still in run.exits.items() if still)
        if alive:
            attempt.fail(f"under {run.where}, ranks {alive} still had their process group when they exited: call "
                         "dist.destroy_process_group() at the end, after the last collective.")
        left = {rank: kids for rank, kids in run.children.items() if kids}
        if left:
            rank, kids = sorted(left.items())[0]
            attempt.fail(f"under {run.where}, rank {rank} left {len(kids)} process(es) running when it returned "
                         f"({clip(kids[0], 80)}): wait for, or shut down, what the script starts (an async checkpointer "
                         "too).")
