"""Checks of hand-built pipeline schedules (lesson 10, Exercises 10.2-10.4): the run, and the judging.

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
  exact and does not depend on how busy the machine was. 1F1B (Exercise 10.3) is the only
  order with GPipe's bubble that holds at most p - s micro-batches on stage s
  (:func:`one_f_one_b_order`), so its gradients and bubble are judged with that order and its
  memory with exactly p - s at the peak.

A case may give every stage a frozen bias and a parameter its forward never uses (:data:`SPARE`):
torch's autograd leaves their ``.grad`` None, and so must the learner's step.

The exercises and parts are declared in :mod:`autograder.lessons.lesson10`; this module ships
to learners with it (the self-checks use it).

Example (GPipe's bubble, in the clock's units)::

    >>> from helpers.schedule import Schedule
    >>> Schedule.gpipe_bubble(3, 4)
    Fraction(1, 3)
"""

from __future__ import annotations

from typing import Any, Callable

from ..kit.exercise import Attempt
from ..kit.pieces import plural

__all__ = ["WIDTH", "ROWS", "pipeline_worker", "judge_gradients", "judge_messages", "judge_bubble", "judge_memory",
           "judge_chunk_gradients", "judge_interleaved_bubble", "judge_finished", "one_f_one_b_order", "TOLERANCE",
           "SPARE"]

WIDTH, ROWS = 6, 3  # each layer is Linear(6, 6); each micro-batch has 3 rows
TOLERANCE = 1e-5  # float32: one process and the pipeline add the micro-batches in other orders


#: A stage's parameters in the order its gradients are compared: the layer's, then (in the cases with spare
#: parameters) the one its forward never uses.
PARAMETERS = ("weight", "bias", "spare")
#: What the cases with spare parameters say of them, as feedback words it.
SPARE = ("each stage's layer with its bias frozen (requires_grad=False) and a parameter, spare, that its forward "
         "never uses")


def _model(seed: int, stages: int, spare: bool = False):
    """The chain's layers for ``seed``; with ``spare`` every layer's bias is frozen (``requires_grad=False``)."""
    import torch

    torch.manual_seed(seed)
    layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(stages)]
    for layer in layers:
        layer.bias.requires_grad_(not spare)
    return layers


def _stage_module(layer, last: bool, spare: bool):
    """What a stage runs: the layer (tanh after it but on the last stage); with ``spare``, a module that also
    holds a parameter its forward never uses, as models with frozen or unused parts do."""
    import torch

    body = layer if last else torch.nn.Sequential(layer, torch.nn.Tanh())
    if not spare:
        return body

    class WithSpare(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = body
            self.spare = torch.nn.Parameter(torch.zeros(WIDTH))

        def forward(self, x):
            return self.body(x)

    return WithSpare()


def _microbatches(seed: int, m: int) -> list:
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(ROWS, WIDTH, generator=g), torch.randn(ROWS, WIDTH, generator=g)) for _ in range(m)]


def _reference(layers: list, microbatches: list, spare: bool = False) -> list[list]:
    """One process, the whole batch: the mean squared error's gradients of every layer (None where torch leaves
    none: a frozen bias, an unused spare)."""
    import torch
    import torch.nn.functional as F

    x = torch.cat([inputs for inputs, _ in microbatches])
    target = torch.cat([t for _, t in microbatches])
    h = x
    for i, layer in enumerate(layers):
        h = layer(h) if i == len(layers) - 1 else torch.tanh(layer(h))
    F.mse_loss(h, target).backward()
    return [[None if p.grad is None else p.grad.clone() for p in layer.parameters()] + ([None] if spare else [])
            for layer in layers]


def pipeline_worker(rank: int, world_size: int, fn: Callable, seed: int, m: int, chunks: int = 0,
                    spare: bool = False) -> dict[str, Any]:
    """The learner's schedule on this rank's stage; its record, gradients and the reference.

    With ``chunks`` (Exercise 10.4) the model has ``chunks * p`` layers and the rank holds
    ``chunks`` of them, chunk c being layer ``c * p + rank``: ``fn(stages, microbatches)`` gets
    the list of this rank's chunks. ``"grads"`` and ``"reference"`` then hold one entry per chunk.
    With ``spare`` every layer's bias is frozen and every stage holds one more parameter that its
    forward never uses (:data:`SPARE`): their gradients must stay None, as torch leaves them.
    """
    from helpers.pipeline import Stage

    pieces = world_size * max(chunks, 1)
    layers = _model(seed, pieces, spare)
    mine = [c * world_size + rank for c in range(max(chunks, 1))]
    modules = [_stage_module(layers[k], k == pieces - 1, spare) for k in mine]
    stages = [Stage(module, (ROWS, WIDTH), (ROWS, WIDTH), chunk=c, num_chunks=max(chunks, 1))
              for c, module in enumerate(modules)]
    microbatches = _microbatches(seed, m)
    fn(stages if chunks else stages[0], [(x.clone(), t.clone()) for x, t in microbatches])
    reference = _reference(_model(seed, pieces, spare), microbatches, spare)
    grads = [[None if p.grad is None else p.grad.detach().clone()
              for p in list(layers[k].parameters()) + ([module.spare] if spare else [])]
             for k, module in zip(mine, modules)]
    return {
        "record": Stage.record_all(stages),
        "grads": grads if chunks else grads[0],
        "reference": [reference[k] for k in mine] if chunks else reference[rank],
    }


def _where(p: int, m: int) -> str:
    return f"with {plural(p, 'stage')} and {plural(m, 'micro-batch', 'micro-batches')}"


