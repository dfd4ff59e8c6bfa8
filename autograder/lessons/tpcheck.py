"""Checks of a hand-built tensor-parallel MLP (lesson 10, Exercise 10.1): what runs on the ranks, and the judging.

The learner's ``TensorParallelMLP(fc1, fc2)`` gets the two full layers of
``y = fc2(gelu(fc1(x)))`` (the same on every rank) and keeps 1/p of each weight: fc1 split
by output features (the rows of ``fc1.weight``), fc2 by input features (its columns), fc2's
bias whole on every rank, added once after the sum. Which hidden units a rank keeps is its
choice (the lesson's block r, or a strided split r, r + p, ...): the ranks' shares must split
the hidden units between them, and each rank keep the same units of fc1's rows, fc1's bias
and fc2's columns. Its forward makes one all-reduce (g), its backward one more (f, for the
input's gradient). A parameter given frozen (``requires_grad=False``) stays frozen in the
shards: torch leaves its ``.grad`` None. Every all-reduce the ranks' trace sees counts,
however it was made: ``dist.all_reduce``, a ``ProcessGroup``'s ``allreduce`` or a functional
collective; the exercise switches DTensor off (``forbid=DTENSOR``, in
:mod:`autograder.lessons.lesson10`), so the learner places both all-reduces themselves.

- :func:`autograder.lessons.tpdata.mlp_worker` (on the ranks, beside the layers, the data and
  one process's answer): the learner's module built, run forward and backward and probed
  (every rank but rank 0 on another input: a tensor-parallel rank 0 sees its output change);
- :func:`judge_forward`, :func:`judge_backward`, :func:`judge_communication`,
  :func:`judge_shards`: feedback that names the mistake with the values.

The exercise and its parts are declared in :mod:`autograder.lessons.lesson10`; this module
ships to learners with it (the self-check uses it).

Example (what one rank's parameters take on 2 ranks: half of each weight and of fc1's bias, fc2's bias whole)::

    >>> shard_bytes(2, "float64")
    1328
"""

from __future__ import annotations

from ..kit.exercise import Attempt
from ..kit.pieces import plural
from .tpdata import ITEM, SIZES, TOLERANCE, describe, identify, mlp_worker, select

__all__ = ["SIZES", "mlp_worker", "identify", "describe", "judge_forward", "judge_backward", "judge_communication",
           "judge_shards", "TOLERANCE", "shard_bytes"]


