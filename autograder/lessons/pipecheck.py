"""Checks of hand-built pipeline schedules (lesson 10, Exercises 10.2 and 10.3): the run, and the judging.

The learner's ``gpipe_step(stage, microbatches)`` (or ``one_f_one_b_step``) runs on every rank
with a course-made :class:`helpers.pipeline.Stage`: rank s holds layer s of a chain of
``Linear(d, d)`` layers (tanh between them, mean squared error after the last), and
``microbatches`` is the same list of m ``(inputs, targets)`` pairs on every rank.

- :func:`pipeline_worker` (on the ranks): builds the layers and data for a seed drawn at
  grading time, runs the learner's schedule, and returns the stage's record (its forwards and
  backwards merged with its traced sends and receives), the layer's gradients and the
  one-process reference. Every collective (functional ones included, however they are
  reached) and ``torch.distributed.pipelining`` are switched off by the exercises'
  ``forbid`` (:mod:`autograder.lessons.lesson10`), so activations and gradients can only
  travel by point-to-point messages;
- :func:`judge_gradients`, :func:`judge_messages`, :func:`judge_bubble`, :func:`judge_memory`:
  the feedback. The bubble is read from :class:`helpers.schedule.Schedule`, the records
  replayed on a logical clock (a forward 1 unit, a backward 2, a message none), so it is
  exact and does not depend on how busy the machine was.

The exercises and parts are declared in :mod:`autograder.lessons.lesson10`; this module ships
to learners with it (the self-checks use it).

Example (GPipe's bubble, in the clock's units)::

    >>> from helpers.schedule import Schedule
    >>> Schedule.gpipe_bubble(3, 4)
    Fraction(1, 3)
"""

from __future__ import annotations

from typing import Any, Callable

from .kit import Attempt
from .pieces import plural

__all__ = ["WIDTH", "ROWS", "pipeline_worker", "judge_gradients", "judge_messages", "judge_bubble", "judge_memory",
           "TOLERANCE"]

WIDTH, ROWS = 6, 3  # each layer is Linear(6, 6); each micro-batch has 3 rows
TOLERANCE = 1e-5  # float32: one process and the pipeline add the micro-batches in other orders


def _model(seed: int, stages: int):
    import torch

    torch.manual_seed(seed)
    return [torch.nn.Linear(WIDTH, WIDTH) for _ in range(stages)]


def _microbatches(seed: int, m: int) -> list:
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(ROWS, WIDTH, generator=g), torch.randn(ROWS, WIDTH, generator=g)) for _ in range(m)]


def _reference(layers: list, microbatches: list) -> list[list]:
    """One process, the whole batch: the mean squared error's gradients of every layer."""
    import torch
    import torch.nn.functional as F

    x = torch.cat([inputs for inputs, _ in microbatches])
    target = torch.cat([t for _, t in microbatches])
    h = x
    for i, layer in enumerate(layers):
        h = layer(h) if i == len(layers) - 1 else torch.tanh(layer(h))
    F.mse_loss(h, target).backward()
    return [[p.grad.clone() for p in layer.parameters()] for layer in layers]


def pipeline_worker(rank: int, world_size: int, fn: Callable, seed: int, m: int) -> dict[str, Any]:
    """The learner's schedule on this rank's stage; its record, gradients and the reference."""
    import torch

    from helpers.pipeline import Stage

    layers = _model(seed, world_size)
    layer = layers[rank]
    module = layer if rank == world_size - 1 else torch.nn.Sequential(layer, torch.nn.Tanh())
    stage = Stage(module, (ROWS, WIDTH), (ROWS, WIDTH))
    microbatches = _microbatches(seed, m)
    fn(stage, [(x.clone(), t.clone()) for x, t in microbatches])
    reference = _reference(_model(seed, world_size), microbatches)[rank]
    return {
        "record": stage.record(),
        "grads": [None if p.grad is None else p.grad.detach().clone() for p in layer.parameters()],
        "reference": reference,
    }


def _where(p: int, m: int) -> str:
    return f"with {plural(p, 'stage')} and {plural(m, 'micro-batch', 'micro-batches')}"


def _unfinished(attempt: Attempt, p: int, m: int, replies: list[dict]) -> None:
    for rank, reply in enumerate(replies):
        record = reply["record"]
        ran = {kind: sorted(mb for k, mb, *_ in record["steps"] if k == kind) for kind in ("forward", "backward")}
        for kind, done in ran.items():
            if done != list(range(m)):
                attempt.fail(f"{_where(p, m)}, stage {rank} ran {kind} for micro-batches {done}; every stage runs "
                             f"each of the {m} micro-batches forward once and backward once per step.")


def judge_gradients(attempt: Attempt, p: int, m: int, replies: list[dict]) -> None:
    """Every stage's layer ends with the gradient one process computes on the whole batch."""
    import torch

    _unfinished(attempt, p, m, replies)
    for rank, reply in enumerate(replies):
        for name, got, want in zip(("weight", "bias"), reply["grads"], reply["reference"]):
            if got is not None and torch.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE):
                continue
            hint = ""
            if got is not None and want.norm() > 0:
                ratio = float(got.double().norm() / want.double().norm())
                if m > 1 and abs(ratio - m) < 1e-3:
                    hint = (f" It is {m} times too large: the step's loss is the mean of the {m} micro-batch losses, "
                            f"so start each micro-batch's backward on the last stage with 1/{m}, not 1.")
                elif m > 1 and abs(ratio - 1 / m) < 1e-3:
                    hint = f" It is {m} times too small: divide by the number of micro-batches once, not twice."
            attempt.fail(f"{_where(p, m)}: stage {rank}'s layer {name} gradient differs from one process on the "
                         f"whole batch.\n  expected {want.reshape(-1)[:4].tolist()}\n"
                         f"  actual   {None if got is None else got.reshape(-1)[:4].tolist()}" + hint)


