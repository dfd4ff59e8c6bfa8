"""ZeRO's units on one rank: parameters held whole or sharded over the ranks that hold the same ones.

A *unit* is what ZeRO gathers and reduces together (the embedding, one layer, the head with the final
norm). :class:`Unit` holds its parameters as its stage says (``layout.zero``, over the dp x cp ranks of
``run.shard_group``) and hands the forward pass whole weights through one autograd Function, whose backward
receives the unit's fresh gradients at once:

- ZeRO 0 and 1: whole weights; the gradients are added into whole buffers; after the last micro-batch
  ZeRO 0 all-reduces them, ZeRO 1 reduce-scatters them and each rank steps its slice (a view of the whole
  weight), then all-gathers the slices (:meth:`Unit.refresh`);
- ZeRO 2: whole weights; each micro-batch's gradients are reduce-scattered at once into the slice's buffer;
- ZeRO 3: only the slice is kept; the weights are all-gathered for the unit's forward and freed after it,
  and gathered again when backward first needs them (a saved weight is kept as a token that gathers it:
  :meth:`Unit.regathered`); the gradients are reduce-scattered like ZeRO 2's.

Every exchange made here is noted in :data:`SYNC` (its positions in the rank's trace), so that traffic can
name it by its role. Used by :mod:`helpers.planrun`, which holds the ``run`` these units report to.

Example::

    >>> nbytes(__import__("torch").zeros(3, 4))
    48
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Unit", "SYNC", "nbytes"]

#: Positions, in this rank's trace, of its gradient and ZeRO exchanges.
SYNC: set[int] = set()


def nbytes(t: torch.Tensor) -> int:
    """The bytes of ``t``'s own elements (not of the whole storage a view sits in)."""
    return t.numel() * t.element_size()


class _UnitFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, unit, *leaves):
        ctx.unit = unit
        return tuple(unit.whole())

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.unit.reduce(grads))


class Unit:
    """One unit's parameters on this rank, held as its ZeRO stage holds them. ``run`` gives the shard group
    (``shard_group``, ``shard_size``, ``shard_rank``), the running counts ``params`` and ``grads``
    (:class:`helpers.memrec.Peak`), and ``gathered``/``freed`` for ZeRO-3's gathered weights."""

    def __init__(self, names: tuple[str, ...], tensors: list[torch.Tensor], run: Any) -> None:
        self.names, self.run, self.zero = names, run, run.layout.zero
        q, r = run.shard_size, run.shard_rank
        self.shapes = [t.shape for t in tensors]
        self.cache: list[torch.Tensor] | None = None
        if self.zero < 3:
            self.full = tensors
            if self.zero == 0:
                self.leaves = [torch.nn.Parameter(t) for t in self.full]
            else:                                     # each rank steps a view of its slice of the whole weight
                self.leaves = [torch.nn.Parameter(t.view(-1)[r * (t.numel() // q):(r + 1) * (t.numel() // q)])
                               for t in self.full]
        else:
            self.full = []
            self.leaves = [torch.nn.Parameter(t.reshape(-1)[r * (t.numel() // q):(r + 1) * (t.numel() // q)].clone())
                           for t in tensors]
        self.numel = sum(t.numel() for t in tensors)
        self.grads = [torch.zeros_like(t) for t in tensors] if self.zero < 2 else None

    def weights(self) -> list[torch.Tensor]:
        """The unit's whole weights for a forward pass, through the Function whose backward reduces them."""
        return list(_UnitFn.apply(self, *self.leaves))

    def whole(self) -> list[torch.Tensor]:
        if self.zero < 3:
            return [t.detach() for t in self.full]
        return self.gather()

    def gather(self) -> list[torch.Tensor]:
        """The unit's weights all-gathered from the shards (ZeRO-3), noted as held until they are freed."""
        run, out = self.run, []
        for leaf, shape in zip(self.leaves, self.shapes):
            whole = torch.empty(leaf.numel() * run.shard_size, dtype=leaf.dtype)
            if run.shard_size > 1:
                _all_gather(whole, leaf.detach(), run.shard_group)
            else:
                whole.copy_(leaf.detach())
            whole = whole.view(shape)
            run.gathered[whole.untyped_storage().data_ptr()] = (self, len(out))
            run.params.add(nbytes(whole))
            weakref.finalize(whole, run.freed, whole.untyped_storage().data_ptr(), nbytes(whole))
            out.append(whole)
        return out

    def regathered(self) -> list[torch.Tensor]:
        if self.cache is None:
            self.cache = self.gather()
        return self.cache

    def reduce(self, grads: tuple[torch.Tensor, ...]) -> list[torch.Tensor | None]:
        run = self.run
        run.grads.moment(sum(nbytes(g) for g in grads if g is not None))
        if self.zero < 2:
            for buf, g in zip(self.grads, grads):
                if g is not None:
                    buf.add_(g)
            return [None] * len(grads)
        out = []
        for leaf, g in zip(self.leaves, grads):
            if run.shard_size > 1:
                mine = torch.empty(leaf.numel(), dtype=leaf.dtype)
                _reduce_scatter(mine, g.reshape(-1), run.shard_group)
            else:
                mine = g.reshape(-1)
            out.append(mine)
        self.cache = None
        return out

    def finish(self) -> None:
        """After the last micro-batch: sum the gradients over dp x cp, ready for the optimizer."""
        run, q, r = self.run, self.run.shard_size, self.run.shard_rank
        if self.zero == 0:
            for leaf, buf in zip(self.leaves, self.grads):
                if q > 1:
                    _synced(lambda: dist.all_reduce(buf, group=run.shard_group))
                leaf.grad = buf
        elif self.zero == 1:
            for leaf, buf in zip(self.leaves, self.grads):
                n = buf.numel() // q
                mine = buf.view(-1)[r * n:(r + 1) * n]
                if q > 1:
                    out = torch.empty(n, dtype=buf.dtype)
                    _reduce_scatter(out, buf.view(-1), run.shard_group)
                    mine.copy_(out)
                leaf.grad = mine

    def refresh(self) -> None:
        """After the optimizer step (ZeRO 1 and 2): every rank's updated slice into every rank's weights."""
        if self.zero in (1, 2) and self.run.shard_size > 1:
            for leaf, t in zip(self.leaves, self.full):
                _all_gather(t.view(-1), leaf.detach().clone(), self.run.shard_group)

    def zero_grads(self) -> None:
        if self.grads is not None:
            for g in self.grads:
                g.zero_()
        else:
            for leaf in self.leaves:
                leaf.grad = torch.zeros_like(leaf)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _synced(call):
    """Run a gradient or ZeRO exchange, noting which of the rank's trace events it made (see :func:`traffic`)."""
    from ._runtime.instrument import current

    inst = current()
    mark = len(inst.events) if inst is not None else 0
    call()
    if inst is not None:
        SYNC.update(range(mark, len(inst.events)))


def _all_gather(out, x, group):
    _synced(lambda: (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x, group=group))


def _reduce_scatter(out, x, group):
    _synced(lambda: (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, x, group=group))