def shard_bytes(world_size: int, dtype_name: str) -> int:
    """One rank's parameters in bytes: 1/p of each weight and of fc1's bias, plus fc2's whole bias."""
    d, hidden, out = SIZES["d"], SIZES["hidden"], SIZES["out"]
    return ((d * hidden + hidden + hidden * out) // world_size + out) * ITEM[dtype_name]


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
        if world_size > 1 and _close(y, _own_share(ref, reply), dtype_name):
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
    probe = replies[0]["probe"]
    if world_size > 1 and probe is not None and _close(probe["y"], replies[0]["y"], dtype_name):
        attempt.fail(f"{where}: rank 0's output stayed the same when every other rank ran forward on another input: "
                     "rank 0 computed it alone, with nothing from the other ranks (from whole copies of the weights?). "
                     "In tensor parallelism each rank computes with its own share of the weights only, and g sums the "
                     "ranks' partial outputs, so every rank's output depends on every rank's input.")


def _units(reply: dict) -> tuple[int, ...] | None:
    """The hidden units a rank computes with: the rows of fc1.weight (or the columns of fc2.weight) it holds."""
    found = {shard["where"][0]: shard["where"] for shard in reply["shards"].values() if shard["where"]}
    for name in ("fc1.weight", "fc2.weight"):
        if name in found and found[name][1] in ("rows", "columns") and found[name][1] != "whole":
            return found[name][2]
    return None


def _own_share(ref: dict, reply: dict):
    """This rank's partial output, fc2's columns applied to its hidden units, plus fc2's bias: what a missing g
    leaves."""
    import torch.nn.functional as F

    units = _units(reply)
    if units is None:
        return None
    return F.linear(ref["h"][:, list(units)], ref["w2"][:, list(units)]) + ref["bias"]


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
            _judge_shard_grad(attempt, where, rank, name, shard, ref, world_size, dtype_name)
    probe = replies[0]["probe"]
    if world_size > 1 and probe is not None and _close(probe["x_grad"], replies[0]["x_grad"], dtype_name):
        attempt.fail(f"{where}: rank 0's input gradient stayed the same when every other rank ran forward and backward "
                     "on another input and output gradient: rank 0 computed it alone. Each rank's fc1 block gives only "
                     "its part of the input's gradient; f's backward sums the parts over the ranks.")


def _judge_shard_grad(attempt: Attempt, where: str, rank: int, name: str, shard: dict, ref: dict, world_size: int,
                      dtype_name: str) -> None:
    """One parameter's gradient against the part of one process's gradient it holds (None where torch leaves none)."""
    found = shard["where"]
    if found is None:
        attempt.fail(f"{where}: rank {rank}'s parameter {name} (shape {shard['shape']}) holds "
                     "none of fc1's or fc2's weights or biases, or rows or columns of them, so its gradient cannot "
                     "be compared. Copy each shard from the full layers you are given.")
    full_name, how, indices = found
    label, got = describe(found), shard["grad"]
    want = select(ref["grads"][full_name], how, indices)
    if want is None:
        if got is not None:
            attempt.fail(f"{where}: rank {rank}'s {name}, which holds {label}, has a gradient after backward, but "
                         f"{full_name} was given frozen (requires_grad=False), and torch leaves a frozen parameter's "
                         ".grad None (an optimizer then leaves it alone). Keep the flag when you copy the shard: "
                         f"nn.Parameter(..., requires_grad={full_name}.requires_grad).")
        return
    if got is not None and got.shape != want.shape:
        got = got.t()
    if _close(got, want, dtype_name):
        return
    extra = ""
    if got is not None and world_size > 1 and want.norm() > 0 and abs(
            float(got.double().norm() / want.double().norm()) - world_size) < 1e-3:
        extra = f" It is {world_size} times too large: g's backward must pass the gradient through unchanged."
    attempt.fail(f"{where}: the gradient of rank {rank}'s {name}, which holds {label}, differs from "
                 f"that part of one process's gradient.\n  expected {want.reshape(-1)[:4].tolist()}\n"
                 f"  actual   {None if got is None else got.reshape(-1)[:4].tolist()}" + extra)


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
    """Each rank holds rows of fc1 (weight and bias) and the same hidden units' columns of fc2's weight, 1/p of
    the hidden units, the ranks' shares splitting them (block r, strided, any split); fc2's bias whole."""
    where = _where(world_size, dtype_name)
    _no_dtensor(attempt, replies, where)
    expected = {"fc1.weight": "rows", "fc1.bias": "pieces", "fc2.weight": "columns", "fc2.bias": "whole"}
    hidden, want_bytes = SIZES["hidden"], shard_bytes(world_size, dtype_name)
    owner: dict[int, int] = {}  # hidden unit -> the rank that holds it
    for rank, reply in enumerate(replies):
        held: dict[str, tuple] = {}
        for name, shard in reply["shards"].items():
            found = shard["where"]
            if found is None:
                attempt.fail(f"{where}: rank {rank}'s parameter {name} (shape {shard['shape']}) holds none of fc1's "
                             "or fc2's weights or biases, or rows or columns of them.")
            full_name, how, indices = found
            if full_name in held:
                attempt.fail(f"{where}: rank {rank} keeps {full_name} twice ({held[full_name][0]} and {name}); keep "
                             "one shard of each weight.")
            held[full_name] = (name, how, indices)
            label = describe(found)
            if world_size > 1 and how != expected[full_name] and not (how == "whole" and expected[full_name] != "whole"):
                rule = {"rows": "its output features, the rows of nn.Linear's weight (out_features, in_features)",
                        "columns": "its input features, the columns of nn.Linear's weight",
                        "pieces": "the output features, like fc1's weight", "whole": "nothing: keep it whole"}
                attempt.fail(f"{where}: rank {rank}'s {name} holds {label}: that splits {full_name} along the wrong "
                             f"dimension. Split {full_name} by {rule[expected[full_name]]}.")
            if world_size > 1 and how == "whole" and expected[full_name] != "whole":
                attempt.fail(f"{where}: rank {rank}'s {name} holds {label}, unsplit: each rank should keep "
                             f"1/{world_size} of it, {hidden // world_size} of the {hidden} hidden units.")
        missing = [name for name in expected if name not in held]
        if missing:
            attempt.fail(f"{where}: rank {rank} keeps no parameter holding {', '.join(missing)}: keep each shard as a "
                         "torch.nn.Parameter of the module (module.named_parameters() lists them).")
        if world_size > 1:
            _judge_units(attempt, where, rank, held, owner, world_size)
        total = sum(shard["nbytes"] for shard in reply["shards"].values())
        if total != want_bytes:
            attempt.fail(f"{where}: rank {rank}'s parameters take {total} bytes; 1/{world_size} of each weight and of "
                         f"fc1's bias, plus fc2's whole bias, is {want_bytes} bytes.")


def _judge_units(attempt: Attempt, where: str, rank: int, held: dict, owner: dict, world_size: int) -> None:
    """The same hidden units in fc1's rows, fc1's bias and fc2's columns, 1/p of them, held by no other rank."""
    hidden = SIZES["hidden"]
    units = {full_name: set(held[full_name][2]) for full_name in ("fc1.weight", "fc1.bias", "fc2.weight")}
    if len({frozenset(u) for u in units.values()}) > 1:
        said = "; ".join(f"{held[n][0]} holds {describe((n, held[n][1], held[n][2]))}" for n in units)
        attempt.fail(f"{where}: rank {rank}'s shards hold different hidden units ({said}). Hidden unit j is row j of "
                     "fc1.weight, element j of fc1.bias and column j of fc2.weight: keep the same units in all three.")
    mine = sorted(units["fc1.weight"])
    if len(mine) != hidden // world_size:
        attempt.fail(f"{where}: rank {rank} holds {len(mine)} of the {hidden} hidden units "
                     f"({describe(held['fc1.weight'])}); each of the {world_size} ranks keeps {hidden // world_size}.")
    shared = [j for j in mine if j in owner]
    if shared:
        attempt.fail(f"{where}: ranks {owner[shared[0]]} and {rank} both hold hidden unit {shared[0]} (row {shared[0]} "
                     "of fc1.weight): the ranks' shares must split the hidden units, each unit on one rank only "
                     "(rank r can keep rows r*k:(r+1)*k, k = h / p, or every p-th row from r).")
    owner.update(dict.fromkeys(mine, rank))
