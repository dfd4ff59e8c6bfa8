"""Lesson 12's plan proved with torch's own APIs: DTensor tensor parallelism and FSDP2 on a 2D mesh.

:func:`measure_torch` trains :class:`helpers.llama_modules.Llama` (the weights of
:func:`helpers.shard.full_weights`, the batches of :func:`helpers.planrun.batch_of`, AdamW as
:func:`helpers.planrun.one_process` sets it) on ``dp x tp`` CPU ranks: a ``("dp", "tp")`` device mesh,
``parallelize_module`` with :func:`helpers.llama_modules.tensor_parallel_plan` over "tp", then
``fully_shard`` on every layer and on the whole model over "dp" (FSDP2: ZeRO-3). It returns a
:class:`TorchMeasured`: the last step's loss, the weights gathered whole, and per rank the bytes of its
local shards by category and the bytes it sent in the last step by collective and mesh dimension (the
helpers' trace sees DTensor's and FSDP2's collectives).

What is measured differs from :func:`helpers.planrun.measure`: the memory is what a rank holds *between*
steps (its parameter shards, its gradient shards, AdamW's two moments), not the peak within one; a layer's
all-gathered weights and the activations autograd keeps live inside torch and are not counted here.

:func:`missing` says why this torch cannot run it on CPU ranks, or None when it can.

Example (4 ranks, three steps; the same loss as one process)::

    >>> from helpers.plan import Model
    >>> from helpers.planrun import one_process
    >>> m = Model("tiny", vocab=32, hidden=16, layers=2, heads=4, kv_heads=2, ffn=24, seq=8, batch=4)
    >>> run = measure_torch(m, dp=2, tp=2, steps=3)
    >>> abs(run.loss - one_process(m, steps=3)[0]) < 1e-4
    True

AdamW's 8 bytes a parameter, over 4 ranks, except the 5 norm scales, which each tp rank holds whole::

    >>> run.memory[0]["optimizer"] == 8 * (m.num_params() - 5 * m.hidden) // 4 + 8 * 5 * m.hidden // 2
    True
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .llama_modules import Llama, tensor_parallel_plan
from .memrec import traffic
from .plan import Layout, Model
from .planrun import LR, batch_of
from .shard import full_weights

__all__ = ["measure_torch", "missing", "TorchMeasured", "torch_rank", "FSDP2_SINCE"]

#: The oldest torch whose FSDP2 averages gradients right on CPU ranks over gloo (lesson 9's FSDP2_SINCE).
FSDP2_SINCE = (2, 9)


def _torch_file(path: str) -> str:
    """The text of one of the installed torch's source files ("" if it has none): reading it imports nothing."""
    file = os.path.join(os.path.dirname(torch.__file__), *path.split("/"))
    return open(file).read() if os.path.exists(file) else ""


def missing() -> str | None:
    """Why this torch cannot train the model with DTensor tensor parallelism and FSDP2 on CPU ranks (None: it can)."""
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if version < FSDP2_SINCE:
        return (f"torch {torch.__version__} is older than {FSDP2_SINCE[0]}.{FSDP2_SINCE[1]}: its FSDP2 (fully_shard) "
                "on CPU ranks either is missing or sums the gradients over gloo where it should average them "
                "(lesson 9)")
    parallel = _torch_file("distributed/tensor/parallel/__init__.py")
    for name in ("SequenceParallel", "PrepareModuleInput", "loss_parallel"):
        if name not in parallel:
            return f"torch {torch.__version__}'s torch.distributed.tensor.parallel has no {name}"
    return None


def torch_rank(rank: int, world_size: int, model: Model, dp: int, tp: int, seed: int = 0, steps: int = 3) -> dict:
    """One rank of :func:`measure_torch`: ``steps`` AdamW steps, each between barriers (the trace is cut there)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    net = Llama(model).load(full_weights(model, seed))           # every rank starts whole, then keeps its shards
    parallelize_module(net, mesh["tp"], tensor_parallel_plan(model))
    for layer in net.layers:
        fully_shard(layer, mesh=mesh["dp"])                      # one unit per layer: gathered just before it runs
    fully_shard(net, mesh=mesh["dp"])                            # the root: the embedding, the final norm, the head
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR, foreach=False)
    tokens = batch_of(model, seed)
    share = model.batch // dp
    d = mesh.get_local_rank("dp")
    mine = tokens[d * share:(d + 1) * share]                     # this replica's sequences, whole on every tp rank
    losses = []
    for _ in range(steps):
        dist.barrier()
        optimizer.zero_grad()
        with loss_parallel():                                    # the logits stay split over the vocabulary
            loss = net.loss(mine[:, :-1], mine[:, 1:])
            loss.backward()
        optimizer.step()
        dist.barrier()
        losses.append(loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item())

    def local(t: Any) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    memory = {"parameters": sum(local(p) for p in net.parameters()),
              "gradients": sum(local(p.grad) for p in net.parameters() if p.grad is not None),
              "optimizer": sum(local(s[k]) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))}
    weights = net.weights()                                      # a collective: every rank gathers every weight
    placements = {name: str(p.placements) for name, p in net.named_parameters() if name.startswith("layers.0.")}
    dist.barrier()
    return {"loss": losses[-1], "memory": memory, "weights": weights if rank == 0 else None, "placements": placements}


@dataclass
class TorchMeasured:
    """What :func:`measure_torch` found: the last step's loss (averaged over the dp replicas), the whole weights,
    and per rank its shards' bytes by category and the last step's traffic by (collective, mesh dimension)."""

    layout: Layout
    loss: float
    memory: list[dict[str, int]]
    traffic: list[dict[tuple[str, str], float]]
    placements: dict[str, str] = field(repr=False)
    weights: dict[str, torch.Tensor] = field(repr=False)
    calls: list[list[tuple[str, str, int]]] = field(default_factory=list, repr=False)   # per rank: (op, dim, bytes)


def measure_torch(model: Model, dp: int = 2, tp: int = 2, seed: int = 0, steps: int = 3, **settings: Any) -> TorchMeasured:
    """Train ``model`` for ``steps`` steps on ``dp x tp`` fresh CPU ranks with DTensor tp and FSDP2 over dp."""
    from .launcher import launch

    reason = missing()
    if reason:
        raise RuntimeError(f"{reason}; the course's own pieces (helpers.planrun.measure) run on it instead")
    if model.batch % dp:
        raise ValueError(f"dp={dp} must divide the model's batch of {model.batch} sequences")
    layout = Layout(dp=dp, tp=tp, zero=3, micro_batch=model.batch // dp, precision="fp32")   # ranks: dp-major
    settings = {"output": "quiet", "timeout": 120, **settings}
    result = launch(torch_rank, dp * tp, (model, dp, tp, seed, steps), trace=True, **settings)
    sent, calls = [], []
    for r in range(layout.world):
        events = result.trace.for_rank(r)
        marks = [i for i, e in enumerate(events) if e.op == "barrier"]
        step = events[marks[-3] + 1:marks[-2]]                   # between the last step's two barriers
        sent.append(traffic(step, layout, r))
        calls.append([(e.op, layout.dims_of(list(e.group) if e.group else list(range(layout.world))), e.nbytes or 0)
                      for e in step])
    loss = sum(reply["loss"] for reply in result) / len(result)  # every tp rank of a replica has its replica's loss
    return TorchMeasured(layout, loss, [reply["memory"] for reply in result], sent, result[0]["placements"],
                         result[0]["weights"], calls)
