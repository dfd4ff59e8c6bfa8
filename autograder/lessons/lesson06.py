"""Lesson 06's graded exercise: 6.1, ``MiniDDP(module, bucket_size_mb)``.

The learner wraps a model so that data parallelism happens during backward:

- construction makes every parameter and buffer equal to rank 0's (a broadcast);
- the trainable parameters are split into buckets by the rule of
  :func:`bucket_layout` (reverse order, close a bucket once it holds
  ``bucket_size_mb`` MB or more);
- a hook on each parameter notes its gradient as ready during backward; once a bucket is
  full its all-reduce starts, asynchronously, while backward goes on;
- ``finish_gradient_synchronization()`` starts any bucket still waiting (a gradient that
  never came counts as zero), waits for every all-reduce, and leaves each ``.grad``
  holding the mean over the ranks.

How the checks judge: everything runs in fresh rank processes, against one process on the
whole batch computed there too. The all-reduces are counted, and timed against the
moment backward produces its last gradient, by the rank's instrument
(:mod:`helpers._runtime.instrument`), which sees every ``torch.distributed`` call made in Python.
torch's own DistributedDataParallel is switched off.

Hidden test cells and the visible self-check::

    from autograder import exercise
    exercise("6.1").grade(MiniDDP, "broadcast")   # "gradients", "waits", "buckets", "overlap", "unused"
    exercise("6.1").self_check(MiniDDP)

Example (the instructor's answer passes)::

    >>> from autograder.lessons.reference import MiniDDP
    >>> exercise_6_1.grade(MiniDDP, "buckets")
"""

from __future__ import annotations

import time
from typing import Any, Callable

from helpers import DDP

from .kit import Attempt, Exercise, Part, fresh_seed
from .pieces import plural

__all__ = ["EXERCISES", "exercise_6_1", "layer_sizes", "bucket_layout"]

TIMEOUT = 10.0
# A rank that starts its backward this late shows whether the others wait for the
# all-reduces (a rank that does not wait reads its own gradient instead of the mean).
LATE = 0.3
WIDTHS = (6, 10, 10, 8, 4)  # the graded model: four Linear layers, 6 -> 10 -> 10 -> 8 -> 4
MB = 1024 * 1024


def layer_sizes(widths: tuple[int, ...] = WIDTHS) -> list[int]:
    """Bytes of each float32 parameter of the graded model, in ``model.parameters()`` order.

    >>> layer_sizes((3, 2))
    [24, 8]
    """
    sizes = []
    for n_in, n_out in zip(widths, widths[1:]):
        sizes += [n_in * n_out * 4, n_out * 4]
    return sizes


def bucket_layout(sizes_in_bytes: list[int], bucket_size_mb: float) -> list[list[int]]:
    """Exercise 6.1's bucket rule: which parameters share a bucket, as indices into ``sizes_in_bytes``.

    ``sizes_in_bytes`` are the trainable parameters' sizes in ``model.parameters()`` order.
    Walk them in reverse (the order backward produces gradients) and add each to the open
    bucket; close the bucket as soon as it holds at least ``bucket_size_mb`` MB (MB = 2**20
    bytes). A parameter larger than the cap fills a bucket by itself.

    >>> bucket_layout([400, 40, 400, 40], 400 / 2**20)
    [[3, 2], [1, 0]]
    """
    cap = bucket_size_mb * 1024 * 1024
    buckets, current, size = [], [], 0
    for index in reversed(range(len(sizes_in_bytes))):
        current.append(index)
        size += sizes_in_bytes[index]
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


# -- models and data, the same on every process --------------------------------------------


def _model(seed: int, kind: str = "plain", dtype_name: str = "float32"):
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


def _batch(seed: int, size: int, dtype_name: str = "float32"):
    import torch

    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(size, WIDTHS[0], generator=g).to(getattr(torch, dtype_name))
    return x, torch.randint(0, WIDTHS[-1], (size,), generator=g)


def _grads(model) -> dict[str, Any]:
    return {name: (None if p.grad is None else p.grad.detach().clone()) for name, p in model.named_parameters()}