def judge_finished(attempt: Attempt, p: int, m: int, replies: list[dict]) -> None:
    """Every stage ran each micro-batch forward once and backward once."""
    for rank, reply in enumerate(replies):
        record = reply["record"]
        ran = {kind: sorted(mb for k, mb, *_ in record["steps"] if k == kind) for kind in ("forward", "backward")}
        for kind, done in ran.items():
            if done != list(range(m)):
                attempt.fail(f"{_where(p, m)}, stage {rank} ran {kind} for micro-batches {done}; every stage runs "
                             f"each of the {m} micro-batches forward once and backward once per step.")


def judge_gradients(attempt: Attempt, p: int, m: int, replies: list[dict], schedule_name: str = "GPipe") -> None:
    """Every stage's layer ends with the gradient one process computes on the whole batch; for 1F1B
    (Exercise 10.3), computed in 1F1B's order."""
    judge_finished(attempt, p, m, replies)
    for rank, reply in enumerate(replies):
        _judge_layer(attempt, p, m, f"stage {rank}'s layer", reply["grads"], reply["reference"])
    if schedule_name == "1F1B":
        _one_f_one_b(attempt, p, m, replies)


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

    for name, got, want in zip(PARAMETERS, grads, reference):
        if want is None:
            if got is not None:
                why = ("was given frozen (requires_grad=False)" if name == "bias" else
                       "is a parameter of the stage that its forward never uses")
                attempt.fail(f"{_where(p, m)}: {what} {name} {why}, yet after your step its .grad is a tensor "
                             f"({got.reshape(-1)[:4].tolist()}...). torch's autograd leaves the .grad of a parameter "
                             "that gets no gradient None, and an optimizer then leaves the parameter alone; one that "
                             "finds zeros there still moves it (weight decay, momentum). Touch only the gradients "
                             "that exist: `if p.grad is not None`.")
            continue
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
        elif schedule_name == "1F1B":
            _one_f_one_b(attempt, p, m, replies)
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
    """Stage s holds at most p - s micro-batches' activations, and that many at its peak (1F1B fills the pipeline)."""
    from helpers.schedule import Schedule

    run = Schedule([reply["record"] for reply in replies])
    for rank in range(p):
        peak, most = run.peak_held(rank), min(p - rank, m)
        if peak > most:
            attempt.fail(f"{_where(p, m)}, stage {rank} held {plural(peak, 'micro-batch', 'micro-batches')}' "
                         f"activations at once; in 1F1B stage s holds at most p - s = {p - rank}: after "
                         f"{p - rank - 1} warm-up forwards it runs one forward, then one backward, in turn.\n"
                         f"Your steps on the clock (F = forward, B = backward, . = idle):\n{run.lanes()}")
        if peak < most:
            held = "1 micro-batch's" if peak == 1 else f"{peak} micro-batches'"
            attempt.fail(f"{_where(p, m)}, stage {rank} never held more than {held} activations at once; 1F1B first "
                         f"fills the pipeline with p - s - 1 = {plural(p - rank - 1, 'warm-up forward')}, so stage s "
                         f"holds p - s = {most} at its "
                         "peak. Holding fewer means the stage waited for a gradient before the pipeline was full: "
                         "that is not 1F1B, and it lengthens the step.\n"
                         f"Your steps on the clock (F = forward, B = backward, . = idle):\n{run.lanes()}")


def one_f_one_b_order(p: int, stage: int, m: int) -> list[tuple[str, int]]:
    """1F1B's order on ``stage`` of ``p``: p - s - 1 warm-up forwards, then one forward and one backward in
    turn, then the remaining backwards (the only order with 1F1B's bubble that holds at most p - s at once).

    >>> " ".join(f"{kind[0].upper()}{i}" for kind, i in one_f_one_b_order(3, 0, 4))
    'F0 F1 F2 B0 F3 B1 B2 B3'
    """
    warmup = min(p - stage - 1, m)
    steady = [step for i in range(m - warmup) for step in (("forward", warmup + i), ("backward", i))]
    return ([("forward", i) for i in range(warmup)] + steady + [("backward", i) for i in range(m - warmup, m)])


def _one_f_one_b(attempt: Attempt, p: int, m: int, replies: list[dict]) -> None:
    """Exercise 10.3: every stage ran its micro-batches in 1F1B's order; else say which order it was."""
    from helpers.schedule import Schedule

    def letters(steps: list) -> str:
        return " ".join(f"{'F' if kind == 'forward' else 'B'}{i}" for kind, i in steps)

    for rank, reply in enumerate(replies):
        ran = [(kind, mb) for kind, mb, *_ in reply["record"]["steps"]]
        want = one_f_one_b_order(p, rank, m)
        if ran == want:
            continue
        forwards = [i for i, (kind, _) in enumerate(ran) if kind == "forward"]
        hint = ""
        if forwards == list(range(m)) and m > 1:
            hint = (" Every forward before any backward is GPipe's order (Exercise 10.2): it keeps all m "
                    "micro-batches' activations.")
        elif ran == [step for i in range(m) for step in (("forward", i), ("backward", i))] and rank < p - 1:
            hint = (" Each micro-batch went forward and backward before the next one went forward: the pipeline "
                    "never fills, and the ranks wait for each other in turn.")
        attempt.fail(f"{_where(p, m)}, stage {rank} ran {letters(ran)}; 1F1B runs {letters(want)} there: "
                     f"p - s - 1 = {plural(min(p - rank - 1, m), 'warm-up forward')}, then one forward and one "
                     f"backward in turn, then the remaining backwards.{hint}\n"
                     "Your steps on the clock (F = forward, B = backward, . = idle):\n"
                     f"{Schedule([r['record'] for r in replies]).lanes()}")
