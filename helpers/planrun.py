"""Train a small Llama-style model on CPU ranks under a :class:`~helpers.plan.Layout`, and measure it.

:func:`measure` starts ``layout.world`` ranks, runs ``steps`` training steps of AdamW there, and returns
a :class:`Measured`: for every rank the peak bytes of each memory category, the bytes it sent in the
last step by collective and mesh dimension (from the helpers' trace), the loss, and the weights after
the steps. :func:`one_process` trains the same model on the same data in one process, the reference a
plan is proved against. What each category counts:

- *parameters*: the weights the rank holds: its share after tp and pp, whole (ZeRO 0-2), or its 1/(dp cp)
  shard plus, while a unit computes, that unit gathered whole (ZeRO-3);
- *gradients*: the gradient buffers (whole for ZeRO 0 and 1, the shard for 2 and 3) plus, at the end of a
  unit's backward, that unit's fresh gradients before they are added in or reduce-scattered;
- *optimizer*: AdamW's two moments for what the rank steps (float32; the step counters left out);
- *activations*: what autograd keeps for backward, at the most (:class:`helpers.memrec.SavedBytes`).

A *unit* is what ZeRO gathers and reduces together: the embedding, each layer, the head with the final
norm (:func:`helpers.shard.unit_names`). Every parameter's size must divide by dp x cp when ZeRO shards.

Example (two ranks of tensor parallelism, one step)::

    >>> from helpers.plan import Layout, Model
    >>> m = Model("tiny", vocab=32, hidden=16, layers=2, heads=4, kv_heads=2, ffn=24, seq=8, batch=2)
    >>> run = measure(m, Layout(tp=2, micro_batch=2, precision="fp32"))
    >>> run.memory[0]["parameters"] == run.memory[1]["parameters"]
    True
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .memrec import Peak, SavedBytes, traffic
from .plan import CATEGORIES, Layout, Model
from .shard import LAYER_PARAMS, Shard, full_weights, local_weights, unit_names

__all__ = ["measure", "one_process", "Measured", "batch_of", "run_rank"]

LR = 1e-3
SYNC: set[int] = set()   # positions, in this rank's trace, of its gradient and ZeRO exchanges


def batch_of(model: Model, seed: int) -> torch.Tensor:
    """A step's token ids, (batch, seq + 1): inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    return torch.randint(0, model.vocab, (model.batch, model.seq + 1), generator=torch.Generator().manual_seed(seed + 1))


class _Unit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, unit, *leaves):
        ctx.unit = unit
        return tuple(unit.whole())

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.unit.reduce(grads))


class Unit:
    """One unit's parameters on this rank, held as its ZeRO stage holds them."""

    def __init__(self, names: tuple[str, ...], tensors: list[torch.Tensor], run: "Run") -> None:
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
            run.gathered[SavedBytes.key(whole)] = (self, len(out))
            run.params.add(_nbytes(whole))
            weakref.finalize(whole, run.freed, SavedBytes.key(whole), _nbytes(whole))
            out.append(whole)
        return out

    def regathered(self) -> list[torch.Tensor]:
        if self.cache is None:
            self.cache = self.gather()
        return self.cache

    def reduce(self, grads: tuple[torch.Tensor, ...]) -> list[torch.Tensor | None]:
        run = self.run
        run.grads.moment(sum(_nbytes(g) for g in grads if g is not None))
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


def _nbytes(t: torch.Tensor) -> int:
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


