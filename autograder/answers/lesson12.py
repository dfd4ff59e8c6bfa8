"""The instructor's answers to lesson 12 (planning a training run): never shipped, hidden in the grading sandbox.

- :func:`plan_memory` (Exercise 12.1): bytes per rank of every pipeline stage, by category;
- :func:`plan_traffic` (Exercise 12.2): bytes each rank of every stage sends in one step, by
  (collective, mesh dimension);
- :func:`choose_layout` (Exercise 12.3) and :func:`search`: the course's search over layouts, judged by
  :func:`helpers.steptime.predict` with these two functions: the fastest layout that fits.

They count exactly what :mod:`helpers.planrun` measures (the model of :mod:`helpers.shard`); the lesson
derives every term. The hidden checks reach this module through :mod:`autograder.hidden.sealed` (the
grading sandbox hides the file itself).

Example::

    >>> from helpers.plan import LLAMA3_8B, Layout
    >>> stage = plan_memory(LLAMA3_8B, Layout(dp=8, zero=3, micro_batch=2, precision="bf16"))[0]
    >>> round(stage["optimizer"] / 2**30, 1)
    11.2
"""

from __future__ import annotations

from typing import Any

from helpers.plan import Cluster, Layout, Model, divisors

__all__ = ["plan_memory", "plan_traffic", "units", "search", "choose_layout", "candidates"]


