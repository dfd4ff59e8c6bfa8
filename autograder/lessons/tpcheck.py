"""Checks of a hand-built tensor-parallel MLP (lesson 10, Exercise 10.1): what runs on the ranks, and the judging.

The learner's ``TensorParallelMLP(fc1, fc2)`` gets the two full layers of
``y = fc2(gelu(fc1(x)))`` (the same on every rank) and keeps 1/p of each weight: fc1 split
by output features (the rows of ``fc1.weight``), fc2 by input features (its columns), fc2's
bias whole on every rank, added once after the sum. Its forward makes one all-reduce (g), its
backward one more (f, for the input's gradient). Every all-reduce the ranks' trace sees counts,
however it was made: ``dist.all_reduce``, a ``ProcessGroup``'s ``allreduce`` or a functional
collective; the exercise switches DTensor off (``forbid=DTENSOR``, in
:mod:`autograder.lessons.lesson10`), so the learner places both all-reduces themselves.

- :func:`mlp_worker` (on the ranks): builds the layers and data for a seed drawn at grading
  time, the learner's module, one forward and backward; it returns the output, the
  gradients, what each parameter holds (which slice of which full weight, see
  :func:`identify`), the calls made in forward and in backward, and on rank 0 the
  one-process reference;
- :func:`judge_forward`, :func:`judge_backward`, :func:`judge_communication`,
  :func:`judge_shards`: feedback that names the mistake with the values.

The exercise and its parts are declared in :mod:`autograder.lessons.lesson10`; this module
ships to learners with it (the self-check uses it).

Example (the slices a parameter can hold, named the way feedback names them)::

    >>> import torch
    >>> full = {"fc1.weight": torch.arange(12.).reshape(4, 3)}
    >>> identify(torch.arange(12.).reshape(4, 3)[2:4], full, 2)
    ('fc1.weight', 'rows', 1)
"""

from __future__ import annotations

from typing import Any, Callable

from .kit import Attempt
from .pieces import plural

__all__ = ["SIZES", "mlp_worker", "identify", "describe", "judge_forward", "judge_backward", "judge_communication",
           "judge_shards", "TOLERANCE"]

#: The graded MLP: fc1 = Linear(d, hidden), fc2 = Linear(hidden, out), a batch of ``rows``. Every width
#: divides by 1, 2 and 4 (every split is even, the right one and a wrong one alike); out differs from d,
#: so the output (g's all-reduce, forward) and the input's gradient (f's, backward) differ in size, and
#: the trace tells which tensor each one summed.
SIZES = {"d": 8, "hidden": 12, "out": 16, "rows": 5}
TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
ITEM = {"float32": 4, "float64": 8}


def _layers(seed: int, dtype_name: str):
    import torch

    torch.manual_seed(seed)
    d, hidden = SIZES["d"], SIZES["hidden"]
    fc1, fc2 = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, SIZES["out"])
    dtype = getattr(torch, dtype_name)
    return fc1.to(dtype), fc2.to(dtype)


def _data(seed: int, dtype_name: str):
    """The input and the loss's weights (loss = sum(y * w)), the same on every rank."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    dtype = getattr(torch, dtype_name)
    x = torch.randn((SIZES["rows"], SIZES["d"]), generator=g).to(dtype)
    return x, torch.randn((SIZES["rows"], SIZES["out"]), generator=g).to(dtype)


def _reference(fc1, fc2, x, w, world_size: int) -> dict[str, Any]:
    """One process: output, gradients, and each rank's own share of the output (what a missing g leaves)."""
    import torch
    import torch.nn.functional as F

    x = x.clone().requires_grad_(True)
    h = F.gelu(fc1(x))
    y = fc2(h)
    (y * w).sum().backward()
    width = fc1.out_features // world_size
    with torch.no_grad():
        parts = [F.linear(h[:, r * width:(r + 1) * width], fc2.weight[:, r * width:(r + 1) * width])
                 for r in range(world_size)]
    return {"y": y.detach(), "x_grad": x.grad, "partial": [p + fc2.bias.detach() for p in parts],
            "bias": fc2.bias.detach().clone(),
            "grads": {"fc1.weight": fc1.weight.grad, "fc1.bias": fc1.bias.grad, "fc2.weight": fc2.weight.grad,
                      "fc2.bias": fc2.bias.grad}}