def _reference(seed: int, kind: str, dtype_name: str, world_size: int, per_rank: int, steps: int, lr: float):
    """One process on the whole batch: the gradients of each step (SGD with ``lr`` between steps)."""
    import torch
    import torch.nn.functional as F

    model = _model(seed, kind, dtype_name)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    out = []
    for step in range(steps):
        x, y = _batch(seed + 100 * step, world_size * per_rank, dtype_name)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        out.append(_grads(model))
        opt.step()
    return out


# -- what runs on the ranks ----------------------------------------------------------------


def _broadcast_worker(rank: int, world_size: int, cls: Callable, seed: int) -> dict[str, Any]:
    """Each rank builds the model from its own seed; returns its state before and after wrapping."""
    model = _model(seed + rank)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    wrapped = cls(model, bucket_size_mb=1.0)
    after = {k: v.clone() for k, v in model.state_dict().items()}
    inner = getattr(wrapped, "module", model)
    return {"before": before, "after": after, "same_module": inner is model}


def _step_worker(rank: int, world_size: int, cls: Callable, seed: int, kind: str, dtype_name: str,
                 per_rank: int, steps: int, bucket_size_mb: float, late_rank: int | None) -> dict[str, Any]:
    """``steps`` training steps through the learner's wrapper, recording what each step sent.

    Returns, per step: the gradients after ``finish_gradient_synchronization``, the
    collectives issued during backward and finish (op and bytes), and how many of them
    had started when backward produced the gradient of the model's first layer (the last
    one it computes). With ``late_rank``, that rank starts each backward ``LATE`` s late.
    """
    import torch
    import torch.nn.functional as F

    from helpers._runtime.instrument import current

    inst = current()
    lr = 0.1
    model = _model(seed, kind, dtype_name)
    wrapped = cls(model, bucket_size_mb=bucket_size_mb)
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
        x, y = _batch(seed + 100 * step, world_size * per_rank, dtype_name)
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
            "grads": _grads(model),
            "calls": [(e.op, e.nbytes) for e in events],
            "before_last_gradient": sum(1 for e in events if e.start < ready),
            "first_call_after_ms": (None if not events else (events[0].start - ready) * 1e3),
        })
        opt.step()
    if inst is not None:
        inst.tracing = tracing
    reference = _reference(seed, kind, dtype_name, world_size, per_rank, steps, lr) if rank == 0 else None
    return {"steps": steps_out, "reference": reference}


# -- judging -------------------------------------------------------------------------------


def _broadcast(attempt: Attempt, worlds: tuple[int, ...] = (2, 3, 4)) -> None:
    for world in worlds:
        seed = fresh_seed()
        replies = list(attempt.run(_broadcast_worker, world, (attempt.fn, seed), timeout=TIMEOUT,
                                   context="each rank's model built from a different seed"))
        rank0 = replies[0]["before"]
        for rank, reply in enumerate(replies):
            if not reply["same_module"]:
                attempt.fail(f"on {plural(world, 'rank')}: MiniDDP's .module is not the model it was given; keep "
                             "the model itself (self.module = module) so its weights are the ones trained.")
            for name, want in rank0.items():
                got = reply["after"][name]
                if not got.equal(want):
                    kind = "buffer" if name.endswith("scale") else "parameter"
                    still_own = got.equal(reply["before"][name])
                    why = ("it kept its own value: broadcast every parameter and buffer from rank 0 at construction"
                           if still_own else "it holds neither rank 0's value nor its own")
                    attempt.fail(f"on {plural(world, 'rank')}, each rank's model built from a different seed: after "
                                 f"MiniDDP(model), rank {rank}'s {kind} {name} differs from rank 0's; {why}.")


def _run_steps(attempt: Attempt, world: int, *, kind: str = "plain", dtype_name: str = "float32",
               per_rank: int = 3, steps: int = 2, bucket_size_mb: float = 100 / MB,
               late_rank: int | None = None, context: str = "") -> list[dict]:
    seed = fresh_seed()
    return list(attempt.run(
        _step_worker, world, (attempt.fn, seed, kind, dtype_name, per_rank, steps, bucket_size_mb, late_rank),
        timeout=TIMEOUT + (steps * LATE if late_rank is not None else 0), context=context,
    ))


