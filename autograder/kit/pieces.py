"""Small pieces the lessons' checks share: test data, differences, grouping, traffic, words.

- :func:`call_learner`: a worker that returns ``fn(rank, world_size)``;
- :func:`seeded_tensor`: a rank's test tensor for a seed drawn at grading time;
- :func:`first_difference` (a :class:`Difference`): how a tensor differs from the expected one;
- :func:`by_world_size`: cases grouped so that each world size is one launch;
- :func:`silent_ranks`: ranks that sent or received no point-to-point message (from a trace);
- :func:`plural`: ``"1 rank"``, ``"3 ranks"``;
- :func:`usable`: what the learner's class made, checked for what the check calls on it (:class:`AnswerError`);
- :func:`recorded`: the learner's code run on a rank with its ``torch.distributed`` calls recorded;
- :func:`read_before_wait`: whether those calls left data that was still arriving (an ``irecv`` or an
  asynchronous collective) for the learner to read.

They ship to learners with the kit (the self-checks use them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from helpers import LaunchResult

__all__ = ["call_learner", "plural", "seeded_tensor", "Difference", "first_difference", "by_world_size", "silent_ranks",
           "recorded", "read_before_wait", "HALF_FINISHED", "AnswerError", "usable"]

#: What a check adds when wrong values come with an answer that used data still arriving.
HALF_FINISHED = ("The values look like a half-finished exchange: a buffer filled by dist.irecv, or by a collective "
                 "called with async_op=True, holds its data only once wait() on the request it returned has "
                 "returned. Call wait() before you read, add, copy or divide that buffer.")


def call_learner(rank: int, world_size: int, fn: Callable) -> Any:
    """A worker that returns ``fn(rank, world_size)``: for exercises judged by return values."""
    return fn(rank, world_size)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``"1 rank"``, ``"3 ranks"``.

    >>> plural(1, "rank"), plural(0, "element"), plural(2, "host")
    ('1 rank', '0 elements', '2 hosts')
    """
    return f"{n} {word if n == 1 else many or word + 's'}"


def seeded_tensor(shape: tuple, dtype_name: str, seed: int, rank: int, *, int_range: tuple[int, int] = (-1000, 1000)):
    """Rank ``rank``'s test tensor for ``seed``: the same on every process, new at every grading.

    Integers are drawn from ``int_range`` (uint8 from 0 to 255), floats are normal times 10.

    >>> seeded_tensor((3,), "int64", 7, 1).equal(seeded_tensor((3,), "int64", 7, 1))
    True
    """
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype_name == "uint8":
        return torch.randint(0, 256, shape, generator=g).to(torch.uint8)
    if dtype_name in ("int64", "int32", "int16", "int8"):
        return torch.randint(*int_range, shape, generator=g).to(getattr(torch, dtype_name))
    return (torch.randn(shape, generator=g) * 10).to(getattr(torch, dtype_name))


@dataclass(frozen=True)
class Difference:
    """How a tensor differs from the expected one: ``what`` in words, and an ``excerpt`` of values.

    ``str()`` gives both: ``"first wrong element at flat index 3\\n  expected [...]\\n  actual   [...]"``.
    """

    what: str
    excerpt: str = ""
    index: int | None = None  # the flat index of the first wrong element, when an element is wrong

    def __str__(self) -> str:
        return self.what + self.excerpt


