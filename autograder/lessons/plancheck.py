"""Checks of a training planner (lesson 12) that need no answer: small layouts measured on ranks, and the judging.

- :func:`small_case`: a small model and a layout of 1 to 4 ranks, drawn for a seed, that
  :func:`helpers.planrun.measure` can train (every size divides as its pieces need);
- :func:`measured`: those cases measured, once per process for a seed;
- :func:`learner_worker` (on a rank): the learner's ``plan_memory``, ``plan_traffic`` or ``choose_layout`` on
  each case, answers turned into plain data (:func:`memory_answer`, :func:`traffic_answer`,
  :func:`layout_answer`), or a sentence saying what shape was expected;
- :func:`memory_problem` and :func:`traffic_problem`: how a plan differs from the truth of one case (a
  measurement, or the course's planner in the hidden tests), with what that difference usually means
  (:func:`memory_hint`, :func:`traffic_hint`);
- :func:`layout_problem`: whether a chosen layout can train the model on the cluster at all.

Tolerances: parameters, gradients, optimizer state and every traffic entry within a millionth (and a
byte); activations within :data:`ACTIVATION_TOLERANCE` (2%), which leaves out the few numbers per token a
planner may ignore (a 1/rms, a log-sum-exp) but not a missing term.

The exercises are declared in :mod:`autograder.lessons.lesson12`; this module ships with it (the self-checks
use it).

Example::

    >>> model, layout = small_case(7)
    >>> layout.world <= 4 and layout.sequences() == model.batch
    True
"""

from __future__ import annotations

import random
from typing import Any, Callable

from helpers.plan import CATEGORIES, Cluster, Layout, Model

__all__ = ["ACTIVATION_TOLERANCE", "EXACT", "OPS", "DIM_NAMES", "small_case", "measured", "learner_worker",
           "memory_answer", "traffic_answer", "layout_answer", "memory_problem", "traffic_problem", "memory_hint",
           "traffic_hint", "layout_problem", "where", "gib"]

ACTIVATION_TOLERANCE = 0.02
EXACT = 1e-6
OPS = ("all_reduce", "all_gather", "reduce_scatter", "send")
DIM_NAMES = ("dp", "tp", "pp", "cp", "dp+cp")
SHAPES = ((1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2), (2, 2, 1, 1), (2, 1, 2, 1),
          (2, 1, 1, 2), (1, 2, 2, 1), (1, 2, 1, 2), (1, 1, 2, 2), (4, 1, 1, 1), (1, 4, 1, 1), (1, 1, 4, 1),
          (1, 1, 1, 4))
_MEASURED: dict[int, list] = {}


