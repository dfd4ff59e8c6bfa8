"""Lesson 10 graded end to end with the real nbgrader: tensor-parallel MLPs and pipeline schedules, right and wrong.

A temporary copy of the course receives the instructor's four answers to lesson 10 as amy's,
graded with `python -m autograder grade`, the instructor's command. ben, cid, dee and eli make
the mistakes these exercises invite, each a line or two away from the answer (eli hands in
right answers of other shapes); they are decided by the clean re-grade alone in
tests/test_regrade_10.py. Each
learner's exercises fail or pass independently, so one hand-in carries a mistake of each (the
usual mistakes the checks also name are tried in tests/test_lesson10.py, faster):

- ben: f's backward passes the gradient through (no backward all-reduce); a GPipe that starts
  each backward with 1 and then divides every parameter's .grad by m, which raises on the frozen
  bias and the unused parameter of the checks' stages; a "1F1B" with no warm-up, one micro-batch
  at a time;
- cid: shards that drop the frozen weights' requires_grad (so they get gradients); GPipe's last
  stage starting each backward with 1 instead of 1/m; 1F1B written as p - s forwards, then one
  backward and one forward in turn (right: the same order);
- dee: a module that keeps both whole layers and computes on each rank alone (right values, no
  tensor parallelism); a "pipeline" that runs each micro-batch's forward and backward before the
  next one's; no 1F1B;
- eli: a strided split of the hidden units (rank r keeps units r, r + p, ...: right); a GPipe
  that divides only the gradients there are (right); a 1F1B that runs every forward first (GPipe's
  order); two chunks per rank taken one micro-batch at a time (10.4).
"""

from __future__ import annotations

import pytest

from _grading import variant
from devtools.scratch import solution_source

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "10-model-parallelism"
TP, GPIPE, ONE_F_ONE_B = "ex10_1-tensorparallelmlp", "ex10_2-gpipe-step", "ex10_3-one-f-one-b-step"
INTERLEAVED = "ex10_4-interleaved-step"

