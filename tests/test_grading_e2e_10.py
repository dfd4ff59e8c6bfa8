"""Lesson 10 graded end to end with the real nbgrader: tensor-parallel MLPs and pipeline schedules, right and wrong.

A temporary copy of the course receives five learners' versions of lesson 10 and is graded
with `python -m autograder grade`, the instructor's command. amy hands in the instructor's
three answers; the others make the mistakes these exercises invite, each a line or two away
from the answer:

- ben: f's backward passes the gradient through (no backward all-reduce);
- cid: fc2's bias added inside g, before the all-reduce; and GPipe's last stage starting each
  backward with 1 instead of 1/m;
- dee: g made with ``torch.distributed.nn.functional.all_reduce``, whose backward sums again;
  a "pipeline" that runs each micro-batch's forward and backward before the next one's; no 1F1B;
- eli: fc1 split along its input features (the columns of ``nn.Linear.weight``); a 1F1B that
  runs every forward first; two chunks per rank taken one micro-batch at a time (10.4).
"""

from __future__ import annotations

import pytest

from _grading import variant
from devtools.scratch import solution_source

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "10-model-parallelism"
TP, GPIPE, ONE_F_ONE_B = "ex10_1-tensorparallelmlp", "ex10_2-gpipe-step", "ex10_3-one-f-one-b-step"
INTERLEAVED = "ex10_4-interleaved-step"
G_OUTPUT = "        return ReduceFromTensorParallel.apply(F.linear(h, self.w2)) + self.b2"

# A GPipe that is no pipeline: each micro-batch goes forward and backward before the next starts.
ONE_AT_A_TIME = '''# Exercise 10.2: a GPipe schedule over send and recv
def gpipe_step(stage, microbatches):
    m = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        x = inputs
        if not stage.is_first:
            x = torch.empty(stage.input_shape)
            dist.recv(x, src=stage.prev_rank)
        y = stage.forward(i, x, targets if stage.is_last else None)
        if stage.is_last:
            grad = 1.0 / m
        else:
            dist.send(y, dst=stage.next_rank)
            grad = torch.empty(stage.output_shape)
            dist.recv(grad, src=stage.next_rank)
        g = stage.backward(i, grad)
        if not stage.is_first:
            dist.send(g, dst=stage.prev_rank)
'''


# Two chunks per rank, but one micro-batch at a time through both and back: right gradients, no pipelining.
INTERLEAVED_ONE_AT_A_TIME = '''# Exercise 10.4: (optional) an interleaved schedule
def interleaved_step(stages, microbatches):
    m = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        for stage in stages:
            x = inputs
            if not stage.is_first:
                x = torch.empty(stage.input_shape)
                dist.recv(x, src=stage.prev_rank)
            y = stage.forward(i, x, targets if stage.is_last else None)
            if not stage.is_last:
                dist.send(y, dst=stage.next_rank)
        for stage in reversed(stages):
            grad = 1.0 / m
            if not stage.is_last:
                grad = torch.empty(stage.output_shape)
                dist.recv(grad, src=stage.next_rank)
            g = stage.backward(i, grad)
            if not stage.is_first:
                dist.send(g, dst=stage.prev_rank)
'''


def _answers(tp=(), gpipe=(), one_f_one_b=(), *, gpipe_source=None, interleaved_source=None, skip=()):
    cells = {TP: variant(LESSON, TP, *tp), GPIPE: gpipe_source or variant(LESSON, GPIPE, *gpipe),
             ONE_F_ONE_B: variant(LESSON, ONE_F_ONE_B, *one_f_one_b),
             INTERLEAVED: interleaved_source or solution_source(LESSON, INTERLEAVED)}
    return {grade_id: source for grade_id, source in cells.items() if grade_id not in skip}


HANDED_IN = {LESSON: {
    "amy": {grade_id: solution_source(LESSON, grade_id) for grade_id in (TP, GPIPE, ONE_F_ONE_B, INTERLEAVED)},
    "ben": _answers(tp=(("        grad = grad.clone()               # all_reduce works in place: leave autograd's tensor "
                         "alone\n        dist.all_reduce(grad)             # each rank's fc1 block gave only its part of "
                         "dL/dx\n", ""),)),
    "cid": _answers(tp=((G_OUTPUT, "        return ReduceFromTensorParallel.apply(F.linear(h, self.w2, self.b2))"),),
                    gpipe=(("grad = 1.0 / m", "grad = 1.0"),)),
    "dee": _answers(tp=((G_OUTPUT, "        import torch.distributed.nn.functional as dist_nn\n"
                                   "        return dist_nn.all_reduce(F.linear(h, self.w2)) + self.b2"),),
                    gpipe_source=ONE_AT_A_TIME, skip=(ONE_F_ONE_B,)),
    "eli": _answers(tp=(("fc1.weight.detach()[mine].clone()", "fc1.weight.detach().chunk(world_size, dim=1)[rank].clone()"),
                        ("fc2.weight.detach()[:, mine].clone()", "fc2.weight.detach().chunk(world_size, dim=0)[rank].clone()")),
                    one_f_one_b=(("    warmup = min(stage.num_stages - stage.rank - 1, m)\n", "    warmup = m\n"),),
                    interleaved_source=INTERLEAVED_ONE_AT_A_TIME),
}}


def _lose(graded_lesson, student: str, *parts: str) -> None:
    assert graded_lesson.scores(student) == {**graded_lesson.points, **dict.fromkeys(parts, 0)}


def test_the_instructors_answers_earn_full_marks(graded_lesson):
    """Do the instructor's three answers, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_no_backward_all_reduce_is_named(graded_lesson):
    """Does an f without its backward all-reduce lose the backward and communication parts alone, naming f?"""
    _lose(graded_lesson, "ben", "10.1/backward", "10.1/communication")
    graded_lesson.check_feedback("ben", "That is f: the identity in forward, an all-reduce of the gradient in backward",
                                 "backward made no call at all")


def test_bias_before_the_sum_and_a_missing_one_over_m_are_named(graded_lesson):
    """Does a bias added before the all-reduce cost the forward part alone, and a GPipe without 1/m the gradients alone?"""
    _lose(graded_lesson, "cid", "10.1/forward", "10.2/gradients")
    graded_lesson.check_feedback("cid", "every rank added the bias before the all-reduce",
                                 "backward on the last stage with 1/")


def test_a_summing_g_and_a_pipeline_that_never_fills_are_named(graded_lesson):
    """Does g's backward summing again, a one-micro-batch-at-a-time schedule and an untouched 1F1B lose what they should?"""
    _lose(graded_lesson, "dee", "10.1/backward", "10.1/communication", "10.2/bubble",
          "10.3/gradients", "10.3/memory", "10.3/bubble")
    graded_lesson.check_feedback("dee", "backward must pass the gradient through unchanged",
                                 "Send every micro-batch forward before waiting for any gradient",
                                 "still raises NotImplementedError")


def test_a_split_along_the_wrong_dimension_and_a_gpipe_order_in_1f1b_are_named(graded_lesson):
    """Does fc1 split by its input features lose all of 10.1, naming the dimension, a 1F1B that runs every forward
    first the memory part, and two chunks taken one micro-batch at a time 10.4's bubble, with its formula?"""
    _lose(graded_lesson, "eli", "10.1/forward", "10.1/backward", "10.1/communication", "10.1/shards", "10.3/memory",
          "10.4/bubble")
    graded_lesson.check_feedback("eli", "along the wrong dimension", "in 1F1B stage s holds at most p - s",
                                 "a bubble of (p - 1) / (v m + p - 1)")


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 10, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