class Run:
    """One rank's side of a measured training run."""

    def __init__(self, model: Model, layout: Layout, rank: int, seed: int) -> None:
        self.model, self.layout, self.rank = model, layout, rank
        self.coords = layout.coords(rank)
        self.groups: dict[str, Any] = {}
        for dims in ("tp", "cp", "dp+cp"):            # every rank makes every group, in the same order
            seen = []
            for r in range(layout.world):
                ranks = layout.group(dims, r)
                if len(ranks) > 1 and ranks not in seen:
                    seen.append(ranks)
                    made = dist.new_group(ranks)
                    if rank in ranks:
                        self.groups[dims] = made
        self.shard_group = self.groups.get("dp+cp")
        self.shard_size = layout.shard_group
        peers = layout.group("dp+cp", rank)
        self.shard_rank = peers.index(rank)
        self.shard = Shard(model, layout, rank, self.groups)
        weights = local_weights(model, layout, self.coords, full_weights(model, seed))
        self.gathered: dict[int, tuple[Unit, int]] = {}
        self.params, self.grads = Peak(), Peak()
        self.units = {name: Unit(names, [weights[n] for n in names], self) for name, names in
                      unit_names(model, layout, self.coords["pp"])}
        held = [t for u in self.units.values() for t in (u.full if u.zero < 3 else u.leaves)]
        self.params.add(sum(_nbytes(t) for t in held))
        self.grads.add(sum(_nbytes(t) for u in self.units.values() for t in (u.grads or u.leaves)))
        self.saved = SavedBytes(self._tokenize, self._resolve)
        self.saved.skip([*held, *self.shard.constants])
        self.optimizer = torch.optim.AdamW([p for u in self.units.values() for p in u.leaves], lr=LR, foreach=False)

    def freed(self, key: int, nbytes: int) -> None:
        self.gathered.pop(key, None)
        self.params.add(-nbytes)

    def _tokenize(self, t: torch.Tensor) -> Any:
        where = self.gathered.get(SavedBytes.key(t))
        if where is None:
            return None
        return (where, t.size(), t.stride(), t.storage_offset())

    def _resolve(self, token: Any) -> torch.Tensor:
        (unit, index), size, stride, offset = token
        return unit.regathered()[index].as_strided(size, stride, offset)

    def weights(self, name: str) -> list[torch.Tensor]:
        unit = self.units[name]
        return list(_Unit.apply(unit, *unit.leaves))

    # -- one micro-batch through this stage ----------------------------------------------

    def forward(self, ids: torch.Tensor, targets: torch.Tensor, received: torch.Tensor | None) -> torch.Tensor:
        sh = self.shard
        x = sh.embed(self.weights("embedding")[0], ids) if received is None else received
        for name in self.units:
            if name.startswith("layers."):
                x = sh.layer(x, *self.weights(name))
        if "head" in self.units:
            norm, out = self.weights("head")
            return sh.head(norm, out, x, targets) / (self.model.tokens)
        return x


def run_rank(rank: int, world_size: int, model: Model, layout: Layout, seed: int = 0, steps: int = 1) -> dict:
    """The rank's side of :func:`measure` (launched by it): ``steps`` steps, the last one between barriers."""
    torch.manual_seed(seed)
    SYNC.clear()
    run = Run(model, layout, rank, seed)
    c, lay = run.coords, layout
    stage, last = c["pp"], layout.pp - 1
    prev = lay.rank_at(**{**c, "pp": stage - 1}) if stage > 0 else None
    nxt = lay.rank_at(**{**c, "pp": stage + 1}) if stage < last else None
    tokens = batch_of(model, seed)
    T = run.shard.T
    rows = (layout.micro_batch * T) // layout.tp
    losses = []
    for step in range(steps):
        dist.barrier()
        for u in run.units.values():
            u.zero_grads()
        order = _order(layout, stage)
        kept: dict[int, tuple] = {}
        sends, total = [], 0.0
        with run.saved.hooks():
            for kind, i in order:
                first = (i * layout.dp + c["dp"]) * layout.micro_batch
                chunk = tokens[first:first + layout.micro_batch, c["cp"] * T:c["cp"] * T + T + 1]
                if kind == "F":
                    received = None
                    if prev is not None:
                        received = torch.empty(rows, model.hidden)
                        dist.recv(received, prev)
                        received.requires_grad_(True)
                    out = run.forward(chunk[:, :-1], chunk[:, 1:], received)
                    if nxt is not None:
                        sends.append(dist.isend(out.detach(), nxt))
                    else:
                        total += out.item()
                    kept[i] = (received, out)
                else:
                    received, out = kept.pop(i)
                    if nxt is None:
                        out.backward()
                    else:
                        grad = torch.empty(rows, model.hidden)
                        dist.recv(grad, nxt)
                        out.backward(grad)
                    if prev is not None:
                        sends.append(dist.isend(received.grad, prev))
                    del received, out
            for request in sends:
                request.wait()
        for u in run.units.values():
            u.finish()
        run.optimizer.step()
        for u in run.units.values():
            u.refresh()
        losses.append(total)
        dist.barrier()
    state = sum(s[k].numel() * s[k].element_size() for s in run.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))
    memory = {"parameters": run.params.peak, "gradients": run.grads.peak, "optimizer": state,
              "activations": run.saved.peak}
    return {"memory": memory, "loss": losses[-1] if stage == last and c["tp"] == 0 else None,
            "weights": _local_weights(run), "sync": sorted(SYNC)}


