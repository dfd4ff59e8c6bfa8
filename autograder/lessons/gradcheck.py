"""Checks of hand-built gradient averaging (lessons 05 and 06): the graded models and data, and what runs on the ranks.

- :func:`graded_model`, :func:`graded_batch`, :func:`shard_loss`: the same model and data on
  every process for one seed, in the kinds Exercise 5.1 is tried on (plain, a frozen bias, an
  unused head, a head one rank uses, tied weights);
- :func:`reference_grads`: the mean over the ranks of each shard's gradient, in one process;
- :func:`grad_worker` (on the ranks): one backward pass on this rank's shard, then the
  learner's ``average_gradients``; it returns the gradients, the reference and what changed;
- :func:`signature_worker` and :func:`judge_signature`: every rank's gradient set to 2**rank,
  so the value each rank ends with says which ranks were summed and what it was divided by;
- :func:`training_worker` (on the ranks): a few optimizer steps with the learner's averaging
  against the same steps in one process;
- for lesson 06's wrappers (``PerParameterDDP``, ``MiniDDP``): :func:`wrapper_model`,
  :func:`wrapper_batch` and :func:`wrapper_reference` (one process on the whole batch), and on the
  ranks :func:`wrapper_broadcast_worker` and :func:`wrapper_step_worker`, which record what
  each step sent and when.

The exercises and parts are declared in :mod:`autograder.lessons.lesson05` and
:mod:`autograder.lessons.lesson06`; this module ships to learners with them (the self-checks use it).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..kit.exercise import Attempt
from ..kit.pieces import HALF_FINISHED, plural, read_before_wait, recorded, usable

__all__ = ["graded_model", "graded_batch", "shard_loss", "reference_grads", "grad_worker", "signature_worker",
           "judge_signature", "training_worker", "WIDTHS", "LATE", "wrapper_model", "wrapper_batch", "wrapper_reference",
           "wrapper_broadcast_worker", "wrapper_step_worker"]


def graded_model(kind: str, dtype_name: str, seed: int):
    import torch
    import torch.nn as nn

    class TwoHeads(nn.Module):
        """``body`` then ``head``; ``spare``, where the kind has one, is a second head used
        only where ``use_spare``; ``square`` (tied kind) is one weight applied twice."""

        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(5, 6)
            self.head = nn.Linear(6, 3)
            self.spare = nn.Linear(6, 3) if kind in ("unused_everywhere", "unused_on_rank_0") else None
            self.square = nn.Linear(6, 6, bias=False) if kind == "tied" else None

        def forward(self, x, use_spare: bool = False):
            h = torch.tanh(self.body(x))
            if self.square is not None:
                h = torch.tanh(self.square(torch.tanh(self.square(h))))
            out = self.head(h)
            return out + self.spare(h) if use_spare else out

    torch.manual_seed(seed)
    model = TwoHeads().to(getattr(torch, dtype_name))
    if kind == "frozen":
        model.body.bias.requires_grad_(False)
    return model


def graded_batch(seed: int, size: int, dtype_name: str):
    import torch

    g = torch.Generator().manual_seed(seed + 17)
    return torch.randn(size, 5, generator=g).to(getattr(torch, dtype_name)), torch.randint(0, 3, (size,), generator=g)


def shard_loss(model, kind: str, x, y, rank: int):
    import torch.nn.functional as F

    return F.cross_entropy(model(x, use_spare=kind == "unused_on_rank_0" and rank == 0), y)


def reference_grads(kind: str, dtype_name: str, seed: int, world_size: int, per_rank: int) -> dict[str, Any]:
    """The mean over ranks of each shard's gradient, computed in this one process.

    For a plain model that is the whole batch's gradient; a parameter no shard touches
    stays None.
    """
    x, y = graded_batch(seed, per_rank * world_size, dtype_name)
    model = graded_model(kind, dtype_name, seed)
    for r in range(world_size):
        part = slice(r * per_rank, (r + 1) * per_rank)
        (shard_loss(model, kind, x[part], y[part], r) / world_size).backward()
    return {name: (None if p.grad is None else p.grad.clone()) for name, p in model.named_parameters()}


def signature_worker(rank: int, world_size: int, fn: Callable) -> dict[str, Any]:
    """Each rank's gradient is 2**rank everywhere (and its weight 10 (rank + 1)); returns what each rank ends with.

    Also whether the learner's code changed the weight itself, and whether it received data
    asynchronously (see :func:`autograder.kit.pieces.read_before_wait`).
    """
    import torch

    weight = torch.nn.Parameter(torch.full((3,), 10.0 * (rank + 1), dtype=torch.float64))
    before = weight.detach().clone()
    weight.grad = torch.full((3,), float(2 ** rank), dtype=torch.float64)
    _, calls = recorded(lambda: fn(torch.nn.ParameterList([weight])))
    return {"grad": weight.grad.tolist() if weight.grad is not None else None,
            "weight_changed": not torch.equal(weight.detach(), before), "asynchronous": read_before_wait(calls)}


def grad_worker(rank: int, world_size: int, fn: Callable, kind: str, dtype_name: str, seed: int,
                 per_rank: int, spread: bool) -> dict[str, Any]:
    """One backward pass on this rank's shard, then the learner's averaging.

    With ``spread`` every rank's weights differ a little (the learner must not touch them), and the reply also holds
    the gradients this rank computed itself, before the learner's code ran.
    """
    import torch

    x, y = graded_batch(seed, per_rank * world_size, dtype_name)
    model = graded_model(kind, dtype_name, seed)
    if spread:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * (rank + 1))
    part = slice(rank * per_rank, (rank + 1) * per_rank)
    shard_loss(model, kind, x[part], y[part], rank).backward()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    # With spread weights there is no one-process reference; the ranks' own gradients say whether any were exchanged.
    local = {name: None if p.grad is None else p.grad.detach().clone() for name, p in model.named_parameters()}
    reference = None if spread else reference_grads(kind, dtype_name, seed, world_size, per_rank)
    _, calls = recorded(lambda: fn(model))
    return {
        "reference": reference,
        "local": local if spread else None,
        "asynchronous": read_before_wait(calls),
        "grads": {name: (None if p.grad is None else p.grad.detach().clone()) for name, p in model.named_parameters()},
        "changed": [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])],
        "equal_after": {name: p.detach().clone() for name, p in model.named_parameters()},
    }


def training_worker(rank: int, world_size: int, fn: Callable, optimizer: str, seed: int, steps: int,
                     per_rank: int) -> dict[str, Any]:
    """``steps`` steps with the learner's averaging, and the same steps in one process: the largest difference."""
    import torch

    def make_optimizer(params):
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.1)
        if optimizer == "momentum":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        return torch.optim.Adam(params, lr=0.02)

    def batch(step):
        return graded_batch(seed + 1000 * (step + 1), per_rank * world_size, "float64")

    single = graded_model("mlp", "float64", seed)  # one process on the whole batch, before the learner's code runs
    opt_single = make_optimizer(single.parameters())
    for step in range(steps):
        x, y = batch(step)
        opt_single.zero_grad()
        shard_loss(single, "mlp", x, y, rank).backward()
        opt_single.step()
    mine = graded_model("mlp", "float64", seed)
    opt_mine = make_optimizer(mine.parameters())
    part = slice(rank * per_rank, (rank + 1) * per_rank)
    for step in range(steps):
        x, y = batch(step)
        opt_mine.zero_grad()
        shard_loss(mine, "mlp", x[part], y[part], rank).backward()
        fn(mine)
        opt_mine.step()
    worst = max((a - b).abs().max().item() for a, b in zip(mine.parameters(), single.parameters()))
    return {"worst": worst, "scale": max(p.abs().max().item() for p in single.parameters())}


