"""Lesson 12's hidden checks: plans against measurement and the course's planner, layouts against its search.

They need the course's planner (:mod:`autograder.answers.lesson12`, reached through
:mod:`autograder.hidden.sealed`, since the grading sandbox hides the answers), so this module stays with
the instructor; :mod:`autograder.hidden.lesson12` names each part's check.

- :func:`large_case`: a Llama-like model of 1 to 70 billion parameters and a layout of up to 2048 GPUs,
  drawn for a seed (bfloat16; every ZeRO stage, schedule and recomputation setting);
- :func:`search_case`: a model and a cluster of 16 to 64 GPUs for Exercise 12.3, and :func:`search_cases`, the
  cases one grading draws (the first one that plain data parallelism does not fit);
- :func:`mistakes_memory` and :func:`mistakes_traffic`: the course's planner with one usual mistake made,
  so that feedback can name the mistake an answer matches.

Example::

    >>> model, layout = large_case(3)
    >>> layout.sequences() == model.batch, layout.precision in ("bf16", "fp32")
    (True, True)
"""

from __future__ import annotations

import functools
import random
from typing import Any

from helpers.plan import CATEGORIES, Cluster, Layout, Model, divisors, h100_cluster

from autograder.kit.exercise import Attempt, fresh_seed
from autograder.lessons.plancheck import (ACTIVATION_TOLERANCE, EXACT, gib, layout_problem, learner_worker, measured,
                                          memory_hint, memory_problem, traffic_hint, traffic_problem)

from .sealed import load

__all__ = ["memory_small", "memory_large", "memory_recompute", "traffic_small", "traffic_large", "layout_fits",
           "layout_fast", "reference", "large_case", "search_case", "search_cases", "mistakes_memory", "memory_hint_hidden", "traffic_hint_hidden",
           "best_layout", "MARGIN"]

#: How much slower than the course search's best layout a chosen layout may be (its predicted step).
MARGIN = 0.10
_SEARCHES: dict[tuple, tuple[float, Layout, dict]] = {}


def reference() -> Any:
    """The course's planner (the instructor's answers to lesson 12, :mod:`autograder.answers.lesson12`)."""
    return load("lesson12")