def identify(tensor, full: dict[str, Any], world_size: int) -> tuple[str, str, int] | None:
    """Which slice of which full tensor ``tensor`` holds: ``(name, "rows"|"columns"|"whole", block)``, or None.

    A block is one of ``world_size`` equal pieces along that dimension; a transposed copy
    counts as the slice it transposes.
    """
    import torch

    for candidate in (tensor, tensor.t() if tensor.dim() == 2 else tensor):
        for name, value in full.items():
            if candidate.shape == value.shape and torch.equal(candidate, value):
                return (name, "whole", 0)
            for dim, how in ((0, "rows"), (1, "columns")):
                if dim >= value.dim() or value.shape[dim] % world_size:
                    continue
                for block, piece in enumerate(value.chunk(world_size, dim=dim)):
                    if candidate.shape == piece.shape and torch.equal(candidate, piece):
                        return (name, how if value.dim() == 2 else "pieces", block)
    return None


def describe(where: tuple[str, str, int] | None, world_size: int, full_shapes: dict[str, tuple]) -> str:
    """``fc1.weight[4:8, :]`` for ``("fc1.weight", "rows", 1)``."""
    if where is None:
        return "none of fc1's or fc2's weights or biases"
    name, how, block = where
    if how == "whole":
        return f"all of {name}"
    size = full_shapes[name][0 if how in ("rows", "pieces") else 1] // world_size
    cut = f"{block * size}:{(block + 1) * size}"
    return f"{name}[{cut}]" if how == "pieces" else f"{name}[{cut}, :]" if how == "rows" else f"{name}[:, {cut}]"


def mlp_worker(rank: int, world_size: int, cls: Callable, seed: int, dtype_name: str,
               run: bool = True) -> dict[str, Any]:
    """The learner's module on this rank: one forward and one backward, with the calls of each.

    With ``run=False`` only the module is built (what the shards part looks at): a module
    that splits the wrong dimension then gets feedback on its shards, not a shape error.
    A forward that returns no tensor of the output's shape (rows x out) gets no backward.
    """
    import torch

    from helpers._runtime.instrument import current

    fc1, fc2 = _layers(seed, dtype_name)
    full = {name: t.detach() for name, t in (("fc1.weight", fc1.weight), ("fc1.bias", fc1.bias),
                                             ("fc2.weight", fc2.weight), ("fc2.bias", fc2.bias))}
    x, w = _data(seed, dtype_name)
    x.requires_grad_(True)
    inst = current()
    tracing = inst.tracing if inst is not None else False
    model = cls(fc1, fc2)
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
    if inst is not None:
        inst.tracing = tracing
    shards = {name: {"where": identify(p.detach(), full, world_size), "shape": tuple(p.shape), "nbytes":
                     p.numel() * p.element_size(), "grad": None if p.grad is None else p.grad.detach().clone()}
              for name, p in params.items()}
    return {
        "y": y.detach().clone() if isinstance(y, torch.Tensor) else y, "x_grad": x.grad, "shards": shards,
        "dtensors": dtensors, "forward": forward_calls, "forward_ok": run and forward_ok, "backward": backward_calls,
        "full_shapes": {name: tuple(t.shape) for name, t in full.items()},
        "reference": _reference(fc1, fc2, x.detach(), w, world_size) if rank == 0 else None,
    }


def _calls(inst: Any) -> list[tuple[str, int | None, str | None]]:
    """The calls this rank made since the last look: ``(op, bytes, via)``, ``via`` saying how a
    collective was made (None: a ``torch.distributed`` function)."""
    return [(e.op, e.nbytes, e.via) for e in inst.take_events()] if inst is not None else []


def _where(world_size: int, dtype_name: str) -> str:
    return f"on {plural(world_size, 'rank')}, {dtype_name}"


