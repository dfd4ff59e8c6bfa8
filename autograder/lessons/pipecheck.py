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
           "judge_chunk_gradients", "judge_interleaved_bubble", "TOLERANCE"]

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


def pipeline_worker(rank: int, world_size: int, fn: Callable, seed: int, m: int, chunks: int = 0) -> dict[str, Any]:
    """The learner's schedule on this rank's stage; its record, gradients and the reference.

    With ``chunks`` (Exercise 10.4) the model has ``chunks * p`` layers and the rank holds
    ``chunks`` of them, chunk c being layer ``c * p + rank``: ``fn(stages, microbatches)`` gets
    the list of this rank's chunks. ``"grads"`` and ``"reference"`` then hold one entry per chunk.
    """
    import torch

    from helpers.pipeline import Stage

    pieces = world_size * max(chunks, 1)
    layers = _model(seed, pieces)
    mine = [c * world_size + rank for c in range(max(chunks, 1))]
    stages = [Stage(layers[k] if k == pieces - 1 else torch.nn.Sequential(layers[k], torch.nn.Tanh()),
                    (ROWS, WIDTH), (ROWS, WIDTH), chunk=c, num_chunks=max(chunks, 1)) for c, k in enumerate(mine)]
    microbatches = _microbatches(seed, m)
    fn(stages if chunks else stages[0], [(x.clone(), t.clone()) for x, t in microbatches])
    reference = _reference(_model(seed, pieces), microbatches)
    grads = [[None if p.grad is None else p.grad.detach().clone() for p in layers[k].parameters()] for k in mine]
    return {
        "record": Stage.record_all(stages),
        "grads": grads if chunks else grads[0],
        "reference": [reference[k] for k in mine] if chunks else reference[rank],
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
    _unfinished(attempt, p, m, replies)
    for rank, reply in enumerate(replies):
        _judge_layer(attempt, p, m, f"stage {rank}'s layer", reply["grads"], reply["reference"])


def judge_chunk_gradients(attempt: Attempt, p: int, m: int, replies: list[dict]) -> None:
    """Exercise 10.4: every chunk of every rank ends with one process's gradient of its layer."""
    for rank, reply in enumerate(replies):
        left = reply["record"]["unfinished"]
        if left:
            chunk, i = left[0]
            attempt.fail(f"{_where(p, m)}, rank {rank}'s chunk {chunk} still holds micro-batch {i}'s activations: "
                         "every micro-batch goes forward and backward once through every chunk.")
        pieces = len(reply["grads"]) * p
        for chunk, (got, want) in enumerate(zip(reply["grads"], reply["reference"])):
            _judge_layer(attempt, p, m, f"rank {rank}'s chunk {chunk} (layer {chunk * p + rank} of {pieces})", got, want)


def _judge_layer(attempt: Attempt, p: int, m: int, what: str, grads: list, reference: list) -> None:
    import torch

    for name, got, want in zip(("weight", "bias"), grads, reference):
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
        attempt.fail(f"{_where(p, m)}: {what} {name} gradient differs from one process on the "
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


def judge_interleaved_bubble(attempt: Attempt, p: int, m: int, replies: list[dict]) -> None:
    """Exercise 10.4: the logical clock's bubble equals (p - 1) / (v m + p - 1) with v chunks per rank."""
    from helpers.schedule import Schedule

    chunks = replies[0]["record"]["num_chunks"]
    run = Schedule([reply["record"] for reply in replies])
    want = Schedule.interleaved_bubble(p, m, chunks)
    if run.bubble == want:
        return
    hint = ""
    if run.bubble == Schedule.gpipe_bubble(p, m):
        hint = (" That is GPipe's bubble, as if each rank held one layer: a rank must move on to its next chunk's "
                "work while the micro-batches it sent on are still travelling round the other ranks.")
    attempt.fail(f"{_where(p, m)}, {chunks} chunks per rank: on the logical clock (a forward of one chunk takes 1 "
                 f"unit, a backward 2) your schedule takes {run.makespan} units and the bubble is {run.bubble}; an "
                 f"interleaved schedule takes {3 * (chunks * m + p - 1)}, a bubble of (p - 1) / (v m + p - 1) = "
                 f"{want}.{hint}\nYour steps on the clock (F3b = forward of micro-batch 3 on chunk 1):\n{run.lanes()}")


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