def units(model: Model, layout: Layout, stage: int) -> list[int]:
    """Parameters per unit on one rank of ``stage`` (after tp): the embedding, each layer, the head."""
    h, t = model.hidden, layout.tp
    layer = 2 * h * h // t + 2 * h * model.kv_hidden // t + 3 * h * model.ffn // t + 2 * h
    out = [model.vocab // t * h] if stage == 0 else []
    out += [layer] * layout.stage_layers(model)[stage]
    if stage == layout.pp - 1:
        out.append(h + model.vocab // t * h)
    return out


def _layer_activations(model: Model, layout: Layout, core: str) -> float:
    """Bytes one layer keeps for one micro-batch (selective: the core recomputed; none: it keeps the probabilities)."""
    by = layout.bytes
    e, st = by["activation"], by["stat"]
    h, t, c = model.hidden, layout.tp, layout.cp
    rows = layout.micro_batch * model.seq // c                  # this rank's tokens of a micro-batch
    keys = layout.micro_batch * model.seq                       # keys and values: every position (all-gathered)
    heads = model.heads // t
    out = rows / t * (4 * h * e + 2 * st)                       # sequence parallel: each norm's input, 1/rms, output
    out += rows * (2 * (h // t) * e + 4 * (model.ffn // t) * e)  # q and the attention's output, the MLP's four
    out += keys * 2 * (model.kv_hidden // t) * e
    if core == "none":
        out += heads * rows * model.seq * e                     # the probabilities: its queries against every key
    else:
        out += heads * rows * st                                # one log-sum-exp per query and head
    return out


def plan_memory(model: Model, layout: Layout) -> list[dict[str, float]]:
    """Bytes one rank of each pipeline stage holds at most, by category."""
    by = layout.bytes
    q, h, t = layout.shard_group, model.hidden, layout.tp
    rows = layout.micro_batch * model.seq // layout.cp
    plans = []
    for stage in range(layout.pp):
        sizes = units(model, layout, stage)
        total, largest = sum(sizes), max(sizes)
        share = total / q if layout.zero >= 3 else total
        params = share * by["param"] + (largest * by["param"] if layout.zero >= 3 else 0)
        grads = (total / q if layout.zero >= 2 else total) * by["grad"] + largest * by["grad"]
        optimizer = (total / q if layout.zero >= 1 else total) * by["optimizer"]
        first = rows * by["index"] if stage == 0 else 0.0      # the token ids the embedding keeps
        last = 0.0
        if stage == layout.pp - 1:                              # the final norm, the head's input, the loss's softmax
            last = rows / t * (2 * h * by["activation"] + by["stat"])
            last += rows * (model.vocab // t) * by["stat"] + rows * by["index"]
        layers = layout.stage_layers(model)[stage]
        flight = layout.in_flight(stage)
        if layout.recompute == "full":
            kept = rows / t * h * by["activation"]               # each layer's input
            after_forward = flight * (layers * kept + first + last)
            # recomputing the top layer of a micro-batch: its loss and head have already run backward
            again = _layer_activations(model, layout, "selective") - kept
            acts = max(after_forward, after_forward - last + again)
        else:
            acts = flight * (layers * _layer_activations(model, layout, layout.recompute) + first + last)
        plans.append({"parameters": params, "gradients": grads, "optimizer": optimizer, "activations": acts})
    return plans


def plan_traffic(model: Model, layout: Layout) -> list[dict[tuple[str, str], float]]:
    """Bytes one rank of each stage sends in one step, by (collective, mesh dimension), counted as rings."""
    by = layout.bytes
    e, h, t, c, m = by["activation"], model.hidden, layout.tp, layout.cp, layout.microbatches
    rows = layout.micro_batch * model.seq // c
    keys = layout.micro_batch * model.seq
    q = layout.shard_group
    full = layout.recompute == "full"
    plans = []
    for stage in range(layout.pp):
        out: dict[tuple[str, str], float] = {}

        def add(op: str, dim: str, nbytes: float) -> None:
            if nbytes:
                out[(op, dim)] = out.get((op, dim), 0) + nbytes

        layers = layout.stage_layers(model)[stage]
        first, last = stage == 0, stage == layout.pp - 1
        if t > 1:
            unit = (t - 1) / t * rows * h * e                      # one all-gather or reduce-scatter of the tokens
            again = 2 if full else 0                                # the recomputed forward gathers and scatters again
            add("all_gather", "tp", m * (layers * (6 + again) + first + 2 * last) * unit)
            add("reduce_scatter", "tp", m * (layers * (4 + again) + first + last) * unit)
            norms = layers * 2 * h + (h if last else 0)
            add("all_reduce", "tp", m * 2 * (t - 1) / t * (norms * by["param"] + (3 * rows * by["stat"] if last else 0)))
        if c > 1:
            kv = (c - 1) / c * 2 * keys * (model.kv_hidden // t) * e
            add("all_gather", "cp", m * layers * kv * (2 if full else 1))
            add("reduce_scatter", "cp", m * layers * kv)
        if layout.pp > 1:
            add("send", "pp", m * (rows / t) * h * e * ((not last) + (not first)))
        if q > 1:
            sizes = units(model, layout, stage)
            total, share = sum(sizes), (q - 1) / q
            dim = layout.grad_dim
            if layout.zero == 0:
                add("all_reduce", dim, 2 * share * total * by["grad"])
            elif layout.zero in (1, 2):
                add("reduce_scatter", dim, (m if layout.zero == 2 else 1) * share * total * by["grad"])
                add("all_gather", dim, share * total * by["param"])
            else:                                                   # gathered for forward, again for backward
                regathered = total - (sizes[0] if first else 0)     # (the embedding's backward needs no weight)
                add("all_gather", dim, m * share * (total + regathered) * by["param"])
                add("reduce_scatter", dim, m * share * total * by["grad"])
        plans.append(out)
    return plans


def candidates(model: Model, cluster: Cluster) -> list[Layout]:
    """Every layout the course's search tries on ``cluster`` for one step of ``model.batch`` sequences."""
    out = []
    g = cluster.gpus
    for tp in divisors(cluster.gpus_per_node):
        if model.heads % tp or model.kv_heads % tp or model.ffn % tp or model.vocab % tp or g % tp:
            continue
        for pp in divisors(model.layers):
            for cp in divisors(model.seq):
                if g % (tp * pp * cp) or cp > 32 or model.seq // cp % tp:
                    continue
                dp = g // (tp * pp * cp)
                if model.batch % dp:
                    continue
                per_rank = model.batch // dp
                for micro_batch in divisors(per_rank):
                    m = per_rank // micro_batch
                    if pp > 1 and m < pp:
                        continue
                    for zero in (0, 1, 2, 3):
                        if zero and dp * cp == 1:
                            continue
                        for recompute in ("none", "selective", "full"):
                            out.append(Layout(dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, microbatches=m,
                                              micro_batch=micro_batch, recompute=recompute, precision="bf16"))
    return out


def search(model: Model, cluster: Cluster, **options: Any) -> list[tuple[float, Layout]]:
    """Every candidate that fits, with its predicted step time (:func:`helpers.steptime.predict`), fastest first."""
    from helpers.steptime import predict

    found = []
    for layout in candidates(model, cluster):
        p = predict(model, layout, cluster, plan_memory, plan_traffic, **options)
        if p.fits:
            found.append((p.step, layout))
    return sorted(found, key=lambda x: x[0])


def choose_layout(model: Model, cluster: Cluster) -> Layout:
    """Exercise 12.3: the fastest layout that fits, by the course's search."""
    found = search(model, cluster)
    if not found:
        raise ValueError(f"no layout of {model.name} fits on {cluster.name}")
    return found[0][1]
