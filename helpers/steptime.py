"""A training step's time, predicted from a plan: compute at a FLOP rate, collectives on the cost model.

:func:`predict` puts a layout's pieces on a clock. It takes the plan's two halves as functions (the
learner's ``plan_memory`` and ``plan_traffic`` of lesson 12, or the course's) and adds what the plan
does not say, the arithmetic:

- **compute**: each micro-batch on a stage does 2 FLOPs per weight per token for the matrix products
  of its layers (and of the head on the last stage) plus 4 s h / tp per token for attention's two
  products, forward; backward twice that; recomputation adds the attention core's scores again
  ("selective", as the fused kernel does) or the whole layer's forward ("full"). A GPU runs them at
  ``efficiency`` x its peak FLOP/s (CPU ranks at a measured rate);
- **tensor and context parallel collectives** sit on the critical path of every micro-batch;
- **the pipeline** runs ``microbatches + pp - 1`` slots of the slowest stage's micro-batch (the bubble
  is the pp - 1 extra slots, lesson 10), plus the 2 (pp - 1) hops of the fill and the drain;
- **gradient and ZeRO exchanges** overlap the step's compute, all but one unit's share: what is left
  after that is exposed (``exposed_dp``);
- **MFU**: the model's FLOPs per step (torchtitan's count, recomputation not counted) over the step time
  and every GPU's peak.

Each collective's time is :func:`helpers.costmodel.seconds` on the link its group uses: inside a node
while the group's ranks share one (ranks are numbered node by node over the layout's ``order``), else
between nodes; ``links`` replaces that with one link per collective (a fit of this machine's gloo).

Example, with ``plan_memory`` and ``plan_traffic`` your answers to Exercises 12.1 and 12.2 (the course's
tests pass the instructor's, ``autograder.answers.lesson12``, which learners do not get)::

    >>> from helpers.plan import LLAMA3_8B, Layout, h100_cluster
    >>> plan_memory, plan_traffic = your_plan_memory, your_plan_traffic  # doctest: +SKIP
    >>> p = predict(LLAMA3_8B.with_(batch=64), Layout(dp=8, tp=8, zero=3, microbatches=8), h100_cluster(64),
    ...             plan_memory, plan_traffic, efficiency=0.6)
    >>> p.fits, round(p.mfu, 2)
    (True, 0.28)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .costmodel import seconds
from .plan import CATEGORIES, Cluster, Layout, Link, Model

__all__ = ["predict", "Prediction", "stage_flops", "link_of"]

PER_STEP_DIMS = ("dp", "dp+cp")


def stage_flops(model: Model, layout: Layout, stage: int) -> dict[str, float]:
    """FLOPs one rank of ``stage`` computes for one micro-batch: forward, backward, recomputation."""
    h, t, s = model.hidden, layout.tp, model.seq
    tokens = layout.micro_batch * s / layout.cp
    matmul = (2 * h * h + 2 * h * model.kv_hidden + 3 * h * model.ffn) / t
    attention = 4 * s * h / t
    layers = layout.stage_layers(model)[stage]
    forward = tokens * layers * (2 * matmul + attention)
    if stage == layout.pp - 1:
        forward += tokens * 2 * model.vocab / t * h
    again = {"none": 0.0, "selective": tokens * layers * attention / 2,
             "full": tokens * layers * (2 * matmul + attention * 1.5)}[layout.recompute]
    return {"forward": forward, "backward": 2 * forward, "recompute": again}


def link_of(layout: Layout, dims: str, cluster: Cluster) -> Link:
    """The link a group of ``dims`` uses: inside a node when all of rank 0's group sits in one node."""
    return cluster.intra if layout.extent(dims)[1] < cluster.gpus_per_node else cluster.inter