def large_case(seed: int, recompute: str | None = None, **forced: Any) -> tuple[Model, Layout]:
    """A Llama-like model and a layout for it (degrees that divide; ``recompute`` and the layout fields in ``forced``
    when given)."""
    pick = random.Random(seed)
    hidden = pick.choice((2048, 3072, 4096, 5120, 8192))
    heads = hidden // 128
    layers = pick.choice((16, 24, 32, 40, 48, 80))
    model = Model(f"model-{seed}", vocab=pick.choice((32000, 128256, 151936)), hidden=hidden, layers=layers,
                  heads=heads, kv_heads=8, ffn=256 * round(3.5 * hidden / 256), seq=pick.choice((4096, 8192, 32768)))
    tp = pick.choice([t for t in (1, 2, 4, 8) if heads % t == 0 and model.ffn % t == 0 and model.vocab % t == 0])
    pp = pick.choice([p for p in divisors(layers) if p <= 16])
    cp = pick.choice((1, 1, 2, 4, 8))
    dp = pick.choice((1, 2, 4, 8, 16, 32))
    m = pick.choice((1, 2, 4, 8, 16)) if pp == 1 else pick.choice((pp // 2 or 1, pp, 2 * pp, 4 * pp))
    drawn = pick.choice(("none", "selective", "full"))
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, zero=pick.choice((0, 1, 2, 3)), microbatches=m,
                    micro_batch=pick.choice((1, 2)), recompute=recompute or drawn,
                    schedule=pick.choice(("1f1b", "1f1b", "gpipe")) if pp > 1 else "1f1b",
                    precision=pick.choice(("bf16", "bf16", "fp32")))
    if forced:
        layout = layout.with_(**forced)
        if layout.pp > 1 and layout.microbatches < layout.pp:
            layout = layout.with_(microbatches=2 * layout.pp)
    return model.with_(batch=layout.sequences()), layout


#: What the first large cases of a draw are made to hold, so that each usual mistake changes at least one case:
#: tensor parallelism, a 1F1B pipeline, context parallelism with the probabilities kept, ZeRO.
COVER = ({"tp": 8}, {"pp": 4, "schedule": "1f1b"}, {"cp": 4, "recompute": "none"}, {"zero": 2, "dp": 8})


def search_case(seed: int) -> tuple[Model, Cluster]:
    """A model of 1 to 8 billion parameters and a cluster of 16 to 64 GPUs of 40 to 80 GiB (Exercise 12.3)."""
    pick = random.Random(seed)
    hidden = pick.choice((2048, 3072, 4096))
    gpus = pick.choice((16, 32, 64))
    model = Model(f"model-{seed}", vocab=pick.choice((32000, 128256)), hidden=hidden, layers=pick.choice((16, 24, 32)),
                  heads=hidden // 128, kv_heads=8, ffn=256 * round(3.5 * hidden / 256), seq=pick.choice((4096, 8192)),
                  batch=gpus * pick.choice((1, 2, 4)))
    return model, h100_cluster(gpus, memory_gib=pick.choice((40, 80)))


def _unsharded_fits(model: Model, cluster: Cluster) -> bool:
    """Whether plain data parallelism (every GPU a data-parallel rank holding the whole model, its gradients and its
    optimizer state; bfloat16) fits the cluster's memory by the course's planner."""
    from helpers.steptime import predict

    ref = reference()
    layout = Layout(dp=cluster.gpus, micro_batch=max(1, model.batch // cluster.gpus), precision="bf16")
    return predict(model, layout, cluster, ref.plan_memory, ref.plan_traffic).fits


def search_cases(seed: int) -> list[tuple[Model, Cluster]]:
    """The ``SEARCHES`` cases of Exercise 12.3 one grading draws for ``seed``: the first is drawn again (from seeds
    a thousand apart) until plain data parallelism does not fit it, so that a layout that shards nothing cannot pass
    *fits* (about 6 draws in 100 would otherwise be two cases that it fits).

    Example::

        >>> all(not _unsharded_fits(*search_cases(seed)[0]) for seed in range(20))
        True
    """
    first = next(case for k in range(1000) if not _unsharded_fits(*(case := search_case(seed + 1000 * k))))
    return [first] + [search_case(seed + i) for i in range(1, SEARCHES)]


def best_layout(model: Model, cluster: Cluster) -> tuple[float, Layout]:
    """The course search's fastest layout that fits, and its predicted step (searched once per case)."""
    key = (model, cluster)
    if key not in _SEARCHES:
        found = reference().search(model, cluster)
        if not found:
            raise RuntimeError(f"the course's search found no layout of {model.name} that fits on {cluster.name}")
        _SEARCHES[key] = found[0]
    return _SEARCHES[key]


# -- naming the mistake an answer matches -------------------------------------------------------------------


def mistakes_memory(model: Model, layout: Layout) -> dict[str, list[dict[str, float]]]:
    """The course's memory plan with each usual mistake made, by the sentence that names it."""
    ref = reference()
    right = ref.plan_memory(model, layout)
    out: dict[str, list[dict[str, float]]] = {}
    t, q, by = layout.tp, layout.shard_group, layout.bytes

    def changed(stage_fn) -> list[dict[str, float]]:
        return [stage_fn(s, dict(plan)) for s, plan in enumerate(right)]

    if t > 1:
        def units_with(norm_share: float, vocab_share: float):
            def units(model: Model, layout: Layout, stage: int) -> list[int]:
                h = model.hidden
                layer = (2 * h * h + 2 * h * model.kv_hidden + 3 * h * model.ffn) // t + 2 * h * norm_share
                out = [model.vocab * vocab_share * h] if stage == 0 else []
                out += [layer] * layout.stage_layers(model)[stage]
                return out + ([h * norm_share + model.vocab * vocab_share * h] if stage == layout.pp - 1 else [])
            return units

        out[(f"the RMSNorm scales divided by tp = {t}: every tp rank holds them whole (they are h numbers each, "
             "applied to this rank's 1/tp of the tokens, and their gradients are summed over tp)")] = \
            _with_units(ref, units_with(1 / t, 1 / t), model, layout)
        out[(f"the embedding and the head left whole: tensor parallelism splits both over the vocabulary, "
             f"V/tp = {model.vocab // t} rows each")] = _with_units(ref, units_with(1, 1), model, layout)
    if layout.schedule == "1f1b" and layout.microbatches > 1:
        out[("every micro-batch's activations held at once, as GPipe does; under 1F1B stage s holds at most "
             "pp - s micro-batches (one, with pp = 1: each micro-batch's backward runs before the next forward)")] = ref.plan_memory(model, layout.with_(schedule="gpipe"))
    if layout.cp > 1 and layout.recompute == "none":
        rows = layout.micro_batch * model.seq // layout.cp
        probs = model.heads // t * rows * model.seq * by["activation"]
        layers = layout.stage_layers(model)

        def squared(s, plan):
            plan["activations"] -= layout.in_flight(s) * layers[s] * probs * (1 - 1 / layout.cp)
            return plan

        out[(f"the attention probabilities divided by cp squared: a rank keeps its s/cp queries' scores against all s "
             f"keys (s^2/cp per head); (s/cp)^2 is one block of a ring step, not what backward needs")] = changed(squared)
    if layout.zero >= 1:
        def whole_optimizer(s, plan):
            plan["optimizer"] *= q
            return plan

        out[f"the optimizer state counted on every rank; ZeRO-{layout.zero} keeps 1/(dp cp) of it"] = changed(whole_optimizer)
    return out


def _with_units(ref: Any, units: Any, model: Model, layout: Layout) -> list[dict[str, float]]:
    """The course's memory plan with another count of each stage's units (a mistake's)."""
    right = ref.units
    ref.units = units
    try:
        return ref.plan_memory(model, layout)
    finally:
        ref.units = right


def memory_hint_hidden(model: Model, layout: Layout, stage: int, category: str, got: float, want: float,
                       answer: list[dict[str, float]] | None = None) -> str:
    """The named mistake whose plan the answer matches, else the relation hint of :func:`memory_hint`."""
    if answer is not None:
        for sentence, plan in mistakes_memory(model, layout).items():
            if all(abs(answer[s][k] - plan[s][k]) <= max((ACTIVATION_TOLERANCE if k == "activations" else EXACT)
                                                        * abs(plan[s][k]), 1.0)
                   for s in range(layout.pp) for k in CATEGORIES):
                return f" Your plan matches this mistake: {sentence}."
    return memory_hint(model, layout, stage, category, got, want)


def traffic_hint_hidden(model: Model, layout: Layout, key: str, got: float, want: float) -> str:
    """:func:`traffic_hint`, and the ZeRO-3 embedding's single gather."""
    hint = traffic_hint(model, layout, key, got, want)
    if not hint and layout.zero == 3 and key.startswith("all_gather") and got > want:
        hint = (" Under ZeRO-3 a unit is gathered again for backward only when its backward needs its weights: the "
                "embedding's does not (its gradient is the output's gradient added into the rows of the ids).")
    return hint



# -- the hidden parts ---------------------------------------------------------------------------------------

SMALL, LARGE, RECOMPUTE_BASES, SEARCHES = 3, 6, 2, 2
_SEED: list[int] = []
_ANSWERS: dict = {}


def _seed() -> int:
    """One seed per grading process, drawn at its first use: the parts share their cases and measurements."""
    if not _SEED:
        _SEED.append(fresh_seed())
    return _SEED[0]


def _answers(attempt: Attempt, kind: str, cases: list, timeout: float = 20.0) -> list:
    key = (attempt.fn, kind, tuple(map(repr, cases)))
    if key not in _ANSWERS:
        if len(_ANSWERS) > 16:
            _ANSWERS.clear()
        _ANSWERS[key] = list(attempt.run(learner_worker, 1, (attempt.fn, kind, cases), timeout=timeout,
                                         context=f"{len(cases)} cases drawn for this grading"))[0]
    return _ANSWERS[key]


def _small(attempt: Attempt, kind: str) -> None:
    runs = measured(_seed(), SMALL)
    answers = _answers(attempt, kind, [(m, lay) for m, lay, _ in runs])
    for (model, layout, run), answer in zip(runs, answers):
        if kind == "memory":
            truth = [run.stage_memory(s) for s in range(layout.pp)]
            problem = memory_problem(model, layout, answer, truth, "measured on ranks",
                                     functools.partial(memory_hint_hidden, answer=answer))
        else:
            truth = [{f"{op} {dim}": v for (op, dim), v in run.traffic[layout.stage_ranks(s)[0]].items()}
                     for s in range(layout.pp)]
            problem = traffic_problem(model, layout, answer, truth, "traced on ranks", traffic_hint_hidden)
        if problem:
            attempt.fail(problem)


def _large(attempt: Attempt, kind: str, cases: list) -> None:
    ref = reference()
    answers = _answers(attempt, kind, cases)
    for (model, layout), answer in zip(cases, answers):
        if kind == "memory":
            problem = memory_problem(model, layout, answer, ref.plan_memory(model, layout), "by the course's planner",
                                     functools.partial(memory_hint_hidden, answer=answer))
        else:
            truth = [{f"{op} {dim}": v for (op, dim), v in plan.items() if v} for plan in ref.plan_traffic(model, layout)]
            problem = traffic_problem(model, layout, answer, truth, "by the course's planner", traffic_hint_hidden)
        if problem:
            attempt.fail(problem)


def memory_small(attempt: Attempt) -> None:
    _small(attempt, "memory")


def _covering(offset: int) -> list[tuple[Model, Layout]]:
    return [large_case(_seed() + offset + i, **(COVER[i] if i < len(COVER) else {})) for i in range(LARGE)]


def memory_large(attempt: Attempt) -> None:
    _large(attempt, "memory", _covering(0))


#: The recomputation part's two layouts (each under the three settings): a 1F1B pipeline with tp and ZeRO, and cp with tp.
RECOMPUTE_COVER = ({"pp": 4, "schedule": "1f1b", "zero": 1, "tp": 2}, {"cp": 4, "tp": 4})


def memory_recompute(attempt: Attempt) -> None:
    _large(attempt, "memory", [large_case(_seed() + 100 + i, recompute=r, **RECOMPUTE_COVER[i])
                               for i in range(RECOMPUTE_BASES) for r in ("none", "selective", "full")])


def traffic_small(attempt: Attempt) -> None:
    _small(attempt, "traffic")


def traffic_large(attempt: Attempt) -> None:
    _large(attempt, "traffic", _covering(200))


def _chosen(attempt: Attempt) -> list[tuple[Model, Cluster, Layout]]:
    cases = search_cases(_seed() + 300)
    answers = _answers(attempt, "layout", cases, timeout=30.0)
    out = []
    for (model, cluster), answer in zip(cases, answers):
        problem = layout_problem(model, cluster, answer)
        if problem:
            attempt.fail(problem)
        out.append((model, cluster, Layout(**answer)))
    return out


def layout_fits(attempt: Attempt) -> None:
    from helpers.steptime import predict

    ref = reference()
    for model, cluster, layout in _chosen(attempt):
        p = predict(model, layout, cluster, ref.plan_memory, ref.plan_traffic)
        if not p.fits:
            rank, stage, category, over = p.overflow
            need = sum(p.memory[stage].values())
            attempt.fail(f"{layout.describe()} for {model.name} ({model.num_params() / 1e9:.1f} billion parameters, "
                         f"{model.batch} sequences of {model.seq:,}) on {cluster.name} does not fit: rank {rank} (stage "
                         f"{stage}) needs {gib(need)} of its {gib(cluster.memory)} by the course's planner, "
                         f"{gib(over)} too many; {category} ({gib(p.memory[stage][category])}) is the largest part.")


def layout_fast(attempt: Attempt) -> None:
    from helpers.steptime import predict

    ref = reference()
    for model, cluster, layout in _chosen(attempt):
        best, chosen = best_layout(model, cluster)
        p = predict(model, layout, cluster, ref.plan_memory, ref.plan_traffic)
        if not p.fits or p.step > best * (1 + MARGIN):
            attempt.fail(f"for {model.name} ({model.num_params() / 1e9:.1f} billion parameters, {model.batch} sequences "
                         f"of {model.seq:,}) on {cluster.name}, {layout.describe()} "
                         + (f"takes {p.step * 1e3:,.0f} ms a step by the course's cost model" if p.fits else
                            "does not fit")
                         + f"; the course's search finds {chosen.describe()} at {best * 1e3:,.0f} ms, and a layout "
                         f"within {MARGIN:.0%} of it passes. " + p.summary().split(": ", 1)[-1])
