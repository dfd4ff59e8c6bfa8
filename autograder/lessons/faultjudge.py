"""Judgements of Exercise 7.2 that the visible self-check and the hidden parts share.

Each reads a finished job (:class:`~autograder.kit.torchrun.ScriptRun`) and what its
processes recorded (:class:`~autograder.lessons.faults.Timeline`), and fails the part with
what happened, the values involved and the usual mistake behind it:

- :func:`ran`: the job ended with exit code 0 in time (else the first failing process's account);
- :func:`same_result`: the final weights and printed loss equal the expected ones;
- :func:`resumed`: the restarted attempt began from the newest complete checkpoint, and when it
  went on differently from the killed attempt, why (:func:`why_it_differs`: weights, batch,
  optimizer state, RNG state, rank by rank);
- :func:`in_order`: across the failure every global batch was trained on once, in the data's order.
"""

from __future__ import annotations

from .faults import CKPT_EVERY, FINAL, Timeline, final_weights, schedule
from ..kit.exercise import Attempt
from ..kit.torchrun import ScriptRun
from ..kit.torchrun_feedback import failure_text

__all__ = ["ran", "same_result", "resumed", "in_order", "why_it_differs", "printed_loss"]


def ran(attempt: Attempt, run: ScriptRun, fault: str = "") -> None:
    problem = failure_text(run)
    if problem:
        attempt.fail(problem + (f"\nThe fault: {fault}." if fault else ""))


def printed_loss(run: ScriptRun) -> float | None:
    import re

    found = [float(m[1]) for line in run.output if (m := re.search(r"final loss (-?[\d.]+(?:e-?\d+)?)", line))]
    return found[-1] if found else None


def same_result(attempt: Attempt, run: ScriptRun, weights: list, loss: float, tolerance: float, what: str) -> None:
    """The job's ``FINAL`` weights and printed loss against ``weights`` and ``loss`` (``what`` names them)."""
    got = final_weights(run)
    if got is None:
        attempt.fail(f"under {run.where}, rank 0 saved no readable {{'model': model.module.state_dict()}} to FINAL "
                     f"({FINAL}) in the job's folder.")
    if len(got) != len(weights) or any(g.shape != w.shape for g, w in zip(got, weights)):
        attempt.fail(f"under {run.where}, {FINAL} holds tensors of shapes {[tuple(g.shape) for g in got]}; the "
                     f"course's model has {[tuple(w.shape) for w in weights]}.")
    worst = max((g.double() - w.double()).abs().max().item() for g, w in zip(got, weights))
    if worst > tolerance:
        attempt.fail(f"under {run.where}, the final weights differ from {what} by up to {worst:.3g} (they should agree "
                     f"within {tolerance:g}).")
    printed = printed_loss(run)
    if printed is None or abs(printed - loss) > max(tolerance, 5e-7):
        attempt.fail(f"under {run.where}, the printed final loss is {printed}; {what} reaches {loss:.6f}. Rank 0 "
                     "prints the trained model's loss on the whole dataset, in eval mode: 'final loss {value:.6f}'.")


def why_it_differs(timeline: Timeline, start: int) -> str:
    """Why attempt 1's first step, from the checkpoint after ``start`` steps, differs from attempt 0's own step
    ``start`` (which attempt 0 took before the kill): "" when attempt 0 never took it or they agree."""
    lines = []
    ranks = sorted(timeline.events.get(1, {}))
    for rank in ranks:
        old, new = timeline.steps(0, rank), timeline.steps(1, rank)
        if start >= len(old) or not new:
            continue
        was, now = old[start], new[0]
        if now.before != was.before:
            lines.append(f"rank {rank}: its weights were not those of the checkpoint taken after step {start}")
        if sorted(now.ids) != sorted(was.ids):
            lines.append(f"rank {rank}: it trained on samples {sorted(now.ids)} where the uninterrupted order has "
                         f"{sorted(was.ids)}: the sampler's epoch or position was not restored (set_epoch(epoch), "
                         "then the batches of this epoch from the saved position on)")
        if now.opt != was.opt:
            lines.append(f"rank {rank}: the optimizer's state (SGD's momentum) was not the checkpoint's: save and load "
                         "the optimizer too, not only the model")
        if now.rng != was.rng:
            lines.append(f"rank {rank}: torch's RNG state was not the checkpoint's, so its dropout mask differs")
    rng_off = [line for line in lines if "RNG" in line]
    if rng_off and len(rng_off) < len(ranks):
        lines.append("the RNG state was restored on some ranks only: every process draws the dropout masks, so "
                     "every process must torch.set_rng_state(...) from the checkpoint")
    return "\n".join("  " + line for line in lines)


