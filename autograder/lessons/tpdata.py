"""What Exercise 10.1's checks run on the ranks: the graded MLP's layers and data, one process's answer, the
learner's module run and probed, and the names of the parts of a weight a parameter can hold.

:mod:`autograder.lessons.tpcheck` judges what :func:`mlp_worker` returns; both ship to learners (the self-check
uses them).

- :func:`mlp_worker` (on the ranks): builds the layers and data for a seed drawn at grading
  time (with some full parameters frozen, ``requires_grad=False``, where a case asks), the
  learner's module, one forward and backward; it returns the output, the gradients, what each
  parameter holds (which rows or columns of which full weight, see :func:`identify`), the calls
  made in forward and in backward, and on rank 0 the one-process reference. Then every rank but
  rank 0 runs forward and backward once more on another input and output gradient (the
  *probe*): a tensor-parallel module's rank 0 sees its output and input gradient change, since g
  and f sum every rank's share; a module that computes on each rank alone, from whole copies of
  the weights, does not.

Example (the parts a parameter can hold, named the way feedback names them)::

    >>> import torch
    >>> full = {"fc1.weight": torch.arange(12.).reshape(4, 3)}
    >>> identify(torch.arange(12.).reshape(4, 3)[2:4], full)
    ('fc1.weight', 'rows', (2, 3))
    >>> where = identify(torch.arange(12.).reshape(4, 3)[1::2].t(), full)
    >>> where, describe(where)
    (('fc1.weight', 'rows', (1, 3)), 'fc1.weight[1:4:2, :]')
"""

from __future__ import annotations

from typing import Any, Callable

from ..kit.pieces import usable

__all__ = ["SIZES", "TOLERANCE", "ITEM", "FULL_NAMES", "mlp_worker", "identify", "describe", "select"]

#: The graded MLP: fc1 = Linear(d, hidden), fc2 = Linear(hidden, out), a batch of ``rows``. Every width
#: divides by 1, 2 and 4 (every split is even, the right one and a wrong one alike); out differs from d,
#: so the output (g's all-reduce, forward) and the input's gradient (f's, backward) differ in size, and
#: the trace tells which tensor each one summed.
SIZES = {"d": 8, "hidden": 12, "out": 16, "rows": 5}
TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
ITEM = {"float32": 4, "float64": 8}
FULL_NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def _layers(seed: int, dtype_name: str, frozen: tuple = ()):
    """The full layers for ``seed``; the parameters named in ``frozen`` (of :data:`FULL_NAMES`) are frozen."""
    import torch

    torch.manual_seed(seed)
    d, hidden = SIZES["d"], SIZES["hidden"]
    dtype = getattr(torch, dtype_name)
    fc1, fc2 = torch.nn.Linear(d, hidden).to(dtype), torch.nn.Linear(hidden, SIZES["out"]).to(dtype)
    for name, param in _named(fc1, fc2).items():
        param.requires_grad_(name not in frozen)
    return fc1, fc2


def _named(fc1, fc2) -> dict[str, Any]:
    """The two layers' parameters by the names feedback uses (:data:`FULL_NAMES`)."""
    return dict(zip(FULL_NAMES, (fc1.weight, fc1.bias, fc2.weight, fc2.bias)))


def _data(seed: int, dtype_name: str):
    """The input and the loss's weights (loss = sum(y * w)), the same on every rank."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    dtype = getattr(torch, dtype_name)
    x = torch.randn((SIZES["rows"], SIZES["d"]), generator=g).to(dtype)
    return x, torch.randn((SIZES["rows"], SIZES["out"]), generator=g).to(dtype)


def _reference(fc1, fc2, x, w) -> dict[str, Any]:
    """One process: output, gradients (None for a frozen parameter), and the hidden layer, from which
    :func:`judge_forward` builds any rank's own share of the output (what a missing g leaves)."""
    import torch.nn.functional as F

    x = x.clone().requires_grad_(True)
    h = F.gelu(fc1(x))
    y = fc2(h)
    (y * w).sum().backward()
    return {"y": y.detach(), "x_grad": x.grad, "h": h.detach(), "w2": fc2.weight.detach().clone(),
            "bias": fc2.bias.detach().clone(), "grads": {name: p.grad for name, p in _named(fc1, fc2).items()}}


def identify(tensor, full: dict[str, Any]) -> tuple[str, str, tuple[int, ...]] | None:
    """Which part of which full tensor ``tensor`` holds: ``(name, how, indices)``, or None.

    ``how`` is ``"whole"``, ``"rows"`` or ``"columns"`` (of a full matrix) or ``"pieces"`` (of a
    vector); ``indices`` are the full tensor's rows, columns or elements the tensor holds, in its
    order (every row for ``"whole"``). A transposed copy counts as what it transposes.
    """
    import torch

    candidates = (tensor, tensor.t()) if tensor.dim() == 2 else (tensor,)
    for candidate in candidates:
        for name, value in full.items():
            if candidate.shape == value.shape and torch.equal(candidate, value):
                return (name, "whole", tuple(range(value.shape[0])))
    for candidate in candidates:
        for name, value in full.items():
            if value.dim() != candidate.dim():
                continue
            if value.dim() == 1:
                found = _matching_rows(candidate[:, None], value[:, None])
                if found:
                    return (name, "pieces", found)
                continue
            for how, mine, theirs in (("rows", candidate, value), ("columns", candidate.t(), value.t())):
                found = _matching_rows(mine, theirs)
                if found:
                    return (name, how, found)
    return None


