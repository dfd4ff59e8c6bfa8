"""A model's share on one rank: its pipeline stage's layers, cut for its tensor-parallel index, on its chunk
of every sequence.

:class:`Shard` runs the pieces of :mod:`helpers.llama` as a Llama-style decoder: the embedding (stage 0),
the decoder layers of its stage, and the final norm, head and loss (last stage). Weights are not held
here: each call takes them, so that :mod:`helpers.planrun` can hand over whole weights, ZeRO-3's gathered
ones, or a recomputation's. :func:`full_weights` makes the whole model's weights (the same on every
process for one seed) and :func:`local_weights` cuts one rank's share; :func:`unit_names` lists a stage's
*units*, the groups of parameters ZeRO gathers and reduces together (the embedding, each layer, the head).

Under a layout with ``tp`` > 1 the residual stream between layers holds 1/tp of the tokens (sequence
parallelism); with ``cp`` > 1 each rank holds positions ``c s/cp`` to ``(c + 1) s/cp - 1`` of every
sequence, and attention all-gathers the keys and values.

Example (the whole model on one process)::

    >>> import torch
    >>> from helpers.plan import Layout, Model
    >>> m = Model("tiny", vocab=32, hidden=16, layers=2, heads=4, kv_heads=2, ffn=24, seq=8)
    >>> shard = Shard(m, Layout(precision="fp32"), rank=0)
    >>> ids = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    >>> loss = shard.loss(full_weights(m, seed=0), ids[:, :-1], ids[:, 1:])
    >>> 2.0 < loss.item() < 6.0
    True
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F

from .llama import (Attention, ColumnLinears, CrossEntropy, Embedding, GatherKV, Recompute, RMSNorm, ScatterSeq,
                    SumGrad, plain_attention)
from .plan import Layout, Model

__all__ = ["LAYER_PARAMS", "Shard", "full_weights", "local_weights", "unit_names", "rope_tables"]

#: A decoder layer's parameters, in the order :meth:`Shard.layer` takes them.
LAYER_PARAMS = ("ln1", "wq", "wk", "wv", "wo", "ln2", "w1", "w3", "w2")


def rope_tables(positions: torch.Tensor, d: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of rotary embeddings for ``positions``, each (len, d) (halves rotated, as in Llama)."""
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * freqs[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def unit_names(model: Model, layout: Layout, stage: int) -> list[tuple[str, tuple[str, ...]]]:
    """The stage's units (what ZeRO gathers and reduces together) and their parameters' names."""
    counts = layout.stage_layers(model)
    first = sum(counts[:stage])
    units = [("embedding", ("emb",))] if stage == 0 else []
    units += [(f"layers.{i}", tuple(f"layers.{i}.{n}" for n in LAYER_PARAMS)) for i in range(first, first + counts[stage])]
    if stage == layout.pp - 1:
        units.append(("head", ("norm", "out")))
    return units


def full_weights(model: Model, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every weight of the whole model, the same on every process for ``seed``."""
    h, f, kv, v = model.hidden, model.ffn, model.kv_hidden, model.vocab
    shapes = {"emb": (v, h), "norm": (h,), "out": (v, h)}
    for i in range(model.layers):
        shapes.update({f"layers.{i}.ln1": (h,), f"layers.{i}.wq": (h, h), f"layers.{i}.wk": (kv, h),
                       f"layers.{i}.wv": (kv, h), f"layers.{i}.wo": (h, h), f"layers.{i}.ln2": (h,),
                       f"layers.{i}.w1": (f, h), f"layers.{i}.w3": (f, h), f"layers.{i}.w2": (h, f)})
    out = {}
    for k, (name, shape) in enumerate(shapes.items()):
        g = torch.Generator().manual_seed(seed * 100003 + k)
        if len(shape) == 1:
            out[name] = (1 + 0.1 * torch.randn(shape, generator=g)).to(dtype)
        else:
            out[name] = (torch.randn(shape, generator=g) / math.sqrt(shape[1] if name != "emb" else 1)).to(dtype)
    return out


def local_weights(model: Model, layout: Layout, coords: dict[str, int], full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This rank's share of ``full``: its stage's weights, cut for its tp index (copies)."""
    t, size = coords["tp"], layout.tp
    rows = {"emb": model.vocab, "out": model.vocab, "wq": model.hidden, "wk": model.kv_hidden, "wv": model.kv_hidden,
            "w1": model.ffn, "w3": model.ffn}
    cols = {"wo": model.hidden, "w2": model.ffn}
    out = {}
    for _, names in unit_names(model, layout, coords["pp"]):
        for name in names:
            kind, w = name.rsplit(".", 1)[-1], full[name]
            if kind in rows:
                n = rows[kind] // size
                w = w[t * n:(t + 1) * n]
            elif kind in cols:
                n = cols[kind] // size
                w = w[:, t * n:(t + 1) * n]
            out[name] = w.clone()
    return out


class Shard:
    """Rank ``rank``'s share of ``model`` under ``layout``; ``groups`` maps "tp" and "cp" to this rank's
    process groups (none needed where the degree is 1)."""

    def __init__(self, model: Model, layout: Layout, rank: int, groups: dict[str, Any] | None = None,
                 device: str = "cpu") -> None:
        self.model, self.layout = model, layout
        self.coords = layout.coords(rank)
        self.stage = self.coords["pp"]
        groups = groups or {}
        self.tp, self.cp = layout.tp, layout.cp
        self.tp_group, self.cp_group = groups.get("tp"), groups.get("cp")
        if model.seq % self.cp or model.heads % self.tp or model.kv_heads % self.tp or model.ffn % self.tp \
                or model.vocab % self.tp:
            raise ValueError(f"{layout.describe()} does not divide {model}: cp must divide seq, tp the heads, the "
                             "key/value heads, ffn and vocab")
        self.T = model.seq // self.cp                                   # positions per sequence on this rank
        self.d = model.head_dim
        self.kv_heads = model.kv_heads // self.tp
        self.group = model.heads // model.kv_heads                      # query heads per key/value head
        self.lo = self.coords["tp"] * (model.vocab // self.tp)          # this rank's first vocabulary id
        first = self.coords["cp"] * self.T
        cos, sin = rope_tables(torch.arange(first, first + self.T), self.d)
        self.cos, self.sin = cos[None, :, None, :].to(device), sin[None, :, None, :].to(device)
        hidden = torch.arange(model.seq)[None, :] > torch.arange(first, first + self.T)[:, None]
        self.bias = torch.zeros(self.T, model.seq).masked_fill(hidden, float("-inf")).repeat(self.group, 1).to(device)
        self.scale = 1 / math.sqrt(self.d)
        self.core = "plain" if layout.recompute == "none" else "fused"

    @property
    def constants(self) -> list[torch.Tensor]:
        """Tensors made once that operations keep for backward: not activations."""
        return [self.cos, self.sin, self.bias]

    def embed(self, emb: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Token ids (b, T) -> this rank's rows of the residual stream (b T / tp, h)."""
        x = Embedding.apply(ids.reshape(-1), emb, self.lo)
        return ScatterSeq.apply(x, self.tp_group, self.tp) if self.tp > 1 else x

    def layer(self, x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        """One decoder layer (weights in :data:`LAYER_PARAMS` order); with ``recompute="full"`` only x is kept."""
        run = functools.partial(self._layer, b=x.shape[0] * self.tp // self.T)
        if self.layout.recompute == "full":
            return Recompute.apply(run, x, *weights)
        return run(x, *weights)

    def _layer(self, x, ln1, wq, wk, wv, wo, ln2, w1, w3, w2, *, b):
        t, group = self.tp, self.tp_group
        if t > 1:                                       # the norms see 1/tp of the tokens: sum their gradients
            ln1, ln2 = SumGrad.apply(ln1, group), SumGrad.apply(ln2, group)
        q, k, v = ColumnLinears.apply(RMSNorm.apply(x, ln1), group, t, wq, wk, wv)
        T, d, g, r = self.T, self.d, self.kv_heads, self.group
        q = _rope(q.view(b, T, g * r, d), self.cos, self.sin)
        k = _rope(k.view(b, T, g, d), self.cos, self.sin)
        v = v.view(b, T, g, d)
        if self.cp > 1:                                 # every position's keys and values, from every cp rank
            k, v = GatherKV.apply(torch.stack((k, v)), self.cp_group, self.cp).unbind(0)
        q = q.permute(0, 2, 1, 3).reshape(b, g, r * T, d)          # the r query heads of each key/value head
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if self.core == "plain":
            out = plain_attention(q, k, v, self.bias, self.scale, r)
        else:
            out = Attention.apply(q, k, v, self.bias, self.scale, r)
        y = F.linear(out, wo)
        x = x + (ScatterSeq.apply(y, group, t) if t > 1 else y)
        gate, up = ColumnLinears.apply(RMSNorm.apply(x, ln2), group, t, w1, w3)
        y = F.linear(F.silu(gate) * up, w2)
        return x + (ScatterSeq.apply(y, group, t) if t > 1 else y)

    def head(self, norm: torch.Tensor, out: torch.Tensor, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The sum of the per-token losses of this rank's tokens (targets (b, T))."""
        if self.tp > 1:
            norm = SumGrad.apply(norm, self.tp_group)
        (logits,) = ColumnLinears.apply(RMSNorm.apply(x, norm), self.tp_group, self.tp, out)
        return CrossEntropy.apply(logits, targets.reshape(-1), self.lo, self.tp_group, self.tp).sum()

    def loss(self, weights: dict[str, torch.Tensor], ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of the whole model on one process (a layout of one rank)."""
        if self.layout.world != 1:
            raise ValueError("Shard.loss runs the whole model on one process; use helpers.planrun on ranks")
        x = self.embed(weights["emb"], ids)
        for i in range(self.model.layers):
            x = self.layer(x, *(weights[f"layers.{i}.{n}"] for n in LAYER_PARAMS))
        return self.head(weights["norm"], weights["out"], x, targets) / targets.numel()
