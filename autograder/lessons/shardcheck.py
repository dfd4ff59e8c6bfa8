"""Checks of a sharded optimizer (lesson 09): the graded model and data, what runs on the ranks, the traffic rule.

- :func:`graded_model` and :func:`graded_batch`: a small language model whose output head
  shares the embedding's weight (tied weights), with a frozen layer, a layer no step uses and a
  branch only the first steps take, and its batches, the same on every process for one seed;
  :func:`without_gradient` says which parameters lack a gradient, and when; :func:`model_sizes`
  picks its widths so that the parameter count divides by none of the world sizes tried;
- :func:`reference_params`: one process on the whole batch with the unsharded optimizer (and,
  to name a mistake, the same with the gradients summed over the ranks instead of averaged);
- :func:`sharded_worker` (on the ranks): ``steps`` steps through the learner's
  ``ShardedOptimizer``; returns the parameters, the calls each ``step()`` made, and the
  optimizer state it holds (torch's own ZeroRedundancyOptimizer and FSDP are switched off by
  the exercise's ``forbid``, in :mod:`autograder.lessons.lesson09`);
- :func:`exchange_problem`: the traffic rule of ZeRO-1, one reduce-scatter-shaped and one
  all-gather-shaped exchange per step, made with the built-in collectives or by hand;
  :func:`gathered_problem`: that the all-gather carries the updated parameters.

The exercise and its parts are declared in :mod:`autograder.lessons.lesson09`; this module
ships to learners with it (the self-check uses it).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..kit.pieces import usable

__all__ = ["OPTIMIZERS", "SLACK", "EARLY_STEPS", "graded_model", "without_gradient", "graded_batch", "model_sizes",
           "reference_params",
           "sharded_worker", "optimizer_state", "gathered_problem", "exchange_problem", "REDUCE_SCATTERS",
           "ALL_GATHERS"]

#: The optimizers tried, with their settings: (torch.optim class name, keyword arguments).
OPTIMIZERS = {"sgd": ("SGD", {"lr": 0.1, "momentum": 0.9}),
              "adamw": ("AdamW", {"lr": 0.01, "weight_decay": 0.1})}
SLACK = 256  # bytes of optimizer state a rank may hold beyond its shard's (step counters and the like)
#: The collectives that are a reduce-scatter or an all-gather of one flat tensor, under every name torch gave them.
REDUCE_SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter")
ALL_GATHERS = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather")
_HARMLESS = ("barrier", "monitored_barrier")


def model_sizes(seed: int, worlds: tuple[int, ...] = (2, 3, 4), big: bool = False) -> tuple[int, int]:
    """``(vocab, width)`` for ``seed``: the model's parameter count, with and without its frozen layer, is
    divisible by none of ``worlds``.

    >>> vocab, width = model_sizes(7)
    >>> n = vocab * width + vocab + 4 * (width * width + width)
    >>> [n % p for p in (2, 3, 4)].count(0), [(n - width * width - width) % p for p in (2, 3, 4)].count(0)
    (0, 0)
    """
    import random

    pick = random.Random(seed)
    while True:
        vocab, width = (pick.randint(90, 130), pick.randint(20, 28)) if big else (pick.randint(9, 19), pick.randint(4, 8))
        n = vocab * width + vocab + 4 * (width * width + width)
        if all(n % p and (n - width * width - width) % p for p in worlds):
            return vocab, width


#: How many of the first steps take the model's ``early`` branch; after them its parameters get no gradient.
EARLY_STEPS = 3


def graded_model(seed: int, vocab: int, width: int, dtype_name: str = "float32"):
    """A small language model with the kinds of parameter a real job has besides the ordinary ones.

    Embedding -> a frozen Linear (``base``, ``requires_grad=False``, as a pretrained layer kept fixed)
    -> tanh(Linear) -> in the first :data:`EARLY_STEPS` steps only, plus tanh(``early``) -> a head whose
    weight *is* the embedding's (one parameter, used twice); ``spare`` is a layer no step uses. So
    ``base`` never has a gradient, ``spare`` never gets one, and ``early`` gets one in the first steps
    only: torch's optimizers leave each of them as it is whenever its ``.grad`` is None.
    """
    import torch
    import torch.nn as nn

    class TiedNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.base = nn.Linear(width, width).requires_grad_(False)
            self.hidden = nn.Linear(width, width)
            self.early = nn.Linear(width, width)
            self.head = nn.Linear(width, vocab)
            self.head.weight = self.embed.weight  # tied: model.parameters() lists it once
            self.spare = nn.Linear(width, width)

        def forward(self, tokens, early: bool = False):
            h = torch.tanh(self.hidden(torch.tanh(self.base(self.embed(tokens)))))
            if early:
                h = h + torch.tanh(self.early(h))
            return self.head(h)

    torch.manual_seed(seed)
    return TiedNet().to(getattr(torch, dtype_name))


def without_gradient(name: str, case: dict) -> str | None:
    """Why the graded model's parameter ``name`` has no gradient in some of ``case``'s steps, or None.

    >>> without_gradient("spare.bias", {"steps": 10})
    'no step uses spare (its .grad stays None)'
    >>> without_gradient("hidden.weight", {"steps": 10}) is None
    True
    """
    layer = name.split(".")[0]
    early = min(case.get("early", EARLY_STEPS), case["steps"])
    if layer == "base":
        return "base is frozen (requires_grad=False: it never has a gradient)"
    if layer == "spare":
        return "no step uses spare (its .grad stays None)"
    if layer == "early" and early < case["steps"]:
        return (f"only the first {early} of the {case['steps']} steps use early (its .grad is None in the other "
                f"{case['steps'] - early})")
    return None


def graded_batch(seed: int, step: int, size: int, vocab: int):
    """The whole batch of ``step``: ``size`` input tokens and their targets."""
    import torch

    g = torch.Generator().manual_seed(seed * 100 + step)
    return torch.randint(0, vocab, (size,), generator=g), torch.randint(0, vocab, (size,), generator=g)


def _optimizer(kind: str):
    import torch

    name, kwargs = OPTIMIZERS[kind]
    return getattr(torch.optim, name), dict(kwargs)


def reference_params(case: dict, world_size: int, summed: bool = False) -> list:
    """The parameters after ``case["steps"]`` steps of the unsharded optimizer, in one process.

    Every step takes the mean loss over the whole batch: the mean of the ranks' mean losses,
    since each rank gets an equal slice. ``summed`` multiplies the loss by ``world_size``,
    which is what a sharded optimizer that sums the ranks' gradients instead of averaging
    them computes.
    """
    import torch.nn.functional as F

    model = graded_model(case["seed"], case["vocab"], case["width"], case["dtype"])
    cls, kwargs = _optimizer(case["optimizer"])
    opt = cls(model.parameters(), **kwargs)
    for step in range(case["steps"]):
        x, y = graded_batch(case["seed"], step, world_size * case["per_rank"], case["vocab"])
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, early=step < case.get("early", EARLY_STEPS)), y)
        (loss * world_size if summed else loss).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def optimizer_state(root: Any, depth: int = 4) -> dict[str, int]:
    """The optimizer state held through ``root``: bytes of state, and the elements it is kept for.

    Every torch optimizer reachable from ``root``'s attributes counts (attributes, lists,
    tuples and dicts, ``depth`` levels down; ``root`` itself when it is one, as a
    ``ShardedOptimizer`` that subclasses ``torch.optim.Optimizer`` is). What is judged is the
    state they *hold*: a parameter counts once some optimizer keeps a tensor of state for it
    (an optimizer updates state only for what it steps), so a subclass whose own
    ``param_groups`` list the whole model, but which steps only its shard through an inner
    optimizer, holds its shard's state and nothing more. State kept outside any optimizer
    (tensors in a closure, say) is not seen; the exercise asks for ``optimizer_cls``.
    Returns ``{"optimizers": n, "state_bytes": b, "stepped": elements}``.

    >>> import torch
    >>> w = torch.nn.Parameter(torch.zeros(10)); opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    >>> optimizer_state(opt)["stepped"]
    0
    >>> w.grad = torch.ones(10); opt.step(); optimizer_state(opt)
    {'optimizers': 1, 'state_bytes': 40, 'stepped': 10}
    """
    import torch

    found: dict[int, torch.optim.Optimizer] = {}
    seen: set[int] = set()

    def walk(obj: Any, level: int) -> None:
        if id(obj) in seen or level < 0 or isinstance(obj, (torch.Tensor, str, bytes, int, float)):
            return
        seen.add(id(obj))
        if isinstance(obj, torch.optim.Optimizer):
            found[id(obj)] = obj
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            children = list(obj)
        else:
            children = list(getattr(obj, "__dict__", {}).values())
        for child in children:
            walk(child, level - 1)

    walk(root, depth)
    state_bytes = stepped = 0
    counted: set[int] = set()
    for opt in found.values():
        for param, values in opt.state.items():
            tensors = [v for v in values.values() if isinstance(v, torch.Tensor)] if isinstance(values, dict) else []
            state_bytes += sum(t.numel() * t.element_size() for t in tensors)
            if tensors and isinstance(param, torch.Tensor) and id(param) not in counted:
                counted.add(id(param))
                stepped += param.numel()
    return {"optimizers": len(found), "state_bytes": state_bytes, "stepped": stepped}


def _layouts(params: list, world: int) -> list:
    """The flat, padded vectors of ``params`` a ZeRO-1 may shard: every parameter, or the trainable ones only."""
    import torch
    import torch.nn.functional as F

    layouts = []
    for chosen in (params, [p for p in params if p.requires_grad]):
        if not chosen or (layouts and len(chosen) == len(params)):
            continue
        flat = torch.cat([p.detach().reshape(-1) for p in chosen])
        shard = math.ceil(flat.numel() / world)
        layouts.append((F.pad(flat, (0, shard * world - flat.numel())), shard))
    return layouts


def gathered_problem(payloads: list[tuple[Any, Any]], params: list, world: int, rank: int) -> str | None:
    """What one ``step()``'s all-gather carried, if it was not this rank's slice of the *updated* parameters.

    ``payloads`` are the step's calls with a copy of each one's tensor (the rank's instrument
    keeps them, :attr:`helpers._runtime.instrument.Instrument.payloads`), ``params`` the model's
    parameters after the step. ZeRO-1's all-gather hands every rank's updated slice to the
    others; one that carries the averaged gradients instead leaves every rank to step the
    whole model itself, with the whole optimizer state. A built-in all-gather must carry this
    rank's slice of the flattened, padded parameters (all of them, or the trainable ones only:
    a frozen parameter may stay out); by hand (lesson 4's ring), the sends of the all-gather
    phase (the step's last p-1 sends) must each carry one slice of them.
    """
    import torch

    gathers = [t.reshape(-1) for e, t in payloads if not e.is_send and e.op in ALL_GATHERS]
    if gathers:
        windows = {rank}
        carried = gathers
    else:
        windows = set(range(world))
        carried = [t.reshape(-1) for e, t in payloads if e.is_send][-(world - 1):] if world > 1 else []
    for t in carried:
        if not any(t.dtype == flat.dtype and torch.equal(t, flat[c * shard:c * shard + t.numel()])
                   for flat, shard in _layouts(params, world) for c in windows):
            how = "the all-gather" if gathers else "a send of the all-gather phase"
            return (f"{how} carried {t.numel()} values that are not a slice of the parameters as step() left them. "
                    "ZeRO-1 gathers the *updated parameters*: each rank steps only its own slice (its optimizer "
                    "holds only that slice's state) and the all-gather hands every rank the others' updated slices. "
                    "Gathering the averaged gradients instead and stepping the whole model on every rank gives the "
                    "same numbers, but every rank then keeps the whole optimizer state: that is DDP, not ZeRO-1.")
    return None


def sharded_worker(rank: int, world_size: int, cls: Callable, case: dict) -> dict[str, Any]:
    """``case["steps"]`` steps through the learner's ``cls(model.parameters(), optimizer, **kwargs)``.

    Each rank trains on its own equal slice of every batch; the check clears the gradients
    itself (``model.zero_grad(set_to_none=True)``) and calls ``step()``. Returns the
    parameters, whether each ``step()`` changed any of them, where each parameter without a gradient
    stood once it had none any more (``settled``), each step's calls as ``(op, bytes, is_send)`` (every collective the trace
    sees, however it was made, and the point-to-point calls of a hand-made ring), what the
    optimizer holds (:func:`optimizer_state`), and on rank 0 the one-process references.
    """
    import torch
    import torch.nn.functional as F

    from helpers._runtime.instrument import current

    inst = current()
    tracing = inst.tracing if inst is not None else False
    calls: list[list[tuple]] = []
    moved: list[bool] = []
    carried: list[str | None] = []
    model = graded_model(case["seed"], case["vocab"], case["width"], case["dtype"])
    optimizer, kwargs = _optimizer(case["optimizer"])
    opt = usable(cls(model.parameters(), optimizer, **kwargs),
                 f"{getattr(cls, '__name__', 'your class')}(params, {optimizer.__name__})", ("step",))
    early = min(case.get("early", EARLY_STEPS), case["steps"])
    # Each parameter's value from the moment it has no gradient any more: it must stay there.
    settled = {name: p.detach().clone() for name, p in model.named_parameters() if without_gradient(name, case)}
    if inst is not None:
        inst.tracing = True  # record each step's calls as events, read back below
    try:
        for step in range(case["steps"]):
            x, y = graded_batch(case["seed"], step, world_size * case["per_rank"], case["vocab"])
            mine = slice(rank * case["per_rank"], (rank + 1) * case["per_rank"])
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[mine], early=step < case.get("early", EARLY_STEPS)), y[mine]).backward()
            before = [p.detach().clone() for p in model.parameters()]
            if inst is not None:
                inst.take_events()
                inst.payloads = []  # keep what each call of the step carried
            opt.step()
            moved.append(any(not torch.equal(b, p) for b, p in zip(before, model.parameters())))
            if step == early - 1:
                settled.update({name: p.detach().clone() for name, p in model.named_parameters() if name in settled
                                and name.startswith("early.")})
            events = inst.take_events() if inst is not None else []
            calls.append([(e.op, e.nbytes or 0, e.is_send) for e in events if not e.is_recv])
            if inst is not None:
                carried.append(gathered_problem(inst.payloads, list(model.parameters()), world_size, rank))
                inst.payloads = None
    finally:
        if inst is not None:
            inst.tracing = tracing
            inst.payloads = None
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "names": [name for name, _ in model.named_parameters()],
        "sizes": [p.numel() for p in model.parameters()],
        "numel": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "calls": calls,
        "moved": moved,
        "settled": settled,
        "carried": carried,
        "state": optimizer_state(opt),
        "reference": reference_params(case, world_size) if rank == 0 else None,
        # AdamW is nearly blind to the gradients' scale (only its eps sees it): summed gradients show in float64 only.
        "summed": (reference_params(case, world_size, summed=True)
                   if rank == 0 and (case["optimizer"] == "sgd" or case["dtype"] == "float64") else None),
    }


def _sizes(numel: int, world: int, itemsize: int) -> str:
    shard = math.ceil(numel / world)
    return (f"{numel} elements, padded to p * ceil(N/p) = {world} * {shard} = {world * shard} "
            f"({world * shard * itemsize} bytes), a shard of {shard} elements ({shard * itemsize} bytes)")


def exchange_problem(calls: list[tuple], numel: int, world: int, itemsize: int = 4,
                     trainable: int | None = None) -> str | None:
    """What is wrong with one ``step()``'s calls on one rank, or None when they are ZeRO-1's exchange.

    The rule: exactly one reduce-scatter-shaped exchange of the flattened gradients and one
    all-gather-shaped exchange of the updated shards. A built-in reduce-scatter takes the
    whole (padded) flat tensor, a built-in all-gather gives one shard of at most ceil(N/p)
    elements; an exchange made by hand (lesson 4's ring) is p-1 sends of at most a shard
    each. So any correct way of doing it passes: built-in, by hand, or one of each. ``numel`` is
    every parameter's elements, ``trainable`` those of the parameters that require a gradient:
    the flat vector may hold either (a frozen parameter may stay out of it).

    >>> exchange_problem([("reduce_scatter_single", 48, False), ("all_gather_single", 16, False)], 10, 3) is None
    True
    >>> exchange_problem([("all_reduce", 40, False), ("all_gather_single", 16, False)], 10, 3)[:40]
    'step() called all_reduce (40 bytes): an '
    """
    least = numel if trainable is None else min(trainable, numel)
    shard = math.ceil(numel / world)
    what = _sizes(numel, world, itemsize)
    if least < numel:
        what += f" (or, leaving the frozen parameters out, {_sizes(least, world, itemsize)})"
    others = [(op, n) for op, n, send in calls if not send and op not in REDUCE_SCATTERS + ALL_GATHERS + _HARMLESS]
    if others:
        op, n = others[0]
        why = {"all_reduce": "an all-reduce gives every rank the whole sum, though a rank steps only its shard: it "
                             "moves twice the bytes of the reduce-scatter that gives each rank just its shard's sum",
               "broadcast": "broadcasting each shard from its owner takes p broadcasts; one all-gather of the "
                            "updated shards does it in one exchange"}.get(op, "ZeRO-1 needs only a reduce-scatter "
                                                                             "and an all-gather")
        return f"step() called {op} ({n} bytes): {why}."
    rs = [n for op, n, send in calls if not send and op in REDUCE_SCATTERS]
    ag = [n for op, n, send in calls if not send and op in ALL_GATHERS]
    sends = [n for op, n, send in calls if send]
    if len(rs) > 1 or len(ag) > 1:
        return (f"step() made {len(rs)} reduce-scatters and {len(ag)} all-gathers; flatten every gradient into one "
                "tensor (and every shard into one) so each step makes exactly one of each, whatever the number of "
                "parameters.")
    wanted = (2 - len(rs) - len(ag)) * (world - 1)
    if len(sends) != wanted:
        return (f"step() made {len(rs)} reduce-scatter(s), {len(ag)} all-gather(s) and {len(sends)} point-to-point "
                f"send(s); ZeRO-1 makes one reduce-scatter of the flattened gradients and one all-gather of the "
                f"updated shards per step (by hand: p-1 = {world - 1} sends of one shard each for each of the two).")
    if rs and not least * itemsize <= rs[0] <= world * shard * itemsize:
        return f"the reduce-scatter took {rs[0]} bytes; the flattened gradients are {what}."
    if ag and not (ag[0] <= shard * itemsize and ag[0] * world >= least * itemsize):
        return f"the all-gather sent {ag[0]} bytes from this rank; the parameters are {what}, and each rank sends its shard."
    big = [n for n in sends if n > shard * itemsize]
    if big:
        return f"a send carried {big[0]} bytes, more than one shard; the parameters are {what}."
    return None