def first_difference(actual, expected, *, tolerance: float | None = None) -> Difference | None:
    """None when ``actual`` equals ``expected``; else the first difference (shape, dtype, or element).

    Floats are compared within ``tolerance`` (relative and absolute) when it is given,
    exactly otherwise. The excerpt shows a few values round the first wrong element.

    >>> import torch
    >>> print(first_difference(torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3])))
    first wrong element at flat index 1
      expected [1, 5, 3]
      actual   [1, 2, 3]
    """
    import torch

    if tuple(actual.shape) != tuple(expected.shape):
        return Difference(f"its shape became {tuple(actual.shape)} instead of {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        return Difference(f"its dtype became {actual.dtype} instead of {expected.dtype}")
    if tolerance is not None and expected.is_floating_point():
        bad = ~torch.isclose(actual.double(), expected.double(), rtol=tolerance, atol=tolerance)
    else:
        bad = actual != expected
    if not bool(bad.any()):
        return None
    i = int(bad.reshape(-1).nonzero()[0])
    a, e = actual.reshape(-1), expected.reshape(-1)
    return Difference(
        f"first wrong element at flat index {i}",
        f"\n  expected {e[max(0, i - 2): i + 6].tolist()}\n  actual   {a[max(0, i - 2): i + 6].tolist()}",
        i,
    )


def by_world_size(cases: Iterable[tuple]) -> list[tuple[int, list[tuple]]]:
    """Cases ``(world size, *rest)`` grouped by world size, smallest first: one launch per size.

    >>> by_world_size([(2, "a"), (1, "b"), (2, "c")])
    [(1, [('b',)]), (2, [('a',), ('c',)])]
    """
    grouped: dict[int, list[tuple]] = {}
    for world, *rest in cases:
        grouped.setdefault(world, []).append(tuple(rest))
    return sorted(grouped.items())


def silent_ranks(
    result: LaunchResult, directions: Sequence[str] = ("sent", "received"), ranks: Iterable[int] | None = None
) -> list[tuple[int, str]]:
    """The ranks that sent or received no point-to-point message, in rank order, with the word for it.

    Reads the trace of a launch run with ``trace=True``. ``directions`` holds ``"sent"``
    and/or ``"received"``; for each rank of ``ranks`` (every rank by default) the first
    direction in which it was silent is reported: ``[(2, "received")]``.
    """
    keys = {"sent": "sent_messages", "received": "recv_messages"}
    unknown = [d for d in directions if d not in keys]
    if unknown:
        raise ValueError(f"directions are 'sent' and 'received', not {unknown}")
    summary = result.trace.summary()
    found = []
    for rank in range(len(result)) if ranks is None else ranks:
        word = next((d for d in directions if summary[rank][keys[d]] == 0), None)
        if word:
            found.append((rank, word))
    return found


class AnswerError(TypeError):
    """What the learner's code made cannot be used as the exercise asks (None, a missing method). Raised on a rank by
    :func:`usable`; the harness reports it as the learner's failed part, not as a fault of the course's check."""


def usable(made: Any, call: str, methods: Sequence[str] = (), module: bool = False) -> Any:
    """Return ``made``, what the learner's ``call`` gave back, if the check can use it: a ``torch.nn.Module`` when
    ``module``, with every method of ``methods``. Otherwise raise :class:`AnswerError` saying what it lacks.

    >>> usable(None, "MiniDDP(model)", ("finish_gradient_synchronization",), module=True)
    Traceback (most recent call last):
    ...
    autograder.kit.pieces.AnswerError: MiniDDP(model) gave None, not a torch.nn.Module: a function that ends without `return` gives None; a class gives its object.
    """
    if made is None:
        wanted = "a torch.nn.Module" if module else f"an object with a {methods[0]}() method" if methods else "an object"
        raise AnswerError(f"{call} gave None, not {wanted}: a function that ends without `return` gives None; a class "
                          "gives its object.")
    if module:
        import torch

        if not isinstance(made, torch.nn.Module):
            raise AnswerError(f"{call} gave an object of type {type(made).__name__}, not a torch.nn.Module: subclass "
                              "nn.Module, so that its parameters are found and calling it runs forward().")
    missing = [m for m in methods if not callable(getattr(made, m, None))]
    if missing:
        raise AnswerError(f"{call} gave an object of type {type(made).__name__}, which has no {missing[0]}() method; "
                          "the check calls it by the name the exercise gives. Define it on the class under exactly "
                          "that name.")
    return made


def recorded(call: Callable[[], Any]) -> tuple[Any, list]:
    """Run ``call()`` on a rank with its ``torch.distributed`` calls recorded: ``(its result, the calls)``.

    The calls are the rank's trace events (:class:`helpers._runtime.protocol.TraceEvent`): op,
    peer, bytes, whether asynchronous, and when its ``wait()`` returned. A run traced as a whole
    keeps them in its trace too; otherwise they are recorded for this look only. Outside a rank
    (no instrument) nothing is recorded.

    >>> recorded(lambda: 42)
    (42, [])
    """
    from helpers._runtime.instrument import current

    inst = current()
    if inst is None:
        return call(), []
    was, mark = inst.tracing, len(inst.events)
    inst.tracing = True
    try:
        result = call()
        made = inst.events[mark:]
    finally:
        inst.tracing = was
        if not was:
            del inst.events[mark:]
    return result, made


def read_before_wait(calls: list) -> bool:
    """Whether ``calls`` (from :func:`recorded`) received data asynchronously: an ``irecv``, or a
    collective with ``async_op=True``. Wrong values from such code often mean a buffer read before
    its ``wait()``; checks then add :data:`HALF_FINISHED` to their feedback.

    >>> read_before_wait([])
    False
    """
    return any(e.op == "irecv" or (e.async_op and not e.is_send) for e in calls)
