"""Lesson 12's graded exercises: plan a training run, and have the plan checked against measurement.

- 12.1 ``plan_memory(model, layout)``: for each pipeline stage, the bytes one of its ranks holds at most,
  by category (parameters, gradients, optimizer, activations). Parts: *small* (equal to what the course
  measures on 1 to 4 CPU ranks training one step of a small model, under layouts drawn at grading
  time), *large* (equal to the course's planner for Llama-like models of 1 to 70 billion parameters on up
  to 2048 GPUs), *recompute* (the three recomputation settings of the same layouts).
- 12.2 ``plan_traffic(model, layout)``: for each stage, the bytes one of its ranks sends in a step by
  (collective, mesh dimension). Parts: *small* (equal to the trace of a real step), *large*.
- 12.3 ``choose_layout(model, cluster)``: a layout that trains the model's batch on every GPU of the
  cluster. Parts: *fits* (every rank's memory, by the course's planner), *fast* (its predicted step, by
  the course's cost model, within 10% of the best layout the course's search finds).

Parameters, gradients, optimizer state and traffic must match to the byte (a millionth); activations
within 2%. Feedback names the usual mistakes (:mod:`autograder.lessons.plancheck`, and for the hidden
parts :mod:`autograder.hidden.planparts`, which compares with the course's planner: it reaches the
grading sandbox sealed, see :mod:`autograder.hidden.sealed`).

Hidden test cells and the visible self-checks::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("12.1", plan_memory, "small")           # "large", "recompute"
    exercise("12.1").self_check(plan_memory)
    exercise("12.3").self_check(choose_layout, plan_memory=plan_memory, plan_traffic=plan_traffic)
"""

from __future__ import annotations

from helpers.plan import Model, h100_cluster

from ..kit.exercise import Attempt, Exercise, Part, fresh_seed
from .plancheck import layout_problem, learner_worker, measured, memory_problem, traffic_problem, where

__all__ = ["EXERCISES", "exercise_12_1", "exercise_12_2", "exercise_12_3", "SELF_CHECK_CASES"]

TIMEOUT = 20.0
SELF_CHECKED = 2          # small layouts measured by each self-check
#: The visible self-check's cases for 12.3: a model of 3 billion parameters on 16 GPUs of 80 and of 40 GiB.
SELF_CHECK_CASES = ((Model("3B", vocab=128256, hidden=3072, layers=28, heads=24, kv_heads=8, ffn=8192, seq=8192,
                           batch=64), 16, 80),
                    (Model("3B", vocab=128256, hidden=3072, layers=28, heads=24, kv_heads=8, ffn=8192, seq=8192,
                           batch=64), 16, 40))


def _answers(attempt: Attempt, kind: str, cases: list) -> list:
    return list(attempt.run(learner_worker, 1, (attempt.fn, kind, cases), timeout=TIMEOUT))[0]


def _measured_self_check(attempt: Attempt, kind: str) -> str:
    runs = measured(fresh_seed(), SELF_CHECKED)
    answers = _answers(attempt, kind, [(m, lay) for m, lay, _ in runs])
    for (model, layout, run), answer in zip(runs, answers):
        if kind == "memory":
            problem = memory_problem(model, layout, answer, [run.stage_memory(s) for s in range(layout.pp)],
                                     "measured on ranks")
        else:
            truth = [{f"{op} {dim}": v for (op, dim), v in run.traffic[layout.stage_ranks(s)[0]].items()}
                     for s in range(layout.pp)]
            problem = traffic_problem(model, layout, answer, truth, "traced on ranks")
        if problem:
            attempt.fail(problem)
    shown = "; ".join(lay.describe() for _, lay, _ in runs)
    return (f"Self-check passed: your plan equals what {len(runs)} layouts measured on CPU ranks ({shown}). The "
            "hidden tests try other small layouts, and real models planned by the course's planner.")


def _memory_self_check(attempt: Attempt) -> str:
    return _measured_self_check(attempt, "memory")


def _traffic_self_check(attempt: Attempt) -> str:
    return _measured_self_check(attempt, "traffic")


def _layout_self_check(attempt: Attempt, plan_memory=None, plan_traffic=None) -> str:
    from helpers.plan import Layout
    from helpers.steptime import predict

    cases = [(model, h100_cluster(gpus, memory_gib=gib)) for model, gpus, gib in SELF_CHECK_CASES]
    answers = list(attempt.run(learner_worker, 1, (attempt.fn, "layout", cases), timeout=60.0))[0]
    said = []
    for (model, cluster), answer in zip(cases, answers):
        problem = layout_problem(model, cluster, answer)
        if problem:
            attempt.fail(problem)
        layout = Layout(**answer)
        if plan_memory is not None and plan_traffic is not None:
            p = predict(model, layout, cluster, plan_memory, plan_traffic)
            if not p.fits:
                attempt.fail(f"{where(model, layout)} on {cluster.name}: by your own planner it does not fit. "
                             + p.summary())
            said.append(f"{cluster.name} of {cluster.memory / 2**30:.0f} GiB: {layout.describe()}, {p.summary()}")
        else:
            said.append(f"{cluster.name} of {cluster.memory / 2**30:.0f} GiB: {layout.describe()}")
    return ("Self-check passed: each layout uses every GPU, trains the model's batch and divides the model as its "
            "pieces need" + (", and fits by your own planner" if plan_memory is not None else "") + ".\n  "
            + "\n  ".join(said) + "\nThe hidden tests judge fit and speed with the course's planner and search, on "
            "other models and clusters.")


exercise_12_1 = Exercise(
    number="12.1",
    function="plan_memory",
    title="plan the memory of every rank",
    parts=(
        Part("small", 3, "equal to what the course measures on 1 to 4 CPU ranks training one step, under layouts drawn "
             "at grading time (activations within 2%, the rest to the byte)."),
        Part("large", 3, "equal to the course's planner for Llama-like models of 1 to 70 billion parameters on up to "
             "2048 GPUs (every ZeRO stage, both schedules, both precisions)."),
        Part("recompute", 2, "the activations right under no, selective and full recomputation of the same layouts."),
    ),
    visible_check=_memory_self_check,
)

exercise_12_2 = Exercise(
    number="12.2",
    function="plan_traffic",
    title="plan the bytes every rank sends",
    parts=(
        Part("small", 3, "equal, by collective and mesh dimension, to the trace of a real step on 1 to 4 CPU ranks."),
        Part("large", 3, "equal to the course's planner for Llama-like models on up to 2048 GPUs."),
    ),
    visible_check=_traffic_self_check,
)

exercise_12_3 = Exercise(
    number="12.3",
    function="choose_layout",
    title="choose a layout",
    parts=(
        Part("fits", 2, "a layout of every GPU that trains the model's batch and fits every rank's memory by the "
             "course's planner, for models and clusters drawn at grading time."),
        Part("fast", 3, "its predicted step, by the course's cost model, within 10% of the best layout the course's "
             "search finds."),
    ),
    visible_check=_layout_self_check,
)

# The measured runs build optimizers on their ranks, in the notebook and in the checks: their factory imports
# torch._dynamo once, ahead (autograder.kit.registry.warm_ranks).
WARM_RANKS = ("kernel", "checks")

EXERCISES = (exercise_12_1, exercise_12_2, exercise_12_3)
