"""Lesson 10's graded exercises: a tensor-parallel MLP, and pipeline schedules over send/recv.

- 10.1 ``TensorParallelMLP(fc1, fc2)``: ``fc2(gelu(fc1(x)))`` over p ranks, fc1 split by output
  features and fc2 by input features (the same hidden units; block r or any other split of them
  between the ranks), fc2's bias whole on every rank and added once; one all-reduce in forward
  (g) and one in backward (f), counted however they were made (``dist.all_reduce``, a
  ``ProcessGroup`` method or a functional collective: the learner places each one in their own
  f and g either way). Checked on 1, 2 and 4 ranks, float32 and float64, against one process,
  and probed: rank 0's output and input gradient must change when the other ranks' inputs do,
  so a module that computes alone from whole copies earns nothing; a parameter given frozen
  keeps no gradient (:mod:`autograder.lessons.tpcheck`).
- 10.2 ``gpipe_step(stage, microbatches)``: every micro-batch forward through the stages, then
  every one backward, with point-to-point calls only; gradients against one process on the
  whole batch, one message per micro-batch per direction, and the bubble read exactly from a
  logical clock: (p - 1) / (m + p - 1) (:mod:`autograder.lessons.pipecheck`).
- 10.3 (optional) ``one_f_one_b_step(stage, microbatches)``: the same step in the 1F1B order,
  holding at most p - s micro-batches' activations on stage s, with the same bubble.
- 10.4 (optional) ``interleaved_step(stages, microbatches)``: each rank holds two chunks of a
  model of 2p layers (chunk c of rank r is layer c * p + r); any order whose bubble on the
  logical clock is (p - 1) / (2m + p - 1), with the gradients of one process.

How the checks judge: every run is on fresh ranks with layers and data drawn at grading time.
10.1 runs with DTensor switched off (``forbid=DTENSOR``: DeviceMesh, DTensor and
``parallelize_module``, which would place the all-reduces for the learner) and counts the
calls of forward and of backward from the ranks' trace; 10.2 and 10.3 run with every
collective (functional ones included, such as ``_functional_collectives.all_gather_tensor``)
and ``torch.distributed.pipelining`` switched off (``forbid=COLLECTIVES + (PIPELINING,)``).

Hidden test cells and the visible self-checks::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("10.1", TensorParallelMLP, "forward")   # "backward", "communication", "shards"
    grade("10.2", gpipe_step, "gradients")        # "messages", "bubble", "no_hang"
    grade("10.3", one_f_one_b_step, "memory")     # "gradients", "bubble"
    exercise("10.2").self_check(gpipe_step)

"""

from __future__ import annotations

from helpers import COLLECTIVES, DTENSOR, PIPELINING

from ..kit.exercise import Attempt, Exercise, Part, fresh_seed
from ..kit.pieces import by_world_size
from .pipecheck import (SPARE, judge_bubble, judge_chunk_gradients, judge_gradients, judge_interleaved_bubble,
                        judge_memory, judge_messages, pipeline_worker)
from .tpcheck import SIZES, judge_backward, judge_communication, judge_forward, judge_shards, mlp_worker

__all__ = ["EXERCISES", "exercise_10_1", "exercise_10_2", "exercise_10_3", "exercise_10_4"]

TIMEOUT = 10.0  # a correct answer takes well under a second; the rest is room for a loaded machine
# Exercise 10.1: (world size, dtype).
TP_CASES = ((1, "float64"), (2, "float64"), (2, "float32"), (4, "float64"))
#: What feedback adds when a step raises on a parameter without a gradient (a frozen bias, an unused parameter).
NO_GRADIENT = ("If it is about None: a parameter that gets no gradient (frozen with requires_grad=False, or never used "
               "by the stage's forward) keeps .grad None after backward, as torch leaves it. Skip such a parameter "
               "(`if p.grad is not None`) rather than dividing, zeroing or creating its .grad.")
PIPELINE_HINTS = {"TypeError": NO_GRADIENT, "AttributeError": NO_GRADIENT}
CHUNKS = 2
#: What a learner reads on calling what an exercise switches off in the checks' ranks.
TP_REASON = ("Exercise 10.1 asks you to build tensor parallelism yourself, with the all-reduces in your own "
             "autograd Functions f and g; DTensor, DeviceMesh and parallelize_module come right after it in the lesson")


