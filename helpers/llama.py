"""A small Llama-style transformer whose every piece says exactly what it keeps for backward.

Lesson 12 measures a training step's memory and traffic on CPU ranks and sets them beside a plan,
so the model is written to be counted: each piece that keeps tensors for backward is a
``torch.autograd.Function`` (or one plain torch operation) whose saved tensors are listed here,
and each collective is one call on one mesh dimension's group. The pieces:

- :class:`RMSNorm` keeps its input and one 1/rms per token (a float32 statistic);
- :class:`Attention` (the core, recomputed in backward from the log-sum-exp, as fused kernels do:
  lesson 11) keeps q, k, v, its output and one log-sum-exp per query and head; with
  ``recompute="none"`` the core is plain torch operations that keep the probabilities instead;
- :class:`Embedding` and :class:`CrossEntropy` are split over the vocabulary (tensor parallel):
  the embedding keeps the token ids, the loss its softmax (float32) and the targets;
- :class:`ColumnLinears` are the column-parallel linears after a norm: they all-gather the tokens over
  ``tp`` and keep only this rank's 1/tp of them (gathered again in backward, as Megatron-LM does);
  :class:`ScatterSeq` reduce-scatters a row-parallel linear's partial sums (all-gather in backward);
  :class:`GatherSeq` is the plain all-gather (lesson 10), :class:`GatherKV` all-gathers keys
  and values over the ``cp`` group (reduce-scatter in backward, Llama 3's way of doing context
  parallelism), :class:`SumGrad` sums a replicated weight's gradient over ``tp``;
- :class:`Recompute` keeps only a layer's input (and weights) and runs the layer again in backward
  (``recompute="full"``).

:mod:`helpers.shard` assembles them into a decoder layer on one rank's share; :mod:`helpers.planrun`
trains with it.

Example (the core keeps its log-sum-exp, not the probabilities)::

    >>> import torch
    >>> q, k, v = (torch.randn(1, 1, 4, 8, requires_grad=True) for _ in range(3))
    >>> out = Attention.apply(q, k, v, torch.zeros(4, 4), 8 ** -0.5, 1)
    >>> out.shape, torch.allclose(out, torch.softmax(q @ k.transpose(-1, -2) * 8 ** -0.5, -1)[0, 0] @ v[0, 0])
    (torch.Size([4, 8]), True)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F


__all__ = ["RMSNorm", "Attention", "plain_attention", "Embedding", "CrossEntropy", "ColumnLinears", "GatherSeq",
           "ScatterSeq",
           "GatherKV", "SumGrad", "Recompute"]

EPS = 1e-6


def _up(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least float32 (16-bit numbers widened; float32 and float64 as they are)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _gather_rows(x: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """Every rank's ``x`` stacked along dim 0, in rank order (one all-gather)."""
    out = x.new_empty((size * x.shape[0], *x.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(out, x.contiguous(), group=group)
    return out


def _scatter_rows(x: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """Slice r of the sum over the ranks of ``x`` along dim 0, on rank r (one reduce-scatter)."""
    out = x.new_empty((x.shape[0] // size, *x.shape[1:]))
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, x.contiguous(), group=group)
    return out


class ColumnLinears(torch.autograd.Function):
    """``x`` (this rank's 1/tp of the tokens) all-gathered over tp, times each weight: Megatron's column-parallel
    linears under sequence parallelism. Keeps the shard, not the gathered tokens: backward gathers them again
    (a second all-gather), and reduce-scatters the input's gradient."""

    @staticmethod
    def forward(ctx, x, group, size, *weights):
        ctx.group, ctx.size = group, size
        ctx.save_for_backward(x, *weights)
        whole = _gather_rows(x, group, size) if size > 1 else x
        return tuple(whole @ w.t() for w in weights)

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        whole = _gather_rows(x, ctx.group, ctx.size) if ctx.size > 1 else x
        d_whole = sum(g @ w for g, w in zip(grads, weights))
        d_x = _scatter_rows(d_whole, ctx.group, ctx.size) if ctx.size > 1 else d_whole
        return (d_x, None, None, *(g.t() @ whole for g in grads))


class GatherSeq(torch.autograd.Function):
    """Sequence parallel to tensor parallel: all-gather the tokens over tp; backward reduce-scatters."""

    @staticmethod
    def forward(ctx, x, group, size):
        ctx.group, ctx.size = group, size
        return _gather_rows(x, group, size)

    @staticmethod
    def backward(ctx, grad):
        return _scatter_rows(grad, ctx.group, ctx.size), None, None


class ScatterSeq(torch.autograd.Function):
    """Tensor parallel to sequence parallel: reduce-scatter the partial sums over tp; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group, size):
        ctx.group, ctx.size = group, size
        return _scatter_rows(x, group, size)

    @staticmethod
    def backward(ctx, grad):
        return _gather_rows(grad, ctx.group, ctx.size), None, None


class GatherKV(torch.autograd.Function):
    """Keys and values of the whole sequence from every cp rank's chunk: ``kv`` (2, b, T, g, d) -> (2, b, cp T, g, d).
    Backward reduce-scatters each rank's share of the gradient back."""

    @staticmethod
    def forward(ctx, kv, group, size):
        ctx.group, ctx.size = group, size
        whole = _gather_rows(kv.movedim(2, 0), group, size)        # (cp T, 2, b, g, d), chunks in rank order
        return whole.movedim(0, 2)

    @staticmethod
    def backward(ctx, grad):
        return _scatter_rows(grad.movedim(2, 0), ctx.group, ctx.size).movedim(0, 2), None, None


class SumGrad(torch.autograd.Function):
    """A weight every tp rank holds whole, used on its own 1/tp of the tokens: backward sums its gradient."""

    @staticmethod
    def forward(ctx, w, group):
        ctx.group = group
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class RMSNorm(torch.autograd.Function):
    """``x / rms(x) * w`` over the last dimension; keeps x, w and one float32 1/rms per row."""

    @staticmethod
    def forward(ctx, x, w):
        rstd = torch.rsqrt(_up(x).pow(2).mean(-1, keepdim=True) + EPS)
        ctx.save_for_backward(x, w, rstd)
        return (_up(x) * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, grad):
        x, w, rstd = ctx.saved_tensors
        xhat = _up(x) * rstd
        dw = (_up(grad) * xhat).sum(0).to(w.dtype)
        dxhat = _up(grad) * _up(w)
        dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        return dx.to(x.dtype), dw


def _to_rows(o: torch.Tensor, r: int) -> torch.Tensor:
    """(b, g, r T, d) -> (b T, g r d): each token's heads side by side (a copy)."""
    b, g, rt, d = o.shape
    t = rt // r
    return o.reshape(b, g * r, t, d).transpose(1, 2).reshape(b * t, g * r * d)


def _from_rows(x: torch.Tensor, b: int, g: int, r: int, d: int) -> torch.Tensor:
    """(b T, g r d) -> (b, g, r T, d)."""
    t = x.shape[0] // b
    return x.reshape(b, t, g * r, d).transpose(1, 2).reshape(b, g, r * t, d)


class Attention(torch.autograd.Function):
    """Attention of q (b, g, r T, d) over k, v (b, g, S, d); ``bias`` (r T, S) is added to the scores (0 or -inf).

    Returns the output laid out for the projection, (b T, g r d), and keeps it, q, k, v and one float32
    log-sum-exp per query row: backward rebuilds the probabilities from them, as fused kernels do."""

    @staticmethod
    def forward(ctx, q, k, v, bias, scale, r):
        scores = _up(q @ k.transpose(-1, -2)) * scale + bias
        lse = torch.logsumexp(scores, dim=-1)
        out = _to_rows(torch.exp(scores - lse[..., None]).to(v.dtype) @ v, r)
        ctx.scale, ctx.r = scale, r
        ctx.save_for_backward(q, k, v, bias, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, bias, out, lse = ctx.saved_tensors
        b, g, _, d = q.shape
        d_out = _up(_from_rows(grad, b, g, ctx.r, d))
        delta = (d_out * _up(_from_rows(out, b, g, ctx.r, d))).sum(-1, keepdim=True)
        p = torch.exp(_up(q @ k.transpose(-1, -2)) * ctx.scale + bias - lse[..., None])
        dv = p.transpose(-1, -2) @ d_out
        ds = p * (d_out @ _up(v).transpose(-1, -2) - delta) * ctx.scale
        dq, dk = ds @ _up(k), ds.transpose(-1, -2) @ _up(q)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def plain_attention(q, k, v, bias, scale, r):
    """The same attention as plain torch operations: they keep the probabilities (r T x S per head group)."""
    probs = torch.softmax((q * scale) @ k.transpose(-1, -2) + bias, dim=-1)
    return _to_rows(probs @ v, r)


class Embedding(torch.autograd.Function):
    """This rank's rows ``lo`` to ``lo + V_l`` of the embedding; other ids give zeros (summed over tp later).
    Keeps the ids (int64), not the weight."""

    @staticmethod
    def forward(ctx, ids, w, lo):
        local = ids - lo
        inside = (local >= 0) & (local < w.shape[0])
        local = torch.where(inside, local, torch.full_like(local, -1))
        ctx.shape = w.shape
        ctx.save_for_backward(local)
        return F.embedding(local.clamp(min=0), w) * inside[:, None].to(w.dtype)

    @staticmethod
    def backward(ctx, grad):
        (local,) = ctx.saved_tensors
        keep = local >= 0
        dw = grad.new_zeros(ctx.shape).index_add_(0, local[keep], grad[keep])
        return None, dw, None


class CrossEntropy(torch.autograd.Function):
    """Per-token loss from logits split over the vocabulary (this rank holds ids ``lo`` to ``lo + V_l``):
    three all-reduces over tp (the max, the sum of exponentials, the target's logit). Keeps the float32
    softmax of its own columns and the targets (int64)."""

    @staticmethod
    def forward(ctx, logits, targets, lo, group, size):
        logits = _up(logits)
        top = logits.max(-1).values
        if size > 1:
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        exp = torch.exp(logits - top[:, None])
        total = exp.sum(-1)
        local = targets - lo
        inside = (local >= 0) & (local < logits.shape[1])
        local = torch.where(inside, local, torch.full_like(local, -1))
        picked = logits.gather(1, local.clamp(min=0)[:, None])[:, 0] * inside
        if size > 1:
            dist.all_reduce(total, group=group)
            dist.all_reduce(picked, group=group)
        probs = exp.div_(total[:, None])
        ctx.save_for_backward(probs, local)
        return torch.log(total) + top - picked

    @staticmethod
    def backward(ctx, grad):
        probs, local = ctx.saved_tensors
        d = probs * grad[:, None]
        rows = (local >= 0).nonzero()[:, 0]
        d[rows, local[rows]] -= grad[rows]
        return d, None, None, None, None


class Recompute(torch.autograd.Function):
    """``run(x, *weights)`` without keeping anything but x (and the weights); run again in backward."""

    @staticmethod
    def forward(ctx, run, x, *weights):
        ctx.run = run
        ctx.save_for_backward(x, *weights)
        with torch.no_grad():
            return run(x, *weights)

    @staticmethod
    def backward(ctx, grad):
        x, *weights = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        weights = [w.detach().requires_grad_(True) for w in weights]
        with torch.enable_grad():
            out = ctx.run(x, *weights)
        torch.autograd.backward(out, grad)
        return (None, x.grad, *(w.grad for w in weights))