def _decode_signature(value: float, world_size: int) -> str:
    """What a signature sum says: which ranks' 2**rank are in it, and what it was divided by."""
    for divisor in (world_size, 1):
        total = value * divisor
        if abs(total - round(total)) < 1e-9 and 0 < round(total) < 2 ** world_size:
            ranks = [r for r in range(world_size) if int(round(total)) >> r & 1]
            divided = f"divided by {divisor}" if divisor != 1 else "not divided"
            return f"the sum of ranks {ranks}'s gradients, {divided}"
    return "no sum of the ranks' gradients"


def _shown(value: float, want: float) -> str:
    """``value`` with as many digits as it takes to tell it from ``want`` (``2.33333`` would hide a difference)."""
    return repr(value) if f"{value:g}" == f"{want:g}" and value != want else f"{value:g}"


def judge_signature(attempt: Attempt, world_size: int, replies: list[dict]) -> None:
    """Fail with what the ranks' values say about the averaging, unless every rank holds the mean of 2**rank."""
    want = (2 ** world_size - 1) / world_size
    where = f"on {plural(world_size, 'rank')}, each rank's gradient set to 2**rank (1, 2, 4, ...)"
    got = [None if r["grad"] is None else r["grad"][0] for r in replies]
    if all(v is not None and abs(v - want) < 1e-9 for v in got):
        return
    asynchronous = any(r["asynchronous"] for r in replies)
    if any(v is None for v in got):
        rank = got.index(None)
        attempt.fail(f"{where}: rank {rank}'s .grad became None; it should hold the mean, {want:g}.")
    summary = "; ".join(f"rank {r} ended with {_shown(v, want)}" for r, v in enumerate(got))
    total = 2 ** world_size - 1
    if any(r["weight_changed"] for r in replies):
        hint = (" The gradients were not averaged, and the weights (the parameters themselves) changed: your code "
                "averaged the weights instead of the gradients. Average each parameter's .grad and leave the "
                "parameter to the optimizer.")
    elif all(abs(v - total) < 1e-9 for v in got):
        hint = (f" Every rank holds the sum, {total}: exactly world_size = {world_size} times too large. Did you "
                "divide by the world size?")
        if asynchronous:
            hint += (" If your code does divide, it divides too early: a division made before wait() on an "
                     "asynchronous all_reduce is overwritten when the sum arrives. Wait first, then divide.")
        asynchronous = False
    elif all(abs(v - want) <= 1e-6 * abs(want) for v in got):
        hint = (f" Every rank is within a millionth of the mean but not on it (the mean is {want!r}): these "
                "gradients are float64, and the sum went through a lower precision on the way, float32 for "
                "instance. Keep each gradient's dtype (torch.zeros_like(p.grad), not torch.zeros(n)).")
    elif abs(got[0] - want) < 1e-9 or abs(got[0] - total) < 1e-9:
        hint = (" Rank 0 is right but the others are not: the sum reached rank 0 only, as with dist.reduce. "
                "Use dist.all_reduce so that every rank gets it.")
    elif all(abs(v - 2 ** r) < 1e-9 or abs(v - 2 ** r / world_size) < 1e-9 for r, v in enumerate(got)):
        hint = " Each rank kept its own gradient: nothing was summed across the ranks."
    else:
        hint = " Rank 0's value is " + _decode_signature(got[0], world_size) + "."
    if asynchronous:
        hint += " " + HALF_FINISHED
    attempt.fail(f"{where}: every rank should end with the mean {want:g}; {summary}.{hint}")