def _pipeline_reason(number: str) -> str:
    return (f"Exercise {number} builds the pipeline schedule yourself and moves activations and gradients between "
            "stages with send, recv, isend and irecv only; torch.distributed.pipelining comes right after it in the "
            "lesson")

#: Runs of the answer being graded, shared by its parts: the parts of an exercise read different
#: things from the same run (a seed drawn at grading time, once per run), so grading one answer
#: launches each case once instead of once per part. Only successful runs are kept, and only
#: for one answer at a time.
_RUNS: dict = {}


def _shared_run(attempt: Attempt, worker, world: int, extra: tuple, **settings) -> list:
    if _RUNS.get("answer") is not attempt.fn:
        _RUNS.clear()
        _RUNS["answer"] = attempt.fn
    key = (worker.__name__, world, extra, tuple(sorted(attempt.exercise.forbidden(attempt.rules or attempt.part))))
    if key not in _RUNS:
        _RUNS[key] = list(attempt.run(worker, world, (attempt.fn, fresh_seed(), *extra), **settings))
    return _RUNS[key]


# -- Exercise 10.1 --------------------------------------------------------------------------


def _tp_runs(attempt: Attempt, cases: tuple = TP_CASES, run: bool = True) -> list[tuple[int, str, list[dict]]]:
    runs = []
    for world, variants in by_world_size(cases):
        for dtype_name, *frozen in variants:
            frozen = tuple(frozen[0]) if frozen else ()
            context = f"{dtype_name} layers {SIZES['d']} -> {SIZES['hidden']} -> {SIZES['out']}" + (
                f", with {' and '.join(frozen)} frozen (requires_grad=False)" if frozen else "")
            replies = _shared_run(attempt, mlp_worker, world, (dtype_name, run, frozen), timeout=TIMEOUT,
                                  context=context)
            runs.append((world, dtype_name, replies))
    return runs


def _tp_self_check(attempt: Attempt) -> str:
    for world, dtype_name, replies in _tp_runs(attempt, ((2, "float64"),)):
        for judge in (judge_shards, judge_forward, judge_backward, judge_communication):
            judge(attempt, world, dtype_name, replies)
    return ("Self-check passed on 2 ranks: each rank holds half of fc1's rows and the same hidden units' columns of "
            "fc2, and fc2's whole bias; the output, the input's gradient and every shard's gradient equal one process, and "
            "rank 0's output and input gradient change when the other rank's input does; forward made one all-reduce "
            "of the output and backward one of the input's gradient. The hidden tests also try 1 and 4 ranks, float32 "
            "and frozen parameters.")


exercise_10_1 = Exercise(
    number="10.1",
    function="TensorParallelMLP",
    title="a tensor-parallel MLP from collectives",
    parts=(
        Part("forward", 2, "every rank's output equals one process running the whole MLP, on 1, 2 and 4 ranks, and "
             "changes with the other ranks' inputs (g sums every rank's share)."),
        Part("backward", 2, "the input's gradient and every shard's gradient equal the matching part of one process's "
             "(a frozen parameter's shard gets none), and the input's gradient sums every rank's part (f)."),
        Part("communication", 2, "exactly one all-reduce in forward, of the output (g), and one in backward, of the "
             "input's gradient (f); none needed on 1 rank."),
        Part("shards", 1, "each rank holds 1/p of fc1's rows (weight and bias) and the same hidden units' columns of "
             "fc2, the ranks' shares splitting the hidden units (block r, or any other split), fc2's bias whole."),
    ),
    visible_check=_tp_self_check,
    forbid=(DTENSOR,),  # dist.all_reduce stays on: f and g are made of it
    forbid_reason=TP_REASON,
    hints={"RuntimeError": "If it is about shapes that cannot be multiplied, check the dimension you split: "
                           "nn.Linear keeps its weight as (out_features, in_features), so fc1's output features "
                           "are its weight's rows and fc2's input features its weight's columns."},
)


# -- Exercises 10.2 and 10.3 -------------------------------------------------------------------


def _pipeline(attempt: Attempt, p: int, m: int, timeout: float = TIMEOUT, chunks: int = 0,
              spare: bool = False) -> list[dict]:
    return _shared_run(attempt, pipeline_worker, p, (m, chunks, spare), timeout=timeout, trace=True,
                       context=f"{m} micro-batch{'es' if m != 1 else ''} of 3 rows"
                               + (f", {chunks} chunks per rank" if chunks else "") + (f", {SPARE}" if spare else ""))


