"""Lesson 07's graded exercises: 7.1, a launcher-ready training script's ``main()``, and 7.2, one that survives a lost process.

The learner writes ``main()`` for a script that ``torchrun`` starts on every process:
set up the process group from the environment, shard the course's dataset with
``DistributedSampler`` (seed 0, ``set_epoch`` every epoch), train the course's model in
``DistributedDataParallel`` with SGD, and then, on global rank 0 only, print ``final loss
{value:.6f}`` (the trained model's loss on the whole dataset) and save
``{"model": model.module.state_dict()}`` to ``CHECKPOINT``; every process waits for the
save at a barrier (checked: a barrier of each process returns after the save) and destroys its
process group before it returns.

How the checks judge: :meth:`~autograder.kit.exercise.Attempt.torchrun` runs the learner's
``main`` as a script under real ``torchrun`` agents (:mod:`autograder.kit.torchrun`),
with the course's ``make_model``, ``make_dataset`` and constants in place of the notebook's,
so the data cannot differ: two agents of two processes each (two simulated hosts), and one
agent of three, every process forked from its agent (``--run-path --start-method=fork``:
one torch import per agent). Each process records every ``torch.save``, whether its process group was
still alive at exit and, when it failed, its exception with the learner's line. A single
process replays the same global batches for the reference weights and loss. A job that does
not end in time is stopped with everything it started, and each process's stack says where
it was; a failed job's feedback is the first failing process's own account.

Exercise 7.2: the learner's ``resilient_main()`` trains STEPS steps of the course's dropout
model, checkpoints every CKPT_EVERY steps and resumes from the newest complete checkpoint. Its
course pieces, faults and shared judgements are in :mod:`autograder.lessons.faults` and
:mod:`autograder.lessons.faultjudge`; its self-check is here (2 processes, one killed at a
random step); its hidden parts are in :mod:`autograder.hidden.faultparts` (instructor only).

Hidden test cells and the visible self-checks::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("7.1", main, "runs")   # "same_result", "rank_zero_only", "clean_exit", "any_topology"
    exercise("7.1").self_check(main)      # two agents of one process each
    grade("7.2", resilient_main, "resumes")   # "no_repeat", "atomic", "reshard", "clean_exit"
    exercise("7.2").self_check(resilient_main)
"""

from __future__ import annotations

from typing import Any

from .faults import course_72, make_dataset
from ..kit.exercise import Attempt, Exercise, Part
from ..kit.pieces import plural
from ..kit.torchrun import ScriptRun
from ..kit.torchrun_feedback import group_problem

__all__ = ["EXERCISES", "exercise_7_1", "exercise_7_2", "make_model", "make_dataset", "COURSE", "course_72"]

SAMPLES, FEATURES, CLASSES = 48, 6, 3
EPOCHS, BATCH_SIZE, LR = 2, 4, 0.3
CHECKPOINT = "checkpoint.pt"


# -- the course's model and data (the notebook shows the same code) --------------------------


def make_model():
    """The model every process builds: the same weights everywhere (seed 0)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


COURSE: dict[str, Any] = {"make_model": make_model, "make_dataset": make_dataset, "EPOCHS": EPOCHS,
                          "BATCH_SIZE": BATCH_SIZE, "LR": LR, "CHECKPOINT": CHECKPOINT}


def _job(attempt: Attempt, nnodes: int, nproc: int) -> ScriptRun:
    """The learner's main() under torchrun, with the course's model, data and constants; fails the part if it failed."""
    return attempt.torchrun(nnodes, nproc, replace=COURSE, fork=True)


def _runs(attempt: Attempt, run: ScriptRun | None = None) -> ScriptRun:
    """Every process ended well, having joined the job's process group under its global rank."""
    run = run or _job(attempt, 2, 2)
    problem = group_problem(run)
    if problem:
        attempt.fail(f"under {run.where}, {problem}. Every process exited 0, but a script that never joins the job "
                     "has not run under torchrun in any way that counts: call dist.init_process_group() with "
                     "torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) before training.")
    return run


def _final_losses(run: ScriptRun) -> list[float]:
    """Every ``final loss <value>`` line the job printed: the exercise asks rank 0 to print exactly that."""
    import re

    return [float(m[1]) for line in run.output if (m := re.search(r"final loss (-?[\d.]+(?:e-?\d+)?)", line))]


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


def _judge_result(attempt: Attempt, run: ScriptRun) -> None:
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
    losses = _final_losses(run)
    if not losses:
        attempt.fail(f"under {run.where}, no process printed 'final loss <value>'; rank 0 should print the trained "
                     "model's loss on the whole dataset.")
    if abs(losses[0] - loss) > 1e-4:
        attempt.fail(f"under {run.where}, the printed final loss is {losses[0]:.6f}; the trained model's loss on the "
                     f"whole dataset is {loss:.6f}.")


def _rank_zero_only(attempt: Attempt, run: ScriptRun | None = None) -> None:
    run = run or _job(attempt, 2, 2)
    writers = [s["rank"] for s in run.saves]
    if len(writers) != 1 or writers[0] != "0":
        attempt.fail(
            f"under {run.where}, torch.save was called {plural(len(writers), 'time')}"
            + (f", by ranks {sorted(writers)}" if writers else "")
            + ". Exactly one process, global rank 0, must write the checkpoint: "
              "the others would write the same file at the same moment. (LOCAL_RANK is 0 once per host.)")
    losses = _final_losses(run)
    if len(losses) != 1:
        attempt.fail(f"under {run.where}, 'final loss' was printed {plural(len(losses), 'time')}; log on rank 0 only.")