# -- lesson 06: data parallelism during backward (PerParameterDDP, MiniDDP) --------------------

WIDTHS = (6, 10, 10, 8, 4)  # the graded model: four Linear layers, 6 -> 10 -> 10 -> 8 -> 4
# A rank that starts its backward this late shows whether the others wait for the
# all-reduces (a rank that does not wait reads its own gradient instead of the mean).
LATE = 0.3



def wrapper_model(seed: int, kind: str = "plain", dtype_name: str = "float32"):
    """Four Linear layers with tanh between; ``kind`` adds what a part needs.

    ``buffer``: a buffer the forward pass uses (scaled inputs), to check buffers are
    broadcast too. ``unused``: the first layer's bias frozen, and a second head no rank
    ever uses.
    """
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:]))
            self.spare = nn.Linear(WIDTHS[-2], WIDTHS[-1]) if kind == "unused" else None
            self.register_buffer("scale", torch.rand(WIDTHS[0]) + 0.5)

        def forward(self, x):
            h = x * self.scale
            for i, layer in enumerate(self.layers):
                h = layer(h)
                if i < len(self.layers) - 1:
                    h = torch.tanh(h)
            return h

    torch.manual_seed(seed)
    model = Net().to(getattr(torch, dtype_name))
    if kind == "unused":
        model.layers[0].bias.requires_grad_(False)
    return model