def _pipeline_self_check(name: str, cases: tuple, judges: tuple):
    def check(attempt: Attempt) -> str:
        for p, m in cases:
            replies = _pipeline(attempt, p, m)
            for judge in judges:
                judge(attempt, p, m, replies, **({"schedule_name": name} if judge in (judge_bubble, judge_gradients)
                                                  else {}))
        shown = ", ".join(f"{p} stages x {m} micro-batches" for p, m in cases)
        return (f"Self-check passed ({shown}): the gradients equal one process on the whole batch, "
                + ("each stage sent one message per micro-batch to each neighbour, " if judge_messages in judges else
                   "each stage ran 1F1B's order and held p - s micro-batches' activations at its peak, ")
                + f"and the logical clock gives {name}'s bubble, (p - 1) / (m + p - 1). The hidden tests try "
                "other numbers of stages and micro-batches, and stages with a frozen and an unused parameter.")

    return check


exercise_10_2 = Exercise(
    number="10.2",
    function="gpipe_step",
    title="a GPipe schedule over send and recv",
    parts=(
        Part("gradients", 3, "every stage's gradients equal one process on the whole batch (2-4 stages, 1-5 "
             "micro-batches; a frozen or unused parameter keeps no gradient)."),
        Part("messages", 2, "each stage sends one message per micro-batch to each neighbour, of one micro-batch's "
             "size, and nothing else."),
        Part("bubble", 3, "the logical clock's bubble is exactly (p - 1) / (m + p - 1), with every forward before any "
             "backward on each stage."),
        Part("no_hang", 1, "runs the whole step and finishes promptly with 2, 3 and 4 stages and 8 micro-batches."),
    ),
    visible_check=_pipeline_self_check("GPipe", ((3, 4),), (judge_gradients, judge_messages, judge_bubble)),
    forbid=COLLECTIVES + (PIPELINING,),
    forbid_reason=_pipeline_reason("10.2"),
    hints=PIPELINE_HINTS,
)

exercise_10_3 = Exercise(
    number="10.3",
    function="one_f_one_b_step",
    title="(optional) a 1F1B schedule",
    parts=(
        Part("gradients", 1, "every stage's gradients equal one process on the whole batch (2-4 stages; a frozen or "
             "unused parameter keeps no gradient), computed in 1F1B's order."),
        Part("memory", 1, "stage s holds p - s micro-batches' activations at its peak, never more: the pipeline "
             "filled, then one forward and one backward in turn."),
        Part("bubble", 1, "the logical clock's bubble is still (p - 1) / (m + p - 1), in 1F1B's order."),
    ),
    visible_check=_pipeline_self_check("1F1B", ((3, 6),), (judge_gradients, judge_memory, judge_bubble)),
    forbid=COLLECTIVES + (PIPELINING,),
    forbid_reason=_pipeline_reason("10.3"),
    hints=PIPELINE_HINTS,
)

def _interleaved_self_check(attempt: Attempt) -> str:
    for p, m in ((3, 3),):
        replies = _pipeline(attempt, p, m, chunks=CHUNKS)
        judge_chunk_gradients(attempt, p, m, replies)
        judge_interleaved_bubble(attempt, p, m, replies)
    return ("Self-check passed (3 stages x 2 chunks, 3 micro-batches): every chunk's gradients equal one process on "
            "the whole batch, and the logical clock gives the interleaved bubble, (p - 1) / (2m + p - 1). The hidden "
            "tests try 2 and 4 stages too.")


exercise_10_4 = Exercise(
    number="10.4",
    function="interleaved_step",
    title="(optional) an interleaved schedule",
    parts=(
        Part("gradients", 1, "every chunk's gradients equal one process on the whole batch (2-4 stages, 2 chunks "
             "each; a frozen or unused parameter keeps no gradient)."),
        Part("bubble", 1, "the logical clock's bubble is (p - 1) / (2m + p - 1)."),
    ),
    visible_check=_interleaved_self_check,
    forbid=COLLECTIVES + (PIPELINING,),
    forbid_reason=_pipeline_reason("10.4"),
    hints=PIPELINE_HINTS,
)

EXERCISES = (exercise_10_1, exercise_10_2, exercise_10_3, exercise_10_4)