def resumed(attempt: Attempt, run: ScriptRun, timeline: Timeline, fault: str) -> int:
    """The restarted attempt began from the newest checkpoint completed before the kill; returns its step count."""
    if timeline.kill() is None:
        attempt.fail(f"under {run.where}, the planned fault never happened: no process reached it. The fault: {fault}. "
                     "Train with the course's model, STEPS steps of the sampler's batches.")
    if 1 not in timeline.events:
        attempt.fail(f"under {run.where}, the job ended without torchrun restarting it after the fault ({fault}).")
    newest = max([n for n in timeline.checkpoints(0) if n <= timeline.kill()["n"]], default=0)
    start = timeline.resumed_after(1)
    detail = why_it_differs(timeline, newest)
    if start == newest and newest > 0 and not detail:
        return start
    if start == newest and newest > 0:
        attempt.fail(f"under {run.where}, after {fault}, the restarted processes resumed from the checkpoint of step "
                     f"{start}, but their first step was not the one the killed attempt took from the same point:\n"
                     f"{detail}")
    if newest == 0:
        attempt.fail(f"under {run.where}, no checkpoint was complete when {fault}: save one every CKPT_EVERY "
                     f"({CKPT_EVERY}) steps, on every process that holds part of it.")
    if start == 0:
        attempt.fail(f"under {run.where}, after {fault}, the restarted processes began again from the initial weights "
                     f"although a checkpoint of step {newest} was complete: on start, load the newest complete "
                     "checkpoint and go on from its step.")
    if start is None:
        attempt.fail(f"under {run.where}, after {fault}, the restarted processes began from weights that match no step "
                     f"of the killed attempt (the newest complete checkpoint was step {newest}); loading a checkpoint "
                     "that was still being written, or only part of one, does this." + (f"\n{detail}" if detail else ""))
    attempt.fail(f"under {run.where}, after {fault}, the restarted processes began from step {start}'s weights; the "
                 f"newest complete checkpoint was step {newest}.")


def in_order(attempt: Attempt, run: ScriptRun, timeline: Timeline, steps: int, fault: str) -> None:
    """Steps of the killed attempt up to the checkpoint, then the restarted attempt's: each global batch once, in order."""
    final = max(timeline.attempts)
    lineage: list[list[int]] = []
    for a in range(final + 1):
        start = timeline.resumed_after(a) if a > 0 else 0
        if start is None:
            attempt.fail(f"under {run.where}, after {fault}, attempt {a} began from weights that match no step of "
                         "the attempt before it, so its steps cannot be lined up with the data's order.")
        lineage = lineage[:start]
        taken = len(timeline.steps(a))
        lineage += [timeline.global_ids(a, i) for i in range(taken)]
    if timeline.resumed_after(final) in (0, None) and final > 0:
        attempt.fail(f"under {run.where}, after {fault}, the job started over from the initial weights: nothing was "
                     "resumed, so there is no order across the failure to judge.")
    for step, ids in enumerate(lineage):
        want = schedule(step)
        if ids != want:
            seen = [s for s in range(len(lineage)) if s != step and schedule(s) == ids]
            hint = (f" (the batch of step {seen[0]}: seen twice)" if seen else "")
            attempt.fail(f"under {run.where}, after {fault}, optimizer step {step} of the job's history trained on "
                         f"samples {ids}{hint}; the data's order gives {want}. Resume the sampler at the saved step: "
                         "its epoch (set_epoch) and its position in that epoch.")
    if len(lineage) != steps:
        more = "applied again after the restart" if len(lineage) > steps else "missing"
        attempt.fail(f"under {run.where}, after {fault}, the job's history has {len(lineage)} optimizer steps instead "
                     f"of {steps}: steps were {more}. Save the number of steps taken with the checkpoint and go on "
                     "from it.")