def judge_messages(attempt: Attempt, p: int, m: int, replies: list[dict]) -> None:
    """Each stage sends one activation per micro-batch forward and one gradient per micro-batch back, nothing else."""
    size = ROWS * WIDTH * 4
    for rank, reply in enumerate(replies):
        program = reply["record"]["program"]
        for kind, verb in (("send", "sent"), ("recv", "received")):
            entries = [e for e in program if e[0] == kind]
            want = {}
            if rank < p - 1:
                want[rank + 1] = m  # activations forward (sent) / gradients back (received)
            if rank > 0:
                want[rank - 1] = m
            got = {}
            for _, peer, _, nbytes in entries:
                got[peer] = got.get(peer, 0) + 1
                if nbytes != size:
                    attempt.fail(f"{_where(p, m)}, stage {rank} {verb} a message of {nbytes} bytes; each message "
                                 f"carries one micro-batch's activation or gradient: {ROWS} x {WIDTH} float32 = "
                                 f"{size} bytes.")
            if got != want:
                said = ", ".join(f"{n} with rank {peer}" for peer, n in sorted(got.items(), key=lambda kv: str(kv[0])))
                wanted = ", ".join(f"{n} with rank {peer}" for peer, n in sorted(want.items()))
                attempt.fail(f"{_where(p, m)}, stage {rank} {verb} {plural(len(entries), 'message')} "
                             f"({said or 'none'}); it should have {verb} {wanted}: one per micro-batch to each "
                             "neighbouring stage, activations forward and gradients back.")


def judge_bubble(attempt: Attempt, p: int, m: int, replies: list[dict], schedule_name: str = "GPipe") -> None:
    """The logical clock's bubble equals (p - 1) / (m + p - 1)."""
    from helpers.schedule import Schedule

    run = Schedule([reply["record"] for reply in replies])
    want = Schedule.gpipe_bubble(p, m)
    if run.bubble == want:
        if schedule_name == "GPipe":
            _gpipe_order(attempt, p, m, replies, run)
        return
    first = run.for_rank(0)
    late = [s for i, s in enumerate(s for s in first if s.kind == "forward") if s.start != i]
    hint = ""
    if late:
        s = late[0]
        hint = (f" Stage 0 started micro-batch {s.microbatch}'s forward at time {s.start}, not {s.microbatch}: it "
                "waited for something before feeding the next micro-batch in. Send every micro-batch forward before "
                "waiting for any gradient." if schedule_name == "GPipe" else
                f" Stage 0 started micro-batch {s.microbatch}'s forward at time {s.start}.")
    attempt.fail(f"{_where(p, m)}: on the logical clock (a forward takes 1 unit, a backward 2, a message none) your "
                 f"{schedule_name} step takes {run.makespan} units and the bubble is {run.bubble} "
                 f"({float(run.bubble):.0%} of the ranks' time idle); {schedule_name} takes {3 * (m + p - 1)} units, "
                 f"a bubble of (p - 1) / (m + p - 1) = {want}.{hint}\n"
                 f"Your steps on the clock (F = forward, B = backward, . = idle):\n{run.lanes()}")


def _gpipe_order(attempt: Attempt, p: int, m: int, replies: list[dict], run: Any) -> None:
    """GPipe's order: on every stage, every micro-batch's forward before any backward.

    1F1B has the same bubble on the clock; what tells the two apart is the order, which is
    what Exercise 10.2 asks for (and what keeps all m micro-batches' activations at once).
    """
    for rank, reply in enumerate(replies):
        kinds = [(kind, mb) for kind, mb, *_ in reply["record"]["steps"]]
        last_forward = max((i for i, (kind, _) in enumerate(kinds) if kind == "forward"), default=-1)
        early = [(i, mb) for i, (kind, mb) in enumerate(kinds) if kind == "backward" and i < last_forward]
        if early:
            i, mb = early[0]
            later = [f for kind, f in kinds[i + 1:] if kind == "forward"]
            attempt.fail(f"{_where(p, m)}, stage {rank} ran micro-batch {mb}'s backward before micro-batch "
                         f"{later[0]}'s forward. GPipe runs every micro-batch forward, then every one backward, on "
                         "each stage; interleaving them is 1F1B's order (Exercise 10.3), which has the same bubble "
                         "but is not the schedule this exercise asks for.\n"
                         f"Your steps on the clock (F = forward, B = backward, . = idle):\n{run.lanes()}")


def judge_memory(attempt: Attempt, p: int, m: int, replies: list[dict]) -> None:
    """Stage s never holds more than p - s micro-batches' activations (1F1B)."""
    from helpers.schedule import Schedule

    run = Schedule([reply["record"] for reply in replies])
    for rank in range(p):
        peak = run.peak_held(rank)
        if peak > p - rank:
            attempt.fail(f"{_where(p, m)}, stage {rank} held {plural(peak, 'micro-batch', 'micro-batches')}' "
                         f"activations at once; in 1F1B stage s holds at most p - s = {p - rank}: after "
                         f"{p - rank - 1} warm-up forwards it runs one forward, then one backward, in turn.\n"
                         f"Your steps on the clock (F = forward, B = backward, . = idle):\n{run.lanes()}")