def _close(a, b, dtype_name: str) -> bool:
    import torch

    tol = TOLERANCE[dtype_name]
    return a is not None and b is not None and a.shape == b.shape and torch.allclose(a, b, rtol=tol, atol=tol)


def _no_dtensor(attempt: Attempt, replies: list[dict], where: str) -> None:
    for rank, reply in enumerate(replies):
        if reply["dtensors"]:
            attempt.fail(f"{where}, rank {rank}'s module holds DTensor parameters ({', '.join(reply['dtensors'])}). "
                         "Keep each shard as a plain torch.nn.Parameter and place the all-reduces yourself, in f and g.")


def judge_forward(attempt: Attempt, world_size: int, dtype_name: str, replies: list[dict]) -> None:
    """Every rank's output equals one process's; else name what the outputs are instead."""
    import torch

    where = _where(world_size, dtype_name)
    _no_dtensor(attempt, replies, where)
    ref = replies[0]["reference"]
    for rank, reply in enumerate(replies):
        y = reply["y"]
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(ref["y"].shape):
            got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            attempt.fail(f"{where}, rank {rank}'s forward returned {got}; it should return the whole output, a "
                         f"tensor of shape {tuple(ref['y'].shape)}, the same on every rank.")
        if _close(y, ref["y"], dtype_name):
            continue
        hint = ""
        if world_size > 1 and _close(y, ref["partial"][rank], dtype_name):
            hint = (" It equals this rank's own share, fc2's slice applied to its slice of the hidden layer: the "
                    "outputs are partial sums. All-reduce fc2's output over the ranks (g) before using it.")
        elif world_size > 1 and _close(y - ref["y"], ((world_size - 1) * ref["bias"]).expand_as(y), dtype_name):
            hint = (f" It exceeds the right output by {world_size - 1} x fc2's bias: every rank added the bias before "
                    "the all-reduce, so the sum counts it once per rank. Add it once, after the all-reduce.")
        elif any(op == "all_reduce" and n != y.numel() * y.element_size() for op, n, _ in reply["forward"]):
            hint = (" Its forward all-reduced a tensor of another size than the output: after a column split each "
                    "rank holds whole features of the hidden layer, not partial sums, so nothing needs summing "
                    "there; it is fc2's output that must be all-reduced.")
        attempt.fail(f"{where}: rank {rank}'s output differs from one process running the whole MLP.\n"
                     f"  expected {ref['y'].reshape(-1)[:4].tolist()}\n  actual   {y.reshape(-1)[:4].tolist()}" + hint)


def judge_backward(attempt: Attempt, world_size: int, dtype_name: str, replies: list[dict]) -> None:
    """The input's gradient and every shard's gradient equal one process's."""
    import torch

    where = _where(world_size, dtype_name)
    _no_dtensor(attempt, replies, where)
    ref = replies[0]["reference"]
    for rank, reply in enumerate(replies):
        y = reply["y"]
        if not (isinstance(y, torch.Tensor) and y.shape == ref["y"].shape and reply["forward_ok"]):
            got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            attempt.fail(f"{where}, rank {rank}'s forward returned {got} (no tensor of shape {tuple(ref['y'].shape)} "
                         "that autograd can reach), so no backward could run. Make forward right first.")
        if not _close(reply["x_grad"], ref["x_grad"], dtype_name):
            got = reply["x_grad"]
            hint = " The input's gradient is None: does the input reach your layers through autograd?" if got is None else ""
            if got is not None and world_size > 1:
                ratio = float(got.double().norm() / ref["x_grad"].double().norm())
                if abs(ratio - world_size) < 1e-3:
                    hint = (f" It is {world_size} times too large: g's backward must pass the gradient through "
                            "unchanged (every rank already holds the whole output's gradient); only f's backward sums.")
                else:
                    hint = (" Each rank's input gradient holds only its own shard's part: the input's gradient must be "
                            "summed over the ranks in backward. That is f: the identity in forward, an all-reduce of "
                            "the gradient in backward.")
            attempt.fail(f"{where}: rank {rank}'s input gradient x.grad differs from one process.\n"
                         f"  expected {ref['x_grad'].reshape(-1)[:4].tolist()}\n"
                         f"  actual   {None if got is None else got.reshape(-1)[:4].tolist()}" + hint)
        for name, shard in reply["shards"].items():
            where_slice = shard["where"]
            if where_slice is None:
                attempt.fail(f"{where}: rank {rank}'s parameter {name} (shape {shard['shape']}) holds "
                             "none of fc1's or fc2's weights or biases, or a slice of them, so its gradient cannot "
                             "be compared. Copy each shard from the full layers you are given.")
            full_name, how, block = where_slice
            want = _slice(ref["grads"][full_name], how, block, world_size)
            got = shard["grad"]
            if got is not None and got.shape != want.shape:
                got = got.t()
            if not _close(got, want, dtype_name):
                label = describe(where_slice, world_size, reply["full_shapes"])
                extra = ""
                if got is not None and world_size > 1 and want.norm() > 0 and abs(
                        float(got.double().norm() / want.double().norm()) - world_size) < 1e-3:
                    extra = (f" It is {world_size} times too large: g's backward must pass the gradient through "
                             "unchanged.")
                attempt.fail(f"{where}: the gradient of rank {rank}'s {name}, which holds {label}, differs from "
                             f"that slice of one process's gradient.\n  expected {want.reshape(-1)[:4].tolist()}\n"
                             f"  actual   {None if got is None else got.reshape(-1)[:4].tolist()}" + extra)