@dataclass
class Prediction:
    """A layout's predicted step on a cluster (seconds; memory in bytes per rank of each stage)."""

    step: float
    compute: float                 # the slowest stage's compute for one micro-batch
    exposed_comm: float            # tp and cp collectives on the critical path, per step, slowest stage
    bubble: float                  # the pipeline's fill and drain: pp - 1 micro-batch slots, plus the hops
    exposed_dp: float              # gradient and ZeRO exchanges not hidden behind compute
    mfu: float
    memory: list[dict[str, float]]
    fits: bool
    overflow: tuple[int, int, str, float] | None = None   # (rank, stage, largest category, bytes over)
    per_stage: list[dict[str, float]] = field(default_factory=list)
    efficiency: float = 1.0        # the share of peak FLOP/s the compute ran at (1.0: an upper bound)

    def summary(self) -> str:
        head = (f"step {self.step * 1e3:.1f} ms: compute {self.compute * 1e3:.2f} ms per micro-batch, exposed "
                f"tp/cp {self.exposed_comm * 1e3:.1f} ms, bubble {self.bubble * 1e3:.1f} ms, exposed dp "
                f"{self.exposed_dp * 1e3:.1f} ms, MFU {self.mfu:.0%}"
                + (" (matmuls at peak: an upper bound)" if self.efficiency >= 1 else
                   f" (matmuls at {self.efficiency:.0%} of peak)"))
        if self.overflow:
            rank, stage, category, over = self.overflow
            head += (f"; does not fit: rank {rank} (stage {stage}) is {over / 2**30:.1f} GiB over, "
                     f"{category} the largest part")
        return head


def predict(model: Model, layout: Layout, cluster: Cluster, plan_memory: Callable, plan_traffic: Callable,
            efficiency: float = 1.0, links: dict[str, Link] | None = None, flops: float | None = None) -> Prediction:
    """The step time of ``layout`` on ``cluster`` with the plan's memory and traffic (see the module docstring).

    ``flops`` replaces ``cluster.flops * efficiency`` (a measured rate); ``links`` gives one link per
    collective for every group (this machine's fitted gloo)."""
    rate = flops or cluster.flops * efficiency
    memory, traffic = plan_memory(model, layout), plan_traffic(model, layout)
    m, pp = layout.microbatches, layout.pp

    def time_of(op: str, dims: str, nbytes: float) -> float:
        link = (links or {}).get(op) or link_of(layout, dims, cluster)
        p = layout.extent(dims)[0] if op != "send" else 2
        return seconds(op, p, nbytes, link)

    stages = []
    for stage in range(pp):
        f = stage_flops(model, layout, stage)
        compute = sum(f.values()) / rate
        per_mb = sum(time_of(op, d, b) for (op, d), b in traffic[stage].items() if d in ("tp", "cp")) / m
        hop = sum(time_of(op, d, b) for (op, d), b in traffic[stage].items() if d == "pp") / max(1, 2 * m)
        dp = sum(time_of(op, d, b) for (op, d), b in traffic[stage].items() if d in PER_STEP_DIMS)
        units = layout.stage_layers(model)[stage] + (stage == 0) + (stage == pp - 1)
        hidden = m * f["backward"] / rate
        exposed = max(dp / units, dp - hidden) if dp else 0.0
        stages.append({"compute": compute, "comm": per_mb, "hop": hop, "dp": dp, "exposed_dp": exposed})
    slot = max(s["compute"] + s["comm"] for s in stages)
    hops = 2 * (pp - 1) * max(s["hop"] for s in stages)
    exposed_dp = max(s["exposed_dp"] for s in stages)
    step = (m + pp - 1) * slot + hops + exposed_dp
    mfu = model.flops_per_token() * layout.sequences() * model.seq / (step * layout.world * cluster.flops)
    worst = max(range(pp), key=lambda s: sum(memory[s][k] for k in CATEGORIES))
    need = sum(memory[worst][k] for k in CATEGORIES)
    overflow = None
    if need > cluster.memory:
        category = max(CATEGORIES, key=lambda k: memory[worst][k])
        overflow = (layout.stage_ranks(worst)[0], worst, category, need - cluster.memory)
    return Prediction(step, max(s["compute"] for s in stages), m * max(s["comm"] for s in stages),
                      (pp - 1) * slot + hops, exposed_dp, mfu, memory, overflow is None, overflow, stages,
                      rate / cluster.flops)