def _matching_rows(mine, theirs) -> tuple[int, ...] | None:
    """For each row of ``mine``, a distinct row of ``theirs`` equal to it: their indices, or None."""
    if mine.shape[1:] != theirs.shape[1:] or not 0 < mine.shape[0] <= theirs.shape[0]:
        return None
    equal = (mine[:, None] == theirs[None, :]).reshape(mine.shape[0], theirs.shape[0], -1).all(-1)
    used: list[int] = []
    for row in equal:
        free = [j for j in row.nonzero().flatten().tolist() if j not in used]
        if not free:
            return None
        used.append(free[0])
    return tuple(used)


def _cut(indices: tuple[int, ...]) -> str:
    """``4:8`` for a block, ``1:12:2`` for a strided run, ``[0, 5, 7]`` otherwise."""
    first, steps = indices[0], {b - a for a, b in zip(indices, indices[1:])}
    if len(indices) == 1 or (len(steps) == 1 and min(steps) > 0):
        step = steps.pop() if steps else 1
        return f"{first}:{indices[-1] + 1}" + (f":{step}" if step != 1 else "")
    return str(list(indices))


def describe(where: tuple[str, str, tuple[int, ...]] | None) -> str:
    """``fc1.weight[4:8, :]`` for ``("fc1.weight", "rows", (4, 5, 6, 7))``; ``all of fc2.bias`` for a whole one."""
    if where is None:
        return "none of fc1's or fc2's weights or biases"
    name, how, indices = where
    if how == "whole":
        return f"all of {name}"
    cut = _cut(indices)
    return {"pieces": f"{name}[{cut}]", "rows": f"{name}[{cut}, :]", "columns": f"{name}[:, {cut}]"}[how]


def select(value, how: str, indices: tuple[int, ...]):
    """The part of the full tensor ``value`` that ``(how, indices)`` names (see :func:`identify`)."""
    if value is None or how == "whole":
        return value
    return value[:, list(indices)] if how == "columns" else value[list(indices)]


def mlp_worker(rank: int, world_size: int, cls: Callable, seed: int, dtype_name: str,
               run: bool = True, frozen: tuple = ()) -> dict[str, Any]:
    """The learner's module on this rank: one forward and one backward, with the calls of each, then the probe.

    With ``run=False`` only the module is built (what the shards part looks at): a module
    that splits the wrong dimension then gets feedback on its shards, not a shape error.
    A forward that returns no tensor of the output's shape (rows x out) gets no backward.
    ``frozen`` names full parameters given with ``requires_grad=False``.
    """
    import torch

    from helpers._runtime.instrument import current

    fc1, fc2 = _layers(seed, dtype_name, frozen)
    full = {name: t.detach().clone() for name, t in _named(fc1, fc2).items()}
    x, w = _data(seed, dtype_name)
    x.requires_grad_(True)
    inst = current()
    tracing = inst.tracing if inst is not None else False
    model = usable(cls(fc1, fc2), f"{getattr(cls, '__name__', 'your class')}(fc1, fc2)", module=True)
    params = dict(model.named_parameters())
    dtensors = [name for name, p in params.items() if type(p).__name__ == "DTensor" or
                type(getattr(p, "data", None)).__name__ == "DTensor"]
    y, forward_calls, backward_calls, forward_ok = None, [], [], False
    if run and inst is not None:
        inst.tracing = True  # this rank's calls as events, read back after each phase
        inst.take_events()
    if run:
        y = model(x)
        forward_calls = _calls(inst)
    forward_ok = isinstance(y, torch.Tensor) and tuple(y.shape) == tuple(w.shape) and y.requires_grad
    if forward_ok:
        (y * w).sum().backward()
        backward_calls = _calls(inst)
    shards = {name: {"where": identify(p.detach(), full), "shape": tuple(p.shape), "nbytes":
                     p.numel() * p.element_size(), "requires_grad": p.requires_grad,
                     "grad": None if p.grad is None else p.grad.detach().clone()}
              for name, p in params.items()}
    reply = {
        "y": y.detach().clone() if isinstance(y, torch.Tensor) else y, "x_grad": x.grad, "shards": shards,
        "dtensors": dtensors, "forward": forward_calls, "forward_ok": run and forward_ok, "backward": backward_calls,
        "full_shapes": {name: tuple(t.shape) for name, t in full.items()}, "frozen": tuple(frozen), "probe": None,
        "reference": _reference(*_layers(seed, dtype_name, frozen), x.detach(), w) if rank == 0 else None,
    }
    if forward_ok and world_size > 1:
        reply["probe"] = _probe(model, x, w, rank)
        _calls(inst)  # the probe's calls are not the step's
    if inst is not None:
        inst.tracing = tracing
    return reply


def _probe(model, x, w, rank: int) -> dict[str, Any]:
    """Forward and backward once more, every rank but rank 0 with another input and output gradient.

    A tensor-parallel rank 0 then gets another output (g sums the other ranks' partial outputs,
    computed from their inputs) and another input gradient (f sums their parts, computed from
    their output gradients); a rank that computed alone gets what it got before.
    """
    x2, w2 = (x.detach().clone(), w) if rank == 0 else (x.detach() + 1, w.flip(0))
    x2.requires_grad_(True)
    y2 = model(x2)
    if hasattr(y2, "requires_grad") and y2.requires_grad and tuple(y2.shape) == tuple(w2.shape):
        (y2 * w2).sum().backward()
    return {"y": y2.detach().clone() if hasattr(y2, "detach") else None,
            "x_grad": None if x2.grad is None else x2.grad.clone()}


def _calls(inst: Any) -> list[tuple[str, int | None, str | None]]:
    """The calls this rank made since the last look: ``(op, bytes, via)``, ``via`` saying how a
    collective was made (None: a ``torch.distributed`` function)."""
    return [(e.op, e.nbytes, e.via) for e in inst.take_events()] if inst is not None else []