def _clean_exit(attempt: Attempt, run: ScriptRun | None = None) -> None:
    run = run or _job(attempt, 2, 2)
    problem = group_problem(run)
    if problem:
        attempt.fail(f"under {run.where}, {problem}: this part pays for every process of the job waiting for rank "
                     "0's checkpoint and then destroying its process group, so each must first have joined it.")
    written = max(run.saved.get("0", []), default=None)  # when rank 0's checkpoint was on disk
    if written is None:
        attempt.fail(f"under {run.where}, rank 0 saved no checkpoint, so no process could wait for it: save it on "
                     "rank 0, then call dist.barrier() on every rank.")
    else:
        left = [rank for rank in map(str, range(run.world_size)) if not any(t >= written for t in run.barriers.get(rank, []))]
        if left:
            attempt.fail(f"under {run.where}, {'rank' if len(left) == 1 else 'ranks'} {', '.join(left)} did not wait at "
                         "a dist.barrier() for rank 0's checkpoint: no barrier of theirs returned after rank 0's "
                         "torch.save did. A process that goes on (to exit, or to read the checkpoint) must not pass "
                         "that point before the file exists: call dist.barrier() on every rank after the save.")
    alive = sorted(rank for rank, still in run.exits.items() if still)
    if alive:
        attempt.fail(f"under {run.where}, ranks {alive} still had their process group when they exited: call "
                     "dist.destroy_process_group() at the end of main(), after the last collective.")
    if len(run.exits) != run.world_size:
        attempt.fail(f"under {run.where}, only {len(run.exits)} of {run.world_size} processes exited normally.")


def _self_check(attempt: Attempt) -> str:
    # Two simulated hosts of one process each: LOCAL_RANK is 0 on both, so a LOCAL_RANK used as the global rank shows.
    run = _job(attempt, 2, 1)
    _judge_result(attempt, run)
    _rank_zero_only(attempt, run)
    _clean_exit(attempt, run)
    return ("Self-check passed: under torchrun with two agents (two simulated hosts) of one process each, your main() "
            "trained to the weights and loss of one process on the same batches, rank 0 alone printed and saved, "
            "every process waited at a barrier for the checkpoint, and every process destroyed its group. The hidden "
            "tests run two agents of two processes and one agent of three.")


exercise_7_1 = Exercise(
    number="7.1",
    function="main",
    title="a launcher-ready training script",
    parts=(
        Part("runs", 2, "two torchrun agents of two processes each: every process joins the job's process group "
             "and exits 0."),
        Part("same_result", 3, "the saved weights and printed loss equal one process on the same batches."),
        Part("rank_zero_only", 2, "global rank 0 alone saves the checkpoint and prints the loss."),
        Part("clean_exit", 1, "every process waits at a barrier for rank 0's checkpoint, then destroys its process "
             "group before exiting."),
        Part("any_topology", 2, "one agent of three processes: right result, one writer."),
    ),
    visible_check=_self_check,
)


# -- Exercise 7.2: a script that survives a lost process --------------------------------------------------


def _self_check_72(attempt: Attempt) -> str:
    from . import faultjudge as judge
    from . import faults
    from ..kit.torchrun import run_together

    seed = faults.fault_seed()
    kill = faults.step_kill(seed, 2)
    killed = run_together([faults.job(attempt.fn, 2, course_72(), kill=kill, label="the job with a fault")])[0]
    timeline = faults.Timeline.read(killed.folder)
    fault = faults.where(kill, seed, died=timeline.kill())
    judge.ran(attempt, killed, fault)
    start = judge.resumed(attempt, killed, timeline, fault)
    judge.in_order(attempt, killed, timeline, faults.STEPS, fault)
    weights, loss = faults.reference(faults.STEPS)
    judge.same_result(attempt, killed, weights, loss, faults.CLOSE, "one process taking the same global batches")
    return (f"Self-check passed: on 2 processes, {fault}; torchrun restarted the job, which resumed from the "
            f"checkpoint of step {start} with the weights, optimizer state and RNG state it had saved (bit for bit), "
            "trained every global batch once, and ended with the weights and loss of one process taking the same "
            "global batches. The hidden tests run 4 processes, also without a fault, kill one while it writes a "
            "checkpoint, resume a 4-process checkpoint on 2 and 3 processes, and check that nothing is left behind.")


exercise_7_2 = Exercise(
    number="7.2",
    function="resilient_main",
    title="a training script that survives a lost process",
    parts=(
        Part("resumes", 3, "4 processes, one killed at a random step: torchrun restarts the job, which resumes from the "
             "newest complete checkpoint (its state restored bit for bit) and ends with an uninterrupted run's weights and loss."),
        Part("no_repeat", 2, "across the failure every global batch is trained on once, in the data's order: no step "
             "applied twice, no batch skipped."),
        Part("atomic", 2, "a process killed while it writes a checkpoint leaves the previous one usable: the job "
             "resumes from it and ends right."),
        Part("reshard", 2, "a 4-process checkpoint resumed on 2 and on 3 processes ends equal to one process taking the "
             "same global batches."),
        Part("clean_exit", 1, "every process destroys its process group and leaves no process behind."),
    ),
    visible_check=_self_check_72,
)

EXERCISES = (exercise_7_1, exercise_7_2)
