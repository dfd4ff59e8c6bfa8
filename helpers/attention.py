"""Attention split over ranks: the zig-zag layout, and a recorder of what attention code creates and computes.

Lesson 11 splits one sample's sequence over ranks. Two small tools serve its pictures and its
checks alike:

- :func:`zigzag_chunks` and :func:`zigzag_positions`: the zig-zag layout of a causal model's
  sequence, cut into 2p chunks with rank r holding chunks r and 2p - 1 - r, so that every rank
  gets the same causal work;
- :class:`TensorRecorder`: a ``TorchDispatchMode`` that notes, while it is active, the largest
  tensor (in bytes) torch operations create (the memory a block-by-block attention must stay under) and
  how many attention scores were computed (the work a causal mask leaves).

Example (count the scores of a causal attention computed whole)::

    >>> import torch
    >>> from helpers.attention import TensorRecorder
    >>> q = k = torch.ones(2, 4, 3)
    >>> with TensorRecorder(d=3) as rec:
    ...     scores = q @ k.transpose(-1, -2)
    >>> rec.scores, rec.largest[1]
    (32, (2, 4, 4))
"""

from __future__ import annotations

import math

__all__ = ["zigzag_chunks", "zigzag_positions", "TensorRecorder"]


def zigzag_chunks(rank: int, world_size: int) -> tuple[int, int]:
    """The two chunks of a sequence cut into 2p that rank ``rank`` holds in the zig-zag layout: r and 2p - 1 - r."""
    return rank, 2 * world_size - 1 - rank


def zigzag_positions(rank: int, world_size: int, chunk: int) -> list[int]:
    """The sequence positions of rank ``rank``'s tokens in the zig-zag layout, in the order it holds them.

    >>> zigzag_positions(0, 2, 2)
    [0, 1, 6, 7]
    """
    return [c * chunk + i for c in zigzag_chunks(rank, world_size) for i in range(chunk)]


_MATMULS = ("aten.mm.", "aten.bmm.", "aten.addmm.", "aten.baddbmm.", "aten.matmul.", "aten.dot.")
_SDPA = ("aten._scaled_dot_product",)


class TensorRecorder:
    """A ``TorchDispatchMode`` that notes, while it is active, the largest tensor torch operations create, the
    memory they hold at once, and the attention scores computed.

    ``largest`` is ``(bytes, shape, op)`` of the largest tensor an operation returned that is not a view of
    another; ``scores`` the number of scores computed: the elements of every matrix product that contracts over
    the head width ``d`` (q k^T; p v contracts over keys), and L x S per head of a fused attention call.
    With a ``limit``, ``first_over`` is the first such tensor larger than it, as ``(size, shape, op)``: sizes in
    bytes, or, with ``itemsize``, in numbers of that many bytes (a floating-point tensor counts its elements
    whatever its precision, any other tensor, a boolean mask say, its bytes / ``itemsize``).
    ``live`` and ``peak_live`` are the bytes of storage that tensors created while the recorder is active hold
    now, and held at the most at one moment (a storage counts once, however many tensors share it, until the
    last of them is freed); tensors that existed before count nothing.

    >>> import torch
    >>> q, k = torch.ones(2, 4, 3), torch.ones(2, 3, 5)     # made before: they count nothing
    >>> with TensorRecorder(d=3) as rec:
    ...     s = q @ k
    ...     t = s * 2
    ...     del s, t
    >>> rec.largest[:2], rec.scores, rec.peak_live, rec.live
    ((160, (2, 4, 5)), 40, 320, 0)
    """

    def __init__(self, d: int, limit: int | None = None, *, itemsize: int | None = None) -> None:
        self.d, self.limit, self.itemsize = d, limit, itemsize
        self.largest: tuple[int, tuple, str] = (0, (), "")
        self.first_over: tuple[int, tuple, str] | None = None
        self.scores = 0
        self.live = self.peak_live = 0
        self._storages: dict[int, list[int]] = {}  # storage address -> [bytes, tensors alive on it]
        self._mode = None

    def __enter__(self) -> "TensorRecorder":
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                recorder._note(func, args, out)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    def _size(self, t) -> int:
        """What ``t`` counts against the limit: bytes, or numbers when an ``itemsize`` was given."""
        if self.itemsize is None:
            return t.numel() * t.element_size()
        if t.is_floating_point() or t.is_complex():
            return t.numel()
        return -(-t.numel() * t.element_size() // self.itemsize)

    def _note(self, func, args, out) -> None:
        import torch
        from torch.utils._pytree import tree_flatten

        name = str(func)
        if not getattr(func, "is_view", False):
            schema = getattr(func, "_schema", None)  # an operator's declared returns: in-place ones alias an input
            fresh = schema is None or not any(getattr(r, "alias_info", None) is not None for r in schema.returns)
            for t in tree_flatten(out)[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                size = t.numel() * t.element_size()
                if size > self.largest[0]:
                    self.largest = (size, tuple(t.shape), name)
                counted = self._size(t)
                if self.limit is not None and self.first_over is None and counted > self.limit:
                    self.first_over = (counted, tuple(t.shape), name)
                if fresh and t.numel():
                    self._hold(t)
        if name.startswith(_MATMULS):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            first = tensors[-2] if name.startswith(("aten.addmm.", "aten.baddbmm.")) else tensors[0]
            if first.dim() >= 1 and first.shape[-1] == self.d and isinstance(out, torch.Tensor):
                self.scores += out.numel()
        elif name.startswith(_SDPA):
            q, k = args[0], args[1]
            self.scores += math.prod(q.shape[:-1]) * k.shape[-2]

    def _hold(self, t) -> None:
        """Count ``t``'s storage as live until the last tensor this recorder saw on it is freed."""
        import weakref

        storage = t.untyped_storage()
        key = storage.data_ptr()
        entry = self._storages.get(key)
        if entry is None:
            entry = self._storages[key] = [storage.nbytes(), 0]
            self.live += entry[0]
            self.peak_live = max(self.peak_live, self.live)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._storages[key]
            self.live -= entry[0]