def _slice(value, how: str, block: int, world_size: int):
    if how == "whole":
        return value
    return value.chunk(world_size, dim=1 if how == "columns" else 0)[block]


#: How a collective was made, by its trace event's ``via``, as feedback words it.
_VIA = {None: "", "process_group": " (a ProcessGroup method)", "functional": " (a functional collective)"}
_MISSING = {"forward": " g's forward must sum fc2's partial outputs over the ranks: call dist.all_reduce there.",
            "backward": (" f's backward must sum the input's gradient over the ranks: write f as a "
                         "torch.autograd.Function whose backward calls dist.all_reduce (autograd does not see a "
                         "dist.all_reduce, so one made in forward has no backward).")}


def judge_communication(attempt: Attempt, world_size: int, dtype_name: str, replies: list[dict]) -> None:
    """Exactly one all-reduce of the output's size in forward, one of the input's size in backward, nothing else.

    Every all-reduce the trace sees counts, whichever way it was made (``dist.all_reduce``,
    ``ProcessGroup.allreduce``, a functional collective): DTensor is switched off, so each one
    is a call the learner placed in f or g themselves. The output and the input differ in
    width, so an all-reduce of the wrong tensor shows by its size. On one rank there is
    nothing to sum: no call, or the one call, are both right (Megatron-style code skips it).
    """
    where = _where(world_size, dtype_name)
    _no_dtensor(attempt, replies, where)
    sizes = {"forward": (SIZES["out"], "fc2's output (g)"), "backward": (SIZES["d"], "the input's gradient (f)")}
    for rank, reply in enumerate(replies):
        for phase, (width, what) in sizes.items():
            want = SIZES["rows"] * width * ITEM[dtype_name]
            calls = reply[phase]
            made = [(op, n) for op, n, _ in calls]
            if made == [("all_reduce", want)] or (world_size == 1 and made == []):
                continue
            seen = ", ".join(f"{op} of {n} bytes{_VIA.get(via, '')}" for op, n, via in calls) or "no call at all"
            hint = _MISSING[phase] if not calls else ""
            item = ITEM[dtype_name]
            output, given = SIZES["rows"] * SIZES["out"] * item, SIZES["rows"] * SIZES["d"] * item
            wrong = [n for op, n in made if op == "all_reduce" and n != want]
            if phase == "backward" and output in wrong:
                hint = (" g's all-reduce was differentiated too: an all-reduce that autograd differentiates by itself "
                        "(torch.distributed.nn.functional.all_reduce, or a functional collective) sums the output's "
                        "gradient again in backward. Call it inside g, your own autograd Function, whose backward "
                        "passes the gradient through.")
            elif phase == "forward" and given in wrong:
                hint = (f" It summed a tensor of the input's size ({given} bytes): the sum in forward belongs after "
                        "fc2, on its partial outputs (g); f, before fc1, is the identity in forward and sums the "
                        "input's gradient in backward. Are f and g swapped?")
            elif phase == "backward" and wrong:
                hint = (f" It summed {wrong[0]} bytes, not the input's gradient ({want} bytes): f, the identity placed "
                        "before fc1, sums the input's gradient in backward.")
            elif wrong:
                hint = (f" An all-reduce of {wrong[0]} bytes sums a tensor other than {what}: after fc1's column split "
                        "the hidden activations are whole features and need no sum.")
            attempt.fail(f"{where}, rank {rank}'s {phase} made {seen}; it should make exactly one all-reduce, of "
                         f"{what}: {SIZES['rows']} x {width} {dtype_name} = {want} bytes." + hint)