def _order(layout: Layout, stage: int) -> list[tuple[str, int]]:
    m = layout.microbatches
    if layout.schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(layout.pp - stage - 1, m)
    steady = [x for i in range(m - warm) for x in (("F", warm + i), ("B", i))]
    return [("F", i) for i in range(warm)] + steady + [("B", i) for i in range(m - warm, m)]


def _local_weights(run: Run) -> dict[str, torch.Tensor]:
    out = {}
    for unit in run.units.values():
        whole = unit.full if unit.zero < 3 else unit.gather()
        out.update({n: t.detach().clone() for n, t in zip(unit.names, whole)})
    return out


@dataclass
class Measured:
    """What :func:`measure` found: per rank, memory by category and the last step's traffic; the loss of
    the last step; the whole model's weights after the steps (cut pieces put back together)."""

    layout: Layout
    memory: list[dict[str, int]]
    traffic: list[dict[tuple[str, str], float]]
    loss: float
    weights: dict[str, torch.Tensor] = field(repr=False)
    trace: Any = field(default=None, repr=False)

    def stage_memory(self, stage: int) -> dict[str, int]:
        """The largest of each category over the ranks of ``stage``."""
        ranks = self.layout.stage_ranks(stage)
        return {k: max(self.memory[r][k] for r in ranks) for k in CATEGORIES}


def measure(model: Model, layout: Layout, seed: int = 0, steps: int = 1, **settings: Any) -> Measured:
    """Train ``steps`` steps of ``model`` under ``layout`` on ``layout.world`` fresh CPU ranks and measure them."""
    from .launcher import launch

    if layout.precision != "fp32":
        raise ValueError("CPU ranks train in float32: pass a layout with precision='fp32'")
    if layout.sequences() != model.batch:
        raise ValueError(f"{layout.describe()} trains on {layout.sequences()} sequences a step; the model's batch "
                         f"is {model.batch}")
    settings = {"output": "quiet", "timeout": 120, **settings}
    result = launch(run_rank, layout.world, (model, layout, seed, steps), trace=True, **settings)
    sent = []
    for r in range(layout.world):
        events = result.trace.for_rank(r)
        marks = [i for i, e in enumerate(events) if e.op == "barrier"]
        sync = [i - marks[-2] - 1 for i in result[r]["sync"]]
        sent.append(traffic(events[marks[-2] + 1:marks[-1]], layout, r, sync))
    weights: dict[str, torch.Tensor] = {}
    pieces: dict[str, dict[int, torch.Tensor]] = {}
    for r, reply in enumerate(result):
        c = layout.coords(r)
        if c["dp"] == 0 and c["cp"] == 0:
            for name, t in reply["weights"].items():
                pieces.setdefault(name, {})[c["tp"]] = t
    for name, parts in pieces.items():
        kind = name.rsplit(".", 1)[-1]
        joined = [parts[t] for t in sorted(parts)]
        weights[name] = joined[0] if kind in ("ln1", "ln2", "norm") else torch.cat(joined, 1 if kind in ("wo", "w2") else 0)
    loss = sum(reply["loss"] for reply in result if reply["loss"] is not None)
    return Measured(layout, [reply["memory"] for reply in result], sent, loss, weights, result.trace)


def one_process(model: Model, seed: int = 0, steps: int = 1) -> tuple[float, dict[str, torch.Tensor]]:
    """The same training in this process, whole model and whole batch: (the last step's loss, the weights)."""
    weights = {k: torch.nn.Parameter(v) for k, v in full_weights(model, seed).items()}
    shard = Shard(model, Layout(precision="fp32"), 0)
    optimizer = torch.optim.AdamW(weights.values(), lr=LR, foreach=False)
    tokens = batch_of(model, seed)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = shard.loss(weights, tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        optimizer.step()
    return loss.item(), {k: v.detach() for k, v in weights.items()}
