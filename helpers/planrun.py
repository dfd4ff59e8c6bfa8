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

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .memrec import Peak, SavedBytes, traffic
from .plan import CATEGORIES, Layout, Model
from .shard import Shard, full_weights, local_weights, unit_names
from .zero import SYNC, Unit, nbytes

__all__ = ["measure", "one_process", "Measured", "batch_of", "run_rank", "on_gpu"]

LR = 1e-3


def batch_of(model: Model, seed: int) -> torch.Tensor:
    """A step's token ids, (batch, seq + 1): inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    return torch.randint(0, model.vocab, (model.batch, model.seq + 1), generator=torch.Generator().manual_seed(seed + 1))


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
        self.params.add(sum(nbytes(t) for t in held))
        self.grads.add(sum(nbytes(t) for u in self.units.values() for t in (u.grads or u.leaves)))
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
        return unit.weights()

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
    losses, phases = [], []

    def phase(label, start):
        phases.append((label, start, time.perf_counter()))

    from ._runtime.instrument import current

    inst = current()
    for step in range(steps):
        phases.clear()
        dist.barrier()
        begin = len(inst.events) if inst is not None else 0
        for u in run.units.values():
            u.zero_grads()
        order = _order(layout, stage)
        kept: dict[int, tuple] = {}
        sends, total = [], 0.0
        with run.saved.hooks():
            for kind, i in order:
                began = time.perf_counter()
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
                    phase(f"F{i}", began)
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
                    phase(f"B{i}", began)
            for request in sends:
                request.wait()
        began = time.perf_counter()
        for u in run.units.values():
            u.finish()
        phase("sync", began)
        began = time.perf_counter()
        run.optimizer.step()
        phase("optimizer", began)
        began = time.perf_counter()
        for u in run.units.values():
            u.refresh()
        phase("refresh", began)
        losses.append(total)
        calls = [(e.op, list(e.group) if e.group else None, e.peer, e.nbytes, e.start, e.end, i in SYNC)
                 for i, e in enumerate(inst.events) if i >= begin] if inst is not None else []
        dist.barrier()
    state = sum(s[k].numel() * s[k].element_size() for s in run.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))
    memory = {"parameters": run.params.peak, "gradients": run.grads.peak, "optimizer": state,
              "activations": run.saved.peak}
    return {"memory": memory, "loss": losses[-1] if stage == last and c["tp"] == 0 else None,
            "weights": _local_weights(run), "sync": sorted(SYNC), "phases": phases,
            "calls": calls}


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
    steps: list[dict] = field(default_factory=list, repr=False)   # per rank: the last step's phases and calls

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
    return Measured(layout, [reply["memory"] for reply in result], sent, loss, weights, result.trace,
                    [{"phases": reply["phases"], "calls": reply["calls"]} for reply in result])


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


def on_gpu(model: Model, steps: int = 3, seed: int = 0, device: str = "cuda") -> dict[str, Any]:
    """The whole model trained in float32 on one GPU: the last step's seconds, the peak bytes allocated during
    it, the GPU's name and the FLOP/s it reaches on a large matrix product (TF32 as torch's default leaves it)."""
    weights = {k: torch.nn.Parameter(v.to(device)) for k, v in full_weights(model, seed).items()}
    shard = Shard(model, Layout(precision="fp32"), 0, device=device)
    optimizer = torch.optim.AdamW(weights.values(), lr=LR)
    tokens = batch_of(model, seed).to(device)
    a = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize(device)
    began = time.perf_counter()
    for _ in range(5):
        a @ a
    torch.cuda.synchronize(device)
    rate = 5 * 2 * 4096**3 / (time.perf_counter() - began)
    del a
    seconds = 0.0
    for step in range(steps):
        if step == steps - 1:
            torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
        began = time.perf_counter()
        loss = shard.loss(weights, tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - began
    return {"seconds": seconds, "peak": torch.cuda.max_memory_allocated(device), "flops": rate,
            "gpu": torch.cuda.get_device_name(device), "loss": loss.item()}
