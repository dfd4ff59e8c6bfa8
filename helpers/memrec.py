"""Measuring a training step on a rank: the bytes autograd keeps, and the bytes each collective sends.

- :class:`SavedBytes` counts what autograd keeps for backward while a step runs: every tensor an
  operation saves passes through its ``saved_tensors_hooks``; each *storage* is counted once (views
  of it are the same memory) from the moment it is first saved until the last operation that keeps
  it has released it (after its backward, or when the graph is dropped). ``peak`` is the most held
  at once. Storages registered with :meth:`SavedBytes.skip` (weights, constants) are not counted;
  a ``tokenize`` function may replace a saved tensor by something that rebuilds it later (ZeRO-3's
  gathered weights, gathered again in backward). With ``log=True`` it lists each storage it starts counting
  (shape, dtype, bytes): what a piece of code keeps, one line each.
- :class:`Peak` is a running maximum of a quantity that goes up and down (parameter or gradient bytes).
- :func:`ring_bytes` turns one traced collective into the bytes a rank sends when it runs as a ring
  (lesson 9's rule), and :func:`traffic` adds up a rank's calls of a traced step by collective and
  by the mesh dimension of the group they ran on.

Example::

    >>> import torch
    >>> rec = SavedBytes()
    >>> x = torch.ones(256, requires_grad=True)
    >>> with rec.hooks():
    ...     y = (x * 2).exp()             # exp keeps its output: 1 KiB
    >>> rec.current, rec.peak
    (1024, 1024)
    >>> y.sum().backward()            # backward releases what it kept
    >>> rec.current
    0
    >>> ring_bytes("all_reduce", 1000, 4), ring_bytes("all_gather_into_tensor", 250, 4)
    (1500.0, 750)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:
    import torch

__all__ = ["SavedBytes", "Peak", "ring_bytes", "collective", "traffic"]


class Peak:
    """A quantity that rises and falls, with the highest value it reached."""

    def __init__(self, value: int = 0) -> None:
        self.current = self.peak = value

    def add(self, nbytes: int) -> None:
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def moment(self, extra: int) -> None:
        """Note a moment where ``extra`` bytes are held on top of the current ones."""
        self.peak = max(self.peak, self.current + extra)


class _Held:
    """A saved tensor, counted while autograd holds it (this object lives exactly as long)."""

    __slots__ = ("tensor", "key", "owner")

    def __init__(self, owner: "SavedBytes", tensor: torch.Tensor, key: int, nbytes: int) -> None:
        self.tensor, self.key, self.owner = tensor, key, owner
        owner._retain(key, nbytes)

    def __del__(self) -> None:
        self.owner._release(self.key)


class SavedBytes:
    """The bytes autograd keeps for backward, by distinct storage, while :meth:`hooks` is active."""

    def __init__(self, tokenize: Callable[[torch.Tensor], Any] | None = None,
                 resolve: Callable[[Any], torch.Tensor] | None = None, log: bool = False) -> None:
        self.tokenize, self.resolve = tokenize, resolve
        self.log: list[tuple[tuple, str, int]] | None = [] if log else None   # (shape, dtype, bytes) of each storage
        self.current = self.peak = 0
        self._live: dict[int, list[int]] = {}
        self._skip: set[int] = set()

    @staticmethod
    def key(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    def skip(self, tensors: Iterable[torch.Tensor]) -> None:
        """Never count these tensors' storages (weights, constants made once)."""
        self._skip.update(self.key(t) for t in tensors)

    def hooks(self) -> Any:
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _retain(self, key: int, nbytes: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            self._live[key] = [1, nbytes]
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        else:
            entry[0] += 1

    def _release(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is not None:
            entry[0] -= 1
            if entry[0] == 0:
                del self._live[key]
                self.current -= entry[1]

    def _pack(self, t: torch.Tensor) -> Any:
        if self.tokenize is not None:
            token = self.tokenize(t)
            if token is not None:
                return token
        key = self.key(t)
        if key in self._skip:
            return t
        if self.log is not None and key not in self._live:
            self.log.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), t.untyped_storage().nbytes()))
        return _Held(self, t, key, t.untyped_storage().nbytes())

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, _Held):
            return packed.tensor
        if not isinstance(packed, tuple):
            return packed
        return self.resolve(packed)


def collective(op: str) -> str | None:
    """The kind of a traced call: "all_reduce", "all_gather", "reduce_scatter", "send" (point-to-point, sent),
    or None for what sends nothing of its own (receives, barriers)."""
    if op in ("send", "isend"):
        return "send"
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        if op.startswith(kind) or op.startswith("_" + kind):
            return kind
    return None


def ring_bytes(op: str, nbytes: float, p: int) -> float:
    """Bytes one rank sends for a traced call whose tensor had ``nbytes``, if the collective runs as a ring:
    the trace notes the whole tensor of an all-reduce, reduce-scatter or all-to-all, and this rank's piece of
    an all-gather (lesson 9)."""
    kind = collective(op)
    if kind == "send":
        return nbytes
    if p <= 1 or kind is None:
        return 0
    if kind == "all_reduce":
        return 2 * (p - 1) / p * nbytes
    if kind in ("reduce_scatter", "all_to_all"):
        return (p - 1) / p * nbytes
    return (p - 1) * nbytes                           # all_gather: this rank's piece to each of the others


def traffic(events: Iterable[Any], layout: Any, rank: int, sync: Iterable[int] = ()) -> dict[tuple[str, str], float]:
    """Bytes rank ``rank`` sent in ``events`` (its trace events), by (collective, mesh dimension), as
    :func:`ring_bytes` counts them. A collective's dimension is the one its group spans
    (:meth:`helpers.plan.Layout.dims_of`); a send's, the one on which it differs from its peer; the events
    at the positions in ``sync`` (gradient and ZeRO exchanges) are named ``layout.grad_dim``."""
    out: dict[tuple[str, str], float] = {}
    sync = set(sync)
    for i, e in enumerate(events):
        kind = collective(e.op)
        if kind is None:
            continue
        if kind == "send":
            dim = layout.dims_of([rank, e.peer])
            sent = float(e.nbytes or 0)
        else:
            group = list(e.group) if e.group else list(range(layout.world))
            dim = layout.grad_dim if i in sync else layout.dims_of(group)
            sent = ring_bytes(e.op, e.nbytes or 0, len(group))
        if sent:
            out[(kind, dim)] = out.get((kind, dim), 0) + sent
    return out
