"""Lesson 12's small Llama-style model as plain ``nn.Module``s, for torch's own parallel APIs.

:mod:`helpers.llama` writes the model as autograd functions that do their own communication, so that
each rank's memory and traffic can be counted piece by piece. torch's tensor parallelism
(``parallelize_module``) and FSDP2 (``fully_shard``) work the other way round: they take an ordinary
model made of ``nn.Linear``, ``nn.Embedding`` and norm modules and decide the communication
themselves. :class:`Llama` is that ordinary model: the same arithmetic as
:meth:`helpers.shard.Shard.loss` (RMSNorm, rotary embeddings, grouped-query causal attention, a SwiGLU
MLP, an untied head), with every weight a parameter of a named submodule.

- :meth:`Llama.load` copies in the weights of :func:`helpers.shard.full_weights` (names such as
  ``"layers.0.wq"``), and :meth:`Llama.weights` gives them back under the same names, whole
  (DTensor parameters are gathered with ``full_tensor``);
- :func:`tensor_parallel_plan` is the plan ``parallelize_module`` takes: column- and row-parallel
  linears in attention and the MLP, sequence parallelism for the norms, the embedding and the head
  split over the vocabulary, as torchtitan lays out its Llama.

The attention works on whatever heads its linears hand it (``-1`` in the reshapes): whole on one
process, this rank's 1/tp of them after ``ColwiseParallel``.

Example (one process: the same loss as the course's own pieces, on the same weights)::

    >>> import torch
    >>> from helpers.plan import Layout, Model
    >>> from helpers.shard import Shard, full_weights
    >>> m = Model("tiny", vocab=32, hidden=16, layers=2, heads=4, kv_heads=2, ffn=24, seq=8, batch=2)
    >>> ids = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    >>> net = Llama(m).load(full_weights(m, seed=0))
    >>> ours = Shard(m, Layout(precision="fp32"), rank=0).loss(full_weights(m, seed=0), ids[:, :-1], ids[:, 1:])
    >>> torch.allclose(net.loss(ids[:, :-1], ids[:, 1:]), ours, atol=1e-6)
    True
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .llama import EPS
from .plan import Model
from .shard import rope_tables

__all__ = ["Llama", "RMSNorm", "tensor_parallel_plan", "PATHS"]

#: Where each of :func:`helpers.shard.full_weights`'s weights lives in :class:`Llama` (the rest as named).
PATHS = {"wq": "attention.wq", "wk": "attention.wk", "wv": "attention.wv", "wo": "attention.wo",
         "w1": "mlp.w1", "w3": "mlp.w3", "w2": "mlp.w2"}


def _key(name: str) -> str:
    """``"layers.0.wq"`` -> ``"layers.0.attention.wq.weight"`` (the state-dict key of that weight)."""
    *prefix, kind = name.split(".")
    return ".".join([*prefix, PATHS.get(kind, kind), "weight"])


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dimension, in plain operations (DTensor shards them)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


class Rotary:
    """The rotary tables and the causal mask, shared by every layer (plain tensors: nothing to shard)."""

    def __init__(self, model: Model) -> None:
        cos, sin = rope_tables(torch.arange(model.seq), model.head_dim)
        self.cos, self.sin = cos[None, :, None, :], sin[None, :, None, :]
        self.mask = torch.ones(model.seq, model.seq, dtype=torch.bool).triu(1)     # True above the diagonal

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * self.cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * self.sin


class Attention(nn.Module):
    """Grouped-query causal attention; query head j reads key/value head j // (heads // kv_heads)."""

    def __init__(self, model: Model, rotary: Rotary) -> None:
        super().__init__()
        h, kv = model.hidden, model.kv_hidden
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(h, h, bias=False), nn.Linear(h, kv, bias=False),
                                              nn.Linear(h, kv, bias=False), nn.Linear(h, h, bias=False))
        self.d, self.group, self.rotary = model.head_dim, model.heads // model.kv_heads, rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.rotary(self.wq(x).view(b, s, -1, self.d)).transpose(1, 2)         # (b, heads here, s, d)
        k = self.rotary(self.wk(x).view(b, s, -1, self.d)).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.d).transpose(1, 2)
        k, v = k.repeat_interleave(self.group, 1), v.repeat_interleave(self.group, 1)
        scores = (q @ k.transpose(-1, -2)) * self.d ** -0.5
        probs = torch.softmax(scores.masked_fill(self.rotary.mask, float("-inf")), dim=-1)
        return self.wo((probs @ v).transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        h, f = model.hidden, model.ffn
        self.w1, self.w3, self.w2 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """One decoder layer: ``x + attention(ln1(x))``, then ``+ mlp(ln2(.))``."""

    def __init__(self, model: Model, rotary: Rotary) -> None:
        super().__init__()
        self.ln1, self.attention = RMSNorm(model.hidden), Attention(model, rotary)
        self.ln2, self.mlp = RMSNorm(model.hidden), MLP(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Llama(nn.Module):
    """The whole small model: ids (b, s) -> logits (b, s, vocab)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.spec = model
        rotary = Rotary(model)
        self.emb = nn.Embedding(model.vocab, model.hidden)
        self.layers = nn.ModuleList(Block(model, rotary) for _ in range(model.layers))
        self.norm = RMSNorm(model.hidden)
        self.out = nn.Linear(model.hidden, model.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.out(self.norm(x))

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy over every token of ``ids``."""
        return F.cross_entropy(self(ids).flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def load(self, weights: dict[str, torch.Tensor]) -> "Llama":
        """Copy in ``weights`` (:func:`helpers.shard.full_weights`'s names); call before sharding. Returns self."""
        state = {_key(name): w for name, w in weights.items()}
        missing = sorted(set(self.state_dict()) ^ set(state))
        if missing:
            raise KeyError(f"the weights and the model differ on {missing}: pass full_weights of the same Model")
        self.load_state_dict(state)
        return self

    def weights(self) -> dict[str, torch.Tensor]:
        """Every weight, whole, under :func:`helpers.shard.full_weights`'s names (DTensors gathered: on ranks,
        every rank must call this)."""
        names = {_key(name): name for name in _names(self.spec)}
        out = {}
        for key, p in self.named_parameters():
            whole = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[names[key]] = whole.detach().clone()
        return out


def _names(model: Model) -> list[str]:
    layer = ("ln1", "wq", "wk", "wv", "wo", "ln2", "w1", "w3", "w2")
    return ["emb", "norm", "out"] + [f"layers.{i}.{n}" for i in range(model.layers) for n in layer]


def tensor_parallel_plan(model: Model, loss_parallel: bool = True) -> dict[str, Any]:
    """``parallelize_module``'s plan for :class:`Llama` over a "tp" mesh: between layers the residual stream
    holds 1/tp of each sequence's positions (``Shard(1)``: sequence parallelism, the norms' weights whole);
    attention and the MLP gather the positions once, split their heads or features (column-parallel
    wq, wk, wv, w1, w3) and reduce-scatter back (row-parallel wo, w2). The embedding and the head are split
    over the vocabulary; with ``loss_parallel`` the logits stay split (use ``torch.distributed.tensor.parallel.
    loss_parallel`` around the loss), else they are gathered whole on every rank."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    gather = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
    plan: dict[str, Any] = {
        "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1) if loss_parallel else Replicate(),
                               use_local_output=not loss_parallel),
    }
    for i in range(model.layers):
        plan.update({f"layers.{i}.ln1": SequenceParallel(), f"layers.{i}.ln2": SequenceParallel(),
                     f"layers.{i}.attention": PrepareModuleInput(**gather),
                     f"layers.{i}.mlp": PrepareModuleInput(**gather),
                     **{f"layers.{i}.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")},
                     **{f"layers.{i}.mlp.{w}": ColwiseParallel() for w in ("w1", "w3")},
                     f"layers.{i}.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                     f"layers.{i}.mlp.w2": RowwiseParallel(output_layouts=Shard(1))})
    return plan