# cid: each shard made trainable whatever its weight's requires_grad.
DROPS_THE_FLAGS = (("        # each shard keeps its weight's requires_grad: a frozen weight stays frozen, its .grad None\n", ""),
                   *((f", {name}.requires_grad)", ")") for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")))
# eli: rank r keeps hidden units r, r + p, r + 2p, ... (fc1's rows and bias, fc2's columns).
STRIDED = (("        mine = slice(rank * k, (rank + 1) * k)\n", "        mine = slice(rank, None, world_size)\n"),)
# ben: no warm-up, so each micro-batch goes forward and backward before the next.
NO_WARMUP = (("    warmup = min(stage.num_stages - stage.rank - 1, m)\n", "    warmup = 0\n"),)

# dee: both whole layers on every rank, computed alone.
WHOLE_COPIES = '''# Exercise 10.1: a tensor-parallel MLP from collectives
class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))
'''

# GPipe whose last stage starts each backward with 1; the gradients are divided by m afterwards (ben: all of them,
# eli: those there are).
GPIPE_DIVIDED_AFTER = '''# Exercise 10.2: a GPipe schedule over send and recv
def gpipe_step(stage, microbatches):
    m = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        x = inputs
        if not stage.is_first:
            x = torch.empty(stage.input_shape)
            dist.recv(x, src=stage.prev_rank)
        y = stage.forward(i, x, targets if stage.is_last else None)
        if not stage.is_last:
            dist.send(y, dst=stage.next_rank)
    for i in range(m):
        grad = 1.0
        if not stage.is_last:
            grad = torch.empty(stage.output_shape)
            dist.recv(grad, src=stage.next_rank)
        g = stage.backward(i, grad)
        if not stage.is_first:
            dist.send(g, dst=stage.prev_rank)
    for p in stage.parameters():
        p.grad /= m
'''
GPIPE_DIVIDES_WHAT_THERE_IS = GPIPE_DIVIDED_AFTER.replace("        p.grad /= m\n",
                                                          "        if p.grad is not None:\n            p.grad /= m\n")

# cid: 1F1B as p - s forwards, then one backward and one forward in turn.
BACKWARD_FIRST_1F1B = '''# Exercise 10.3: (optional) a 1F1B schedule
def one_f_one_b_step(stage, microbatches):
    m, pending = len(microbatches), []
    for i in range(min(stage.num_stages - stage.rank, m)):
        x = microbatches[i][0]
        if not stage.is_first:
            x = torch.empty(stage.input_shape)
            dist.recv(x, src=stage.prev_rank)
        y = stage.forward(i, x, microbatches[i][1] if stage.is_last else None)
        if not stage.is_last:
            pending.append(dist.isend(y, dst=stage.next_rank))
    sent = min(stage.num_stages - stage.rank, m)
    for i in range(m):
        grad = 1.0 / m
        if not stage.is_last:
            grad = torch.empty(stage.output_shape)
            dist.recv(grad, src=stage.next_rank)
        g = stage.backward(i, grad)
        if not stage.is_first:
            pending.append(dist.isend(g, dst=stage.prev_rank))
        if sent < m:
            x = microbatches[sent][0]
            if not stage.is_first:
                x = torch.empty(stage.input_shape)
                dist.recv(x, src=stage.prev_rank)
            y = stage.forward(sent, x, microbatches[sent][1] if stage.is_last else None)
            if not stage.is_last:
                pending.append(dist.isend(y, dst=stage.next_rank))
            sent += 1
    for request in pending:
        request.wait()
'''

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


def _answers(tp=(), gpipe=(), one_f_one_b=(), *, tp_source=None, gpipe_source=None, one_f_one_b_source=None,
             interleaved_source=None, skip=()):
    cells = {TP: tp_source or variant(LESSON, TP, *tp), GPIPE: gpipe_source or variant(LESSON, GPIPE, *gpipe),
             ONE_F_ONE_B: one_f_one_b_source or variant(LESSON, ONE_F_ONE_B, *one_f_one_b),
             INTERLEAVED: interleaved_source or solution_source(LESSON, INTERLEAVED)}
    return {grade_id: source for grade_id, source in cells.items() if grade_id not in skip}


LEARNERS = {
    "amy": {grade_id: solution_source(LESSON, grade_id) for grade_id in (TP, GPIPE, ONE_F_ONE_B, INTERLEAVED)},
    "ben": _answers(tp=(("        grad = grad.clone()               # all_reduce works in place: leave autograd's tensor "
                         "alone\n        dist.all_reduce(grad)             # each rank's fc1 block gave only its part of "
                         "dL/dx\n", ""),), gpipe_source=GPIPE_DIVIDED_AFTER, one_f_one_b=NO_WARMUP),
    "cid": _answers(tp=DROPS_THE_FLAGS, gpipe=(("grad = 1.0 / m", "grad = 1.0"),),
                    one_f_one_b_source=BACKWARD_FIRST_1F1B),
    "dee": _answers(tp_source=WHOLE_COPIES, gpipe_source=ONE_AT_A_TIME, skip=(ONE_F_ONE_B,)),
    "eli": _answers(tp=STRIDED, gpipe_source=GPIPE_DIVIDES_WHAT_THERE_IS,
                    one_f_one_b=(("    warmup = min(stage.num_stages - stage.rank - 1, m)\n", "    warmup = m\n"),),
                    interleaved_source=INTERLEAVED_ONE_AT_A_TIME),
}
# amy through the grade command; ben, cid, dee and eli in tests/test_regrade_10.py.
HANDED_IN = {LESSON: {"amy": LEARNERS["amy"]}}


def test_the_instructors_answers_earn_full_marks(graded_lesson):
    """Do the instructor's four answers, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 10, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