def small_case(seed: int, shape: tuple[int, int, int, int] | None = None) -> tuple[Model, Layout]:
    """A model small enough to train on CPU ranks and a layout (dp, tp, pp, cp) of at most 4 ranks."""
    pick = random.Random(seed)
    dp, tp, pp, cp = shape or pick.choice(SHAPES)
    head_dim = pick.choice((4, 8))
    heads = pick.choice((4, 8))
    kv_heads = pick.choice([k for k in (2, 4) if heads % k == 0 and k % tp == 0])
    hidden = heads * head_dim
    model = Model(f"small-{seed}", vocab=16 * pick.randint(2, 6), hidden=hidden, layers=pp * pick.choice((1, 2)),
                  heads=heads, kv_heads=kv_heads, ffn=8 * pick.randint(hidden // 8, 3 * hidden // 8), seq=16)
    microbatches = pick.choice((2, 3, 4)) if pp > 1 else pick.choice((1, 2))
    micro_batch = pick.choice((1, 2))
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, zero=pick.choice((0, 1, 2, 3)) if dp * cp > 1 else 0,
                    microbatches=microbatches, micro_batch=micro_batch,
                    recompute=pick.choice(("none", "selective", "full")),
                    schedule=pick.choice(("1f1b", "gpipe")) if pp > 1 else "1f1b", precision="fp32")
    return model.with_(batch=layout.sequences()), layout


def measured(seed: int, count: int) -> list[tuple[Model, Layout, Any]]:
    """``count`` small cases for ``seed`` (different shapes), each trained one step on ranks and measured."""
    from helpers.planrun import measure

    if seed not in _MEASURED:
        pick = random.Random(seed)
        # Every draw holds tensor parallelism over 4 ranks (where a ring all-reduce sends 1.5 times its tensor: over 2
        # it sends exactly one), a pipeline under 1F1B with more micro-batches than it keeps, and ZeRO: each usual
        # mistake changes at least one case.
        pools = ([(1, 4, 1, 1)], [s for s in SHAPES if s[2] > 1], [s for s in SHAPES if s[0] * s[3] > 1])
        cases = []
        for i in range(count):
            model, layout = small_case(seed * 31 + i, pick.choice(pools[i % 3]))
            if i % 3 == 1:
                layout = layout.with_(schedule="1f1b", microbatches=max(layout.microbatches, layout.pp + 1))
            if i % 3 == 2:
                layout = layout.with_(zero=pick.choice((1, 2, 3)))
            cases.append((model.with_(batch=layout.sequences()), layout))
        _MEASURED.clear()
        _MEASURED[seed] = [(m, lay, measure(m, lay, seed=seed % 1000, timeout=60)) for m, lay in cases]
    return _MEASURED[seed][:count]


# -- the learner's answers, on a rank -----------------------------------------------------------------------


def memory_answer(plan: Any, layout: Layout) -> list[dict[str, float]] | str:
    """``plan_memory``'s answer as plain numbers, or what was wrong with its shape."""
    if not isinstance(plan, (list, tuple)) or len(plan) != layout.pp:
        return (f"plan_memory returned {type(plan).__name__} {str(plan)[:80]}; it should return a list with one dict "
                f"per pipeline stage ({layout.pp} here), each giving bytes for {', '.join(CATEGORIES)}")
    out = []
    for stage, entry in enumerate(plan):
        if not isinstance(entry, dict) or set(entry) != set(CATEGORIES):
            return (f"plan_memory's entry for stage {stage} is {str(entry)[:120]}; it should be a dict with exactly "
                    f"the keys {', '.join(CATEGORIES)}")
        try:
            out.append({k: float(entry[k]) for k in CATEGORIES})
        except (TypeError, ValueError):
            return f"plan_memory's entry for stage {stage} holds something that is not a number: {entry}"
    return out


def traffic_answer(plan: Any, layout: Layout) -> list[dict[str, float]] | str:
    """``plan_traffic``'s answer as plain numbers keyed "op dim", or what was wrong with its shape."""
    if not isinstance(plan, (list, tuple)) or len(plan) != layout.pp:
        return (f"plan_traffic returned {type(plan).__name__} {str(plan)[:80]}; it should return a list with one dict "
                f"per pipeline stage ({layout.pp} here), mapping (collective, dimension) to bytes")
    out = []
    for stage, entry in enumerate(plan):
        if not isinstance(entry, dict):
            return f"plan_traffic's entry for stage {stage} is {str(entry)[:120]}; it should be a dict"
        clean = {}
        for key, value in entry.items():
            if not (isinstance(key, tuple) and len(key) == 2 and key[0] in OPS and key[1] in DIM_NAMES):
                return (f"plan_traffic's stage {stage} has the key {key!r}; keys are (collective, dimension) with the "
                        f"collective one of {OPS} and the dimension one of {DIM_NAMES}")
            try:
                if float(value):
                    clean[f"{key[0]} {key[1]}"] = float(value)
            except (TypeError, ValueError):
                return f"plan_traffic's stage {stage} gives {key} the value {value!r}, not a number of bytes"
        out.append(clean)
    return out


def layout_answer(layout: Any) -> dict[str, Any] | str:
    """``choose_layout``'s answer as the fields of a Layout, or what was wrong with it."""
    if not isinstance(layout, Layout):
        return (f"choose_layout returned {type(layout).__name__} {str(layout)[:80]}; it should return a "
                "helpers.plan.Layout")
    return {f: getattr(layout, f) for f in Layout.__dataclass_fields__}


def learner_worker(rank: int, world_size: int, fn: Callable, kind: str, cases: list) -> list:
    """On a rank: the learner's function on each case ((model, layout) or (model, cluster)), as plain data."""
    shape = {"memory": memory_answer, "traffic": traffic_answer}
    out = []
    for first, second in cases:
        answer = fn(first, second)
        out.append(layout_answer(answer) if kind == "layout" else shape[kind](answer, second))
    return out


# -- judging ---------------------------------------------------------------------------------------------------


def gib(n: float) -> str:
    """Bytes in words: "12.3 GiB", "4.1 MiB", "512 B"."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def where(model: Model, layout: Layout) -> str:
    """The case in words, for feedback."""
    return (f"{model.name} (h {model.hidden}, {model.layers} layers, {model.heads} heads, {model.kv_heads} key/value "
            f"heads, ffn {model.ffn}, vocab {model.vocab}, seq {model.seq:,}) under {layout.describe()}")


def _close(got: float, want: float, tolerance: float) -> bool:
    return abs(got - want) <= max(tolerance * abs(want), 1.0)


def memory_hint(model: Model, layout: Layout, stage: int, category: str, got: float, want: float) -> str:
    """What a difference in one category usually means, from relations any planner can check."""
    q, m = layout.shard_group, layout.microbatches
    if category == "optimizer" and layout.zero >= 1 and _close(got, want * q, EXACT):
        return (f" Under ZeRO-{layout.zero} each of the dp x cp = {q} ranks that hold the same parameters keeps the "
                "optimizer state of its 1/(dp cp) share only: this is the whole state, counted on every rank.")
    if category == "gradients" and layout.zero >= 2 and got > want:
        return (f" Under ZeRO-{layout.zero} the gradient buffers hold 1/(dp cp) = 1/{q}; only the unit whose backward "
                "just ended has its whole gradients for a moment.")
    if category == "parameters" and layout.zero == 3 and got < want:
        return (" Under ZeRO-3 a unit (the embedding, a layer, the head) is gathered whole while it computes: add the "
                "largest unit of the stage, whole, to the shards.")
    if category == "activations" and layout.schedule == "1f1b" and m > layout.in_flight(stage) and got > want:
        most = layout.in_flight(stage)
        if _close(got * most / m, want, ACTIVATION_TOLERANCE):
            return (f" That is {m} micro-batches' activations; under 1F1B stage {stage} of {layout.pp} holds at most "
                    f"pp - stage = {most} at once (a backward frees one before the next forward starts).")
    if category == "activations" and got < want and layout.recompute == "full":
        return (" Under full recomputation the peak comes while a layer is recomputed in backward: every layer's "
                "input kept, plus that one layer's activations rebuilt.")
    return ""


def memory_problem(model: Model, layout: Layout, answer: Any, truth: list[dict[str, float]], source: str,
                   hint: Callable[..., str] = memory_hint) -> str | None:
    """The first way ``answer`` differs from ``truth`` (per stage and category), in words; None when it does not."""
    if isinstance(answer, str):
        return answer
    for stage, (got, want) in enumerate(zip(answer, truth)):
        for k in CATEGORIES:
            tolerance = ACTIVATION_TOLERANCE if k == "activations" else EXACT
            if not _close(got[k], want[k], tolerance):
                within = f"within {tolerance:.0%}" if k == "activations" else "to the byte"
                return (f"{where(model, layout)}: stage {stage}'s {k} per rank should be {want[k]:,.0f} bytes "
                        f"({gib(want[k])}, {source}, {within}); your plan says {got[k]:,.0f} ({gib(got[k])})."
                        + hint(model, layout, stage, k, got[k], want[k]))
    return None


def traffic_hint(model: Model, layout: Layout, key: str, got: float, want: float) -> str:
    """What a difference in one entry usually means."""
    op, dim = key.split()
    p = layout.extent(dim)[0]
    if op == "all_reduce" and p > 1 and _close(got * 2 * (p - 1) / p, want, EXACT):
        return (f" That is the tensor's own bytes; a ring all-reduce over {p} ranks sends 2(p-1)/p of them from each "
                "rank (a reduce-scatter, then an all-gather).")
    if op == "all_reduce" and p > 1 and _close(got * 2, want, EXACT):
        return " That is half: an all-reduce is a reduce-scatter and an all-gather, (p-1)/p of the tensor each."
    if op in ("all_gather", "reduce_scatter") and p > 1 and _close(got * (p - 1) / p, want, EXACT):
        return f" Each rank sends (p-1)/p of the whole tensor in a ring {op.replace('_', '-')}, not all of it."
    if dim == "tp" and _close(got * 2, want, 0.25):
        return (" About half: every tensor-parallel collective of the forward has its mirror in backward (an "
                "all-gather's backward is a reduce-scatter, and the other way round), and the column-parallel "
                "linears gather their input again in backward.")
    return ""


def traffic_problem(model: Model, layout: Layout, answer: Any, truth: list[dict[str, float]], source: str,
                    hint: Callable[..., str] = traffic_hint) -> str | None:
    """The first way ``answer`` differs from ``truth`` (per stage and entry), in words; None when it does not."""
    if isinstance(answer, str):
        return answer
    for stage, (got, want) in enumerate(zip(answer, truth)):
        for key in sorted(set(got) | set(want)):
            g, w = got.get(key, 0.0), want.get(key, 0.0)
            if not _close(g, w, EXACT):
                op, dim = key.split()
                said = f"{g:,.0f} bytes ({gib(g)})" if key in got else "nothing"
                return (f"{where(model, layout)}: a rank of stage {stage} sends {w:,.0f} bytes ({gib(w)}) in "
                        f"{op.replace('_', '-')}s over {dim} per step ({source}); your plan says {said}."
                        + hint(model, layout, key, g, w))
    return None


def layout_problem(model: Model, cluster: Cluster, fields: Any) -> str | None:
    """Why a chosen layout (its fields) cannot train ``model`` on ``cluster``; None when it can."""
    if isinstance(fields, str):
        return fields
    layout = Layout(**fields)
    what = f"{layout.describe()} for {model.name} on {cluster.name}"
    if layout.world != cluster.gpus:
        return f"{what}: dp x tp x pp x cp = {layout.world}, but the cluster has {cluster.gpus} GPUs; use all of them."
    if layout.sequences() != model.batch:
        return (f"{what}: it trains dp x microbatches x micro_batch = {layout.sequences()} sequences a step; the model's "
                f"step is {model.batch}.")
    if cluster.gpus_per_node % layout.tp:
        return f"{what}: tp = {layout.tp} does not fit in a node of {cluster.gpus_per_node} GPUs."
    for name, value, divisor in (("heads", model.heads, layout.tp), ("kv_heads", model.kv_heads, layout.tp),
                                 ("ffn", model.ffn, layout.tp), ("vocab", model.vocab, layout.tp),
                                 ("seq", model.seq, layout.cp * layout.tp), ("layers", model.layers, layout.pp)):
        if value % divisor:
            return f"{what}: the model's {name} ({value}) does not divide by {divisor}."
    if layout.precision != "bf16":
        return f"{what}: plan the run in the bfloat16 recipe (precision='bf16'), as GPUs train."
    return None
