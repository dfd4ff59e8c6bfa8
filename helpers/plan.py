"""The words a training plan is written in: a model, a layout over ranks, a cluster.

Lesson 12 plans a training run. Three objects describe what is planned; the planner itself
(memory and traffic per rank) is the learner's to write:

- :class:`Model`: a Llama-style decoder (grouped-query attention, SwiGLU MLP, RMSNorm, untied
  embedding and output head) and what one step trains on: ``batch`` sequences of ``seq`` tokens;
- :class:`Layout`: how the ranks split the work: data (``dp``), tensor (``tp``, always with
  sequence parallelism), pipeline (``pp``) and context (``cp``) parallel degrees, the ZeRO stage,
  micro-batches, recomputation, the pipeline schedule and the precision; and where each rank sits
  on the mesh (:meth:`Layout.coords`, :meth:`Layout.group`);
- :class:`Cluster`: GPUs, their memory and FLOP/s, and the two links between them (inside a node
  and between nodes), with published presets (:func:`h100_cluster`).

``BYTES`` says how many bytes each kind of number takes in each precision: in float32 16 bytes
per parameter (lesson 9), in the bfloat16 recipe 18 (2 for the parameter, 4 for its float32
gradient, 12 for the float32 master copy and Adam's two moments; Megatron-LM's distributed
optimizer guide tabulates the same).

Example::

    >>> from helpers.plan import LLAMA3_8B, Layout
    >>> round(LLAMA3_8B.num_params() / 1e9, 2)
    8.03
    >>> layout = Layout(dp=2, tp=2, pp=2, cp=1, microbatches=4)
    >>> layout.world, layout.stage_layers(LLAMA3_8B)
    (8, [16, 16])
    >>> layout.coords(5), layout.group("tp", 5)
    ({'dp': 1, 'pp': 0, 'cp': 0, 'tp': 1}, [4, 5])
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

__all__ = ["Model", "Layout", "Link", "Cluster", "BYTES", "CATEGORIES", "DIMS", "RECOMPUTE", "SCHEDULES",
           "LLAMA3_8B", "LLAMA3_70B", "LLAMA3_405B", "h100_cluster", "divisors"]

#: The four things a rank's memory is spent on, in the order plans list them.
CATEGORIES = ("parameters", "gradients", "optimizer", "activations")
#: The mesh dimensions, and their order from the outermost to the innermost by default: Llama 3's
#: (its paper lists the innermost first: TP, CP, PP, DP). torchtitan puts pp outermost instead.
DIMS = ("dp", "pp", "cp", "tp")
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe")

#: Bytes per number, by precision. ``param``/``grad``/``optimizer`` are per parameter (the optimizer's
#: state: Adam's two moments, plus the float32 master copy of the weights in bfloat16); ``activation``
#: per activation element; ``stat`` per saved statistic (RMSNorm's 1/rms, attention's log-sum-exp,
#: the loss's softmax), float32 in both; ``index`` per token id kept by the embedding and the loss.
BYTES = {
    "fp32": {"param": 4, "grad": 4, "optimizer": 8, "activation": 4, "stat": 4, "index": 8},
    "bf16": {"param": 2, "grad": 4, "optimizer": 12, "activation": 2, "stat": 4, "index": 8},
}


def divisors(n: int) -> list[int]:
    """Every positive divisor of ``n``, smallest first.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Model:
    """A Llama-style decoder and what one training step trains on.

    ``hidden`` is the model width h, ``heads`` the query heads a, ``kv_heads`` the key/value heads
    (grouped-query attention: each serves ``heads // kv_heads`` query heads), ``ffn`` the SwiGLU
    MLP's inner width f, ``vocab`` V. A step trains on ``batch`` sequences of ``seq`` tokens.

    >>> m = Model("tiny", vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, ffn=48, seq=16, batch=4)
    >>> m.head_dim, m.kv_hidden, m.layer_params()
    (8, 16, {'attention': 3072, 'mlp': 4608, 'norms': 64})
    """

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    batch: int = 1

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"{self.name}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: heads {self.heads} is not divisible by kv_heads {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        """The width of one head, h / a."""
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """The width of the keys (and of the values): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def layer_params(self) -> dict[str, int]:
        """One transformer layer's parameters by part: attention (wq, wk, wv, wo), MLP (w1, w2, w3),
        the two RMSNorms' scales."""
        h = self.hidden
        return {"attention": 2 * h * h + 2 * h * self.kv_hidden, "mlp": 3 * h * self.ffn, "norms": 2 * h}

    @property
    def embedding_params(self) -> int:
        """The token embedding: V x h."""
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output head (not tied to the embedding): V x h."""
        return self.vocab * self.hidden

    def num_params(self) -> int:
        """Every parameter: embedding, layers, the final RMSNorm and the head."""
        return (self.embedding_params + self.layers * sum(self.layer_params().values()) + self.hidden
                + self.head_params)

    def flops_per_token(self) -> float:
        """Training FLOPs per token as torchtitan counts them for MFU: 6 per parameter of every matrix
        product (the embedding lookup is none) plus 12 L h s for attention's two products (forward 1x,
        backward 2x, causal masking not discounted); recomputation is not counted."""
        return 6 * (self.num_params() - self.embedding_params) + 12 * self.layers * self.hidden * self.seq

    @property
    def tokens(self) -> int:
        """Tokens per training step: batch x seq."""
        return self.batch * self.seq

    def with_(self, **changes: Any) -> "Model":
        """A copy with some fields changed."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Layout:
    """How ``dp x pp x cp x tp`` ranks split a model's training step.

    - ``tp`` splits every weight matrix (Megatron's column-then-row split) with sequence
      parallelism: between the split layers each rank keeps 1/tp of the tokens;
    - ``pp`` gives each rank ``stage_layers(model)[stage]`` consecutive layers (stage 0 also holds the
      embedding, the last stage the final norm, the head and the loss) and runs ``microbatches``
      micro-batches through the stages with ``schedule`` ("1f1b" or "gpipe");
    - ``cp`` gives each rank 1/cp of every sequence; attention all-gathers the keys and values;
    - ``dp`` gives each rank its own sequences; ``zero`` (0 to 3) shards optimizer state (1), gradients
      (2) and parameters (3) over the ``dp x cp`` ranks that hold the same parameters;
    - ``micro_batch`` is the sequences per micro-batch on one data-parallel rank, so a step trains on
      ``dp x microbatches x micro_batch`` sequences;
    - ``recompute``: "none" keeps every activation (attention's probabilities included), "selective"
      recomputes the attention core in backward (keeping its inputs, output and log-sum-exp), "full"
      keeps each layer's input only and recomputes the layer in backward;
    - ``order`` lists the mesh dimensions from the outermost to the innermost: ranks are numbered
      row-major over it, so the last dimension's groups are ranks next to each other (one node).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    zero: int = 0
    microbatches: int = 1
    micro_batch: int = 1
    recompute: str = "selective"
    schedule: str = "1f1b"
    precision: str = "bf16"
    order: tuple[str, ...] = DIMS
    layers_per_stage: tuple[int, ...] | None = field(default=None, compare=True)

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "microbatches", "micro_batch"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Layout.{name} must be a positive integer, not {getattr(self, name)!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"Layout.zero is a ZeRO stage, 0 to 3, not {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"Layout.recompute is one of {RECOMPUTE}, not {self.recompute!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Layout.schedule is one of {SCHEDULES}, not {self.schedule!r}")
        if self.precision not in BYTES:
            raise ValueError(f"Layout.precision is one of {tuple(BYTES)}, not {self.precision!r}")
        if sorted(self.order) != sorted(DIMS):
            raise ValueError(f"Layout.order must list {DIMS} once each, not {self.order}")
        if self.layers_per_stage is not None and len(self.layers_per_stage) != self.pp:
            raise ValueError(f"Layout.layers_per_stage has {len(self.layers_per_stage)} entries for pp = {self.pp}")

    # -- sizes ---------------------------------------------------------------------------

    @property
    def world(self) -> int:
        """Ranks in all: dp x tp x pp x cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def degrees(self) -> dict[str, int]:
        """Each mesh dimension's size, in ``order``."""
        return {d: getattr(self, d) for d in self.order}

    @property
    def shard_group(self) -> int:
        """How many ranks hold the same parameters, and so share them out under ZeRO: dp x cp."""
        return self.dp * self.cp

    @property
    def grad_dim(self) -> str:
        """The name traffic plans give the group gradients are summed (and ZeRO's shards exchanged) over:
        "dp+cp" when cp > 1 (its ranks hold the same parameters and saw other tokens), else "dp"."""
        return "dp+cp" if self.cp > 1 else "dp"

    @property
    def bytes(self) -> dict[str, int]:
        """:data:`BYTES` of this layout's precision."""
        return BYTES[self.precision]

    def sequences(self) -> int:
        """Sequences one step trains on: dp x microbatches x micro_batch."""
        return self.dp * self.microbatches * self.micro_batch

    def stage_layers(self, model: Model) -> list[int]:
        """How many layers each pipeline stage holds: ``layers_per_stage`` when given, else an even split
        (a ValueError when ``pp`` does not divide the layers)."""
        if self.layers_per_stage is not None:
            if sum(self.layers_per_stage) != model.layers:
                raise ValueError(f"layers_per_stage {self.layers_per_stage} adds up to {sum(self.layers_per_stage)}, "
                                 f"not the model's {model.layers} layers")
            return list(self.layers_per_stage)
        if model.layers % self.pp:
            raise ValueError(f"pp = {self.pp} does not divide {model.name}'s {model.layers} layers; pass "
                             "layers_per_stage to split them unevenly")
        return [model.layers // self.pp] * self.pp

    def in_flight(self, stage: int) -> int:
        """Micro-batches whose activations stage ``stage`` holds at once, at most: 1F1B keeps at most
        pp - stage (and never more than there are), GPipe keeps all of them."""
        if self.schedule == "gpipe":
            return self.microbatches
        return min(self.pp - stage, self.microbatches)

    # -- where ranks sit ---------------------------------------------------------------------

    def coords(self, rank: int) -> dict[str, int]:
        """Rank ``rank``'s index on every mesh dimension (numbered row-major over ``order``)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is not one of this layout's {self.world} ranks")
        out: dict[str, int] = {}
        for dim in reversed(self.order):
            rank, out[dim] = divmod(rank, getattr(self, dim))
        return {d: out[d] for d in DIMS}

    def rank_at(self, **coords: int) -> int:
        """The rank at these mesh indices (missing dimensions are 0)."""
        rank = 0
        for dim in self.order:
            rank = rank * getattr(self, dim) + coords.get(dim, 0)
        return rank

    def group(self, dims: str, rank: int) -> list[int]:
        """The ranks that share every index with ``rank`` except on ``dims`` ("tp", "dp+cp", ...), in order."""
        varying = dims.split("+")
        here = self.coords(rank)
        ranges = [range(getattr(self, d)) if d in varying else [here[d]] for d in DIMS]
        return sorted(self.rank_at(**dict(zip(DIMS, idx))) for idx in itertools.product(*ranges))

    def extent(self, dims: str) -> tuple[int, int]:
        """(how many ranks rank 0's group of ``dims`` has, the highest of them), without listing them."""
        size, highest = 1, 0
        for dim in dims.split("+") if dims else []:
            stride = math.prod(getattr(self, d) for d in self.order[self.order.index(dim) + 1:])
            size *= getattr(self, dim)
            highest += stride * (getattr(self, dim) - 1)
        return size, highest

    def dims_of(self, ranks: list[int]) -> str:
        """The name of the dimensions a group of ranks spans ("tp", "dp+cp"; "" for one rank)."""
        coords = [self.coords(r) for r in ranks]
        varying = [d for d in DIMS if len({c[d] for c in coords}) > 1]
        return "+".join(d for d in ("dp", "cp", "pp", "tp") if d in varying)

    def stage_ranks(self, stage: int) -> list[int]:
        """Every rank that holds pipeline stage ``stage``."""
        return [r for r in range(self.world) if self.coords(r)["pp"] == stage]

    def ranks(self) -> Iterator[int]:
        return iter(range(self.world))

    def with_(self, **changes: Any) -> "Layout":
        """A copy with some fields changed."""
        return replace(self, **changes)

    def describe(self) -> str:
        """One line: "dp 2 x tp 4 x pp 2 x cp 1, ZeRO-1, 8 micro-batches of 1, selective, 1f1b, bf16"."""
        return (f"dp {self.dp} x tp {self.tp} x pp {self.pp} x cp {self.cp}, ZeRO-{self.zero}, "
                f"{self.microbatches} micro-batch{'es' if self.microbatches != 1 else ''} of {self.micro_batch}, "
                f"{self.recompute} recomputation, {self.schedule}, {self.precision}")


@dataclass(frozen=True)
class Link:
    """One kind of link between GPUs: ``latency`` in seconds per message, ``bandwidth`` in bytes per
    second in each direction, per GPU."""

    name: str
    latency: float
    bandwidth: float

    def seconds(self, nbytes: float, messages: int = 1) -> float:
        """``messages`` latencies plus ``nbytes`` over the bandwidth."""
        return messages * self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Cluster:
    """GPUs for a job: how many, how many per node, each one's memory (bytes) and peak dense FLOP/s in
    the training precision, and the links inside a node (``intra``) and between nodes (``inter``)."""

    name: str
    gpus: int
    gpus_per_node: int
    memory: float
    flops: float
    intra: Link
    inter: Link

    def link(self, span: int) -> Link:
        """The link a group of ``span`` consecutive ranks uses: within a node while it fits in one."""
        return self.intra if span <= self.gpus_per_node else self.inter

    def with_(self, **changes: Any) -> "Cluster":
        return replace(self, **changes)


def h100_cluster(gpus: int, memory_gib: float = 80) -> Cluster:
    """``gpus`` NVIDIA H100 SXM in nodes of 8, from published figures (the lesson cites each):

    - 80 GB of HBM3 and 989 TFLOP/s of dense bfloat16 (NVIDIA's H100 datasheet: 1,979 with sparsity);
    - NVLink 4 inside a node: 900 GB/s per GPU counting both directions, 450 GB/s each way;
    - 400 Gb/s (50 GB/s) per GPU between nodes (one InfiniBand or RoCE NIC per GPU, as in Llama 3's
      and torchtitan's clusters).

    The latencies (3 us inside a node, 10 us across) are round figures of the order nccl-tests report
    for small messages, not measurements of this course: they matter only for small messages.
    """
    return Cluster(f"{gpus} x H100", gpus, min(8, gpus), memory_gib * 2**30, 989e12,
                   Link("NVLink", 3e-6, 450e9), Link("400 Gb/s network", 10e-6, 50e9))


# Llama 3's published shapes (The Llama 3 Herd of Models, table 3) at the pre-training sequence length 8192.
# The batch is a run's choice, not the model's: 405B's is the paper's 16M tokens a step (2048 sequences); for the
# others set the batch of the run you plan (``LLAMA3_8B.with_(batch=16)``).
LLAMA3_8B = Model("Llama 3 8B", vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, seq=8192)
LLAMA3_70B = Model("Llama 3 70B", vocab=128256, hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, seq=8192)
LLAMA3_405B = Model("Llama 3 405B", vocab=128256, hidden=16384, layers=126, heads=128, kv_heads=8, ffn=53248,
                    seq=8192, batch=2048)


def _check_presets() -> None:  # pragma: no cover - a guard against a typo in the shapes above
    for model, billions in ((LLAMA3_8B, 8.0), (LLAMA3_70B, 70.6), (LLAMA3_405B, 405.9)):
        assert math.isclose(model.num_params() / 1e9, billions, rel_tol=0.01), (model.name, model.num_params())