def _judge_gradients(attempt: Attempt, world: int, replies: list[dict], where: str, hint: str = "") -> None:
    import torch

    reference = replies[0]["reference"]
    for step, want_grads in enumerate(reference):
        for rank, reply in enumerate(replies):
            got_grads = reply["steps"][step]["grads"]
            for name, want in want_grads.items():
                got = got_grads[name]
                if want is None or (got is None and name.startswith("spare")):
                    continue
                if got is None:
                    attempt.fail(f"{where}, step {step + 1}, rank {rank}: {name}.grad is None after "
                                 "finish_gradient_synchronization(); it should hold the mean over the ranks.")
                tol = 1e-5 if want.dtype == torch.float32 else 1e-10
                if not torch.allclose(got, want, rtol=tol, atol=tol):
                    ratio = (got.double().norm() / want.double().norm()).item() if want.norm() > 0 else float("nan")
                    extra = hint
                    if world > 1 and abs(ratio - world) < 1e-3:
                        extra = f" It is {world} times too large: divide the summed bucket by the world size."
                    attempt.fail(f"{where}, step {step + 1}, rank {rank}: {name}.grad differs from one process on "
                                 f"the whole batch.\n  expected {want.reshape(-1)[:4].tolist()}\n"
                                 f"  actual   {got.reshape(-1)[:4].tolist()}" + extra)


def _gradients(attempt: Attempt, cases: tuple = ((1, "float32"), (2, "float32"), (3, "float64"), (4, "float32"))) -> None:
    for world, dtype_name in cases:
        replies = _run_steps(attempt, world, dtype_name=dtype_name, context=f"2 steps of SGD in {dtype_name}")
        _judge_gradients(attempt, world, replies, f"on {plural(world, 'rank')}, {dtype_name}")


def _waits(attempt: Attempt, worlds: tuple[int, ...] = (2, 3)) -> None:
    for world in worlds:
        replies = _run_steps(attempt, world, late_rank=world - 1,
                             context=f"rank {world - 1} starting each backward {LATE} s late")
        _judge_gradients(
            attempt, world, replies, f"on {plural(world, 'rank')}, rank {world - 1} starting each backward {LATE} s late",
            hint=" The other ranks read their buckets before the all-reduce had finished: wait for each "
                 "all-reduce's work (work.wait()) before dividing and copying the result back.",
        )


def _buckets(attempt: Attempt, cases: tuple = ((2, 1e-6), (2, 100 / MB), (3, 300 / MB), (2, 700 / MB), (2, 100.0))) -> None:
    sizes = layer_sizes()
    for world, mb in cases:
        layout = bucket_layout(sizes, mb)
        replies = _run_steps(attempt, world, bucket_size_mb=mb, steps=1,
                             context=f"bucket_size_mb={mb:.3g} ({mb * MB:.0f} bytes)")
        _judge_gradients(attempt, world, replies, f"on {plural(world, 'rank')}, bucket_size_mb={mb:.3g}")
        want = [sum(sizes[i] for i in bucket) for bucket in layout]
        for rank, reply in enumerate(replies):
            calls = reply["steps"][0]["calls"]
            others = sorted({op for op, _ in calls if op != "all_reduce"})
            got = [nbytes for op, nbytes in calls if op == "all_reduce"]
            if others:
                attempt.fail(f"on {plural(world, 'rank')}, rank {rank} called {', '.join(others)} during the step; "
                             "reduce each bucket with one dist.all_reduce(..., async_op=True) and nothing else.")
            if sorted(got) != sorted(want):
                attempt.fail(
                    f"on {plural(world, 'rank')} with bucket_size_mb={mb:.3g} ({mb * MB:.0f} bytes), rank {rank} made "
                    f"{plural(len(got), 'all-reduce')} of {got} bytes in one step; the parameters' sizes "
                    f"{sizes} bytes (in model.parameters() order) make {plural(len(want), 'bucket')} of {want} bytes. "
                    "Walk the parameters in reverse order and close a bucket as soon as it holds at least "
                    "bucket_size_mb MB (1 MB = 2**20 bytes); each bucket is one all-reduce."
                )