def judge_shards(attempt: Attempt, world_size: int, dtype_name: str, replies: list[dict]) -> None:
    """Rank r holds rows block r of fc1 (weight and bias), columns block r of fc2's weight, and fc2's bias whole."""
    where = _where(world_size, dtype_name)
    _no_dtensor(attempt, replies, where)
    expected = {"fc1.weight": "rows", "fc1.bias": "pieces", "fc2.weight": "columns", "fc2.bias": "whole"}
    d, hidden, out = SIZES["d"], SIZES["hidden"], SIZES["out"]
    want_bytes = ((d * hidden + hidden + hidden * out) // world_size + out) * ITEM[dtype_name]
    for rank, reply in enumerate(replies):
        shapes = reply["full_shapes"]
        held: dict[str, tuple] = {}
        for name, shard in reply["shards"].items():
            found = shard["where"]
            if found is None:
                attempt.fail(f"{where}: rank {rank}'s parameter {name} (shape {shard['shape']}) holds none of fc1's "
                             "or fc2's weights or biases, or an equal slice of them.")
            full_name, how, block = found
            if full_name in held:
                attempt.fail(f"{where}: rank {rank} keeps {full_name} twice ({held[full_name][0]} and {name}); keep "
                             "one shard of each weight.")
            held[full_name] = (name, how, block)
            label = describe(found, world_size, shapes)
            if world_size > 1 and how != expected[full_name] and not (how == "whole" and expected[full_name] != "whole"):
                rule = {"rows": "its output features, the rows of nn.Linear's weight (out_features, in_features)",
                        "columns": "its input features, the columns of nn.Linear's weight",
                        "pieces": "the output features, like fc1's weight", "whole": "nothing: keep it whole"}
                attempt.fail(f"{where}: rank {rank}'s {name} holds {label}: that splits {full_name} along the wrong "
                             f"dimension. Split {full_name} by {rule[expected[full_name]]}.")
            if world_size > 1 and how == "whole" and expected[full_name] != "whole":
                attempt.fail(f"{where}: rank {rank}'s {name} holds {label}, unsplit: each rank should keep 1/{world_size} "
                             f"of it ({describe((full_name, expected[full_name], rank), world_size, shapes)}).")
            if how != "whole" and block != rank:
                attempt.fail(f"{where}: rank {rank}'s {name} holds {label}, rank {block}'s block: rank r keeps block r "
                             f"({describe((full_name, how, rank), world_size, shapes)}).")
        missing = [name for name in expected if name not in held]
        if missing:
            attempt.fail(f"{where}: rank {rank} keeps no parameter holding {', '.join(missing)}: keep each shard as a "
                         "torch.nn.Parameter of the module (module.named_parameters() lists them).")
        total = sum(shard["nbytes"] for shard in reply["shards"].values())
        if total != want_bytes:
            attempt.fail(f"{where}: rank {rank}'s parameters take {total} bytes; 1/{world_size} of each weight and of "
                         f"fc1's bias, plus fc2's whole bias, is {want_bytes} bytes.")