def wrapper_batch(seed: int, size: int, dtype_name: str = "float32"):
    import torch

    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(size, WIDTHS[0], generator=g).to(getattr(torch, dtype_name))
    return x, torch.randint(0, WIDTHS[-1], (size,), generator=g)


def _wrapper_grads(model) -> dict[str, Any]:
    return {name: (None if p.grad is None else p.grad.detach().clone()) for name, p in model.named_parameters()}


def wrapper_reference(seed: int, kind: str, dtype_name: str, world_size: int, per_rank: int, steps: int, lr: float):
    """One process on the whole batch: the gradients of each step (SGD with ``lr`` between steps)."""
    import torch
    import torch.nn.functional as F

    model = wrapper_model(seed, kind, dtype_name)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    out = []
    for step in range(steps):
        x, y = wrapper_batch(seed + 100 * step, world_size * per_rank, dtype_name)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        out.append(_wrapper_grads(model))
        opt.step()
    return out


# -- what runs on the ranks ----------------------------------------------------------------


def wrapper_broadcast_worker(rank: int, world_size: int, cls: Callable, seed: int, options: dict) -> dict[str, Any]:
    """Each rank builds the model from its own seed; returns its state before and after ``cls(model, **options)``."""
    model = wrapper_model(seed + rank)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    wrapped = cls(model, **options)
    after = {k: v.clone() for k, v in model.state_dict().items()}
    inner = getattr(wrapped, "module", model)
    return {"before": before, "after": after, "same_module": inner is model}


def wrapper_step_worker(rank: int, world_size: int, cls: Callable, seed: int, kind: str, dtype_name: str,
                        per_rank: int, steps: int, options: dict, late_rank: int | None) -> dict[str, Any]:
    """``steps`` training steps through the learner's wrapper, ``cls(model, **options)``, recording what each step sent.

    Returns, per step: the gradients after ``finish_gradient_synchronization``, the
    collectives issued during backward and finish (op, bytes, asynchronous or not), how many
    asynchronous ones were never waited for, and, at the moment backward produced the gradient
    of the model's first layer (the last one it computes), how many had started and how many
    had already been waited for. With ``late_rank``,
    that rank starts each backward ``LATE`` s late.
    """
    import torch
    import torch.nn.functional as F

    from helpers._runtime.instrument import current

    inst = current()
    lr = 0.1
    model = wrapper_model(seed, kind, dtype_name)
    wrapped = usable(cls(model, **options), f"{getattr(cls, '__name__', 'your class')}(model)",
                     ("finish_gradient_synchronization",), module=True)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    first_layer = [p for p in model.layers[0].parameters() if p.requires_grad]
    marks: list[float] = []

    def last_gradient(grad):
        if not marks:
            marks.append(time.perf_counter())
        return grad

    for p in first_layer:
        p.register_hook(last_gradient)  # runs before any post-accumulate hook of these parameters
    steps_out = []
    tracing = inst.tracing if inst is not None else False
    if inst is not None:
        inst.tracing = True  # record this rank's calls as events, read back below
    for step in range(steps):
        x, y = wrapper_batch(seed + 100 * step, world_size * per_rank, dtype_name)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        opt.zero_grad()
        loss = F.cross_entropy(wrapped(x[mine]), y[mine])
        if rank == late_rank:
            time.sleep(LATE)
        if inst is not None:
            inst.take_events()
        marks.clear()
        loss.backward()
        backward_end = time.perf_counter()
        wrapped.finish_gradient_synchronization()
        events = inst.take_events() if inst is not None else []
        ready = marks[0] if marks else backward_end
        steps_out.append({
            "grads": _wrapper_grads(model),
            "calls": [(e.op, e.nbytes, e.async_op) for e in events],
            "unwaited": sum(1 for e in events if e.async_op and e.waited is None),
            "waited_in_backward": sum(1 for e in events if e.async_op and e.wait_start is not None
                                      and e.wait_start < ready),
            "before_last_gradient": sum(1 for e in events if e.start < ready),
            "first_call_after_ms": (None if not events else (events[0].start - ready) * 1e3),
        })
        opt.step()
    if inst is not None:
        inst.tracing = tracing
    reference = wrapper_reference(seed, kind, dtype_name, world_size, per_rank, steps, lr) if rank == 0 else None
    return {"steps": steps_out, "reference": reference}