def _overlap(attempt: Attempt, worlds: tuple[int, ...] = (2, 3)) -> None:
    for world in worlds:
        replies = _run_steps(attempt, world, bucket_size_mb=100 / MB, steps=2,
                             context="four layers, one bucket per layer")
        for rank, reply in enumerate(replies):
            for step, row in enumerate(reply["steps"]):
                if row["before_last_gradient"] == 0:
                    when = ("no all-reduce at all" if row["first_call_after_ms"] is None else
                            f"the first all-reduce only {row['first_call_after_ms']:.1f} ms after it")
                    attempt.fail(
                        f"on {plural(world, 'rank')}, four layers with one bucket each, step {step + 1}, rank "
                        f"{rank}: backward produced the first layer's gradient (its last one) with no all-reduce "
                        f"started yet ({when}). Start a bucket's all-reduce from the gradient hook as soon as "
                        "the bucket is full, so communication overlaps the rest of backward."
                    )


def _unused(attempt: Attempt, worlds: tuple[int, ...] = (2, 3)) -> None:
    for world in worlds:
        replies = _run_steps(attempt, world, kind="unused", bucket_size_mb=100 / MB,
                             context="a frozen bias and a head no rank uses")
        where = f"on {plural(world, 'rank')}, a model with a frozen bias and a head no rank uses"
        _judge_gradients(attempt, world, replies, where)
        for rank, reply in enumerate(replies):
            grads = reply["steps"][-1]["grads"]
            if grads["layers.0.bias"] is not None:
                attempt.fail(f"{where}, rank {rank}: the frozen parameter layers.0.bias got a gradient; leave "
                             "parameters with requires_grad=False out of the buckets.")
            for name in ("spare.weight", "spare.bias"):
                if grads[name] is not None and grads[name].abs().max() > 0:
                    attempt.fail(f"{where}, rank {rank}: {name}, which no rank used, ended with a non-zero "
                                 "gradient; a gradient that never came counts as zero.")


def _self_check(attempt: Attempt) -> str:
    _broadcast(attempt, (2,))
    _gradients(attempt, ((2, "float32"),))
    _waits(attempt, (2,))
    _buckets(attempt, ((2, 100 / MB), (2, 300 / MB)))
    _overlap(attempt, (2,))
    _unused(attempt, (2,))
    return ("Self-check passed on 2 ranks: the wrapper broadcasts rank 0's weights and buffers, the gradients "
            "equal one process on the whole batch (also when one rank is late), one bucket per layer makes one "
            "all-reduce per layer and the first starts before backward ends, and an unused head does not hang. "
            "The hidden tests also try 1, 3 and 4 ranks, float64 and other bucket sizes.")


exercise_6_1 = Exercise(
    number="6.1",
    function="MiniDDP",
    title="MiniDDP, gradients reduced in buckets during backward",
    parts=(
        Part("broadcast", 2, "every parameter and buffer equals rank 0's after construction.", _broadcast),
        Part("gradients", 3, "two SGD steps' gradients equal one process on the whole batch, on 1 to 4 ranks.",
             _gradients),
        Part("waits", 1, "still right when one rank is late: every all-reduce is waited for.", _waits),
        Part("buckets", 2, "one all-reduce per bucket, with the bucket sizes the rule gives.", _buckets),
        Part("overlap", 1, "the first all-reduce starts before backward computes its last gradient.", _overlap),
        Part("unused", 1, "a frozen parameter and a head no rank uses: no hang, right gradients.", _unused),
    ),
    visible_check=_self_check,
    forbid=(DDP,),
    forbid_reason="Exercise 6.1 builds DistributedDataParallel's machinery yourself: buckets, hooks and "
                  "asynchronous all-reduces. The real DistributedDataParallel comes right after it.",
)

EXERCISES = (exercise_6_1,)
