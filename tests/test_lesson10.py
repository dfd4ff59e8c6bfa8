"""Exercises 10.1-10.3's checks against answers that reach for torch's own model parallelism.

10.1 switches DTensor off (``forbid=DTENSOR``) and counts every all-reduce the trace sees,
however it was made; 10.2 and 10.3 switch off every collective and
``torch.distributed.pipelining`` (``forbid=COLLECTIVES + (PIPELINING,)``). Each test grades a
part the way a hidden test cell does (``exercise("10.1").grade(...)``) on fresh gloo ranks and
reads the feedback a learner would read.
"""

from __future__ import annotations

import pytest

from _torch_features import needs_pipelining, needs_public_functional

from autograder import exercise
from autograder.lessons.harness import GradingFailure

# The answers, defined outside this module so that the ranks receive them by value (cloudpickle)
# instead of importing this test file and its imports.
_SOURCE = '''
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Parallelized(nn.Module):
    """parallelize_module doing the work: refused at the mesh it needs first."""

    def __init__(self, fc1, fc2):
        super().__init__()
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        self.net = parallelize_module(nn.Sequential(fc1, nn.GELU(), fc2), mesh,
                                      {"0": ColwiseParallel(), "2": RowwiseParallel()})

    def forward(self, x):
        return self.net(x)


def _functional_sum(t):
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(t, "sum", dist.group.WORLD).wait()


def _process_group_sum(t):
    t = t.clone()
    dist.group.WORLD.allreduce([t]).wait()
    return t


def make_answer(total):
    """The instructor's f and g, summing with ``total``."""

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return total(grad)

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            return total(partial)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class MLP(nn.Module):
        def __init__(self, fc1, fc2, g=Reduce.apply):
            super().__init__()
            rank, p = dist.get_rank(), dist.get_world_size()
            k = fc1.out_features // p
            mine = slice(rank * k, (rank + 1) * k)
            self.w1 = nn.Parameter(fc1.weight.detach()[mine].clone())
            self.b1 = nn.Parameter(fc1.bias.detach()[mine].clone())
            self.w2 = nn.Parameter(fc2.weight.detach()[:, mine].clone())
            self.b2 = nn.Parameter(fc2.bias.detach().clone())
            self.g = g

        def forward(self, x):
            h = F.gelu(F.linear(Copy.apply(x), self.w1, self.b1))
            return self.g(F.linear(h, self.w2)) + self.b2

    MLP.Copy, MLP.Reduce = Copy, Reduce
    return MLP


def _sum_unless_alone(t):
    """Megatron's way: on one rank there is nothing to add, so no call is made."""
    if dist.get_world_size() == 1:
        return t
    t = t.clone()
    dist.all_reduce(t)
    return t


FunctionalMLP = make_answer(_functional_sum)
ProcessGroupMLP = make_answer(_process_group_sum)
SkipsAlone = make_answer(_sum_unless_alone)


class SwappedFG(make_answer(_sum_unless_alone)):
    """g before fc1 and f after fc2: the input summed in forward, the output's gradient in backward."""

    def forward(self, x):
        h = F.gelu(F.linear(self.Reduce.apply(x), self.w1, self.b1))
        return self.Copy.apply(F.linear(h, self.w2)) + self.b2


class FunctionalWithoutG(FunctionalMLP):
    """g left to the functional all-reduce's own backward, which sums the gradient again."""

    def __init__(self, fc1, fc2):
        import torch.distributed._functional_collectives as funcol

        super().__init__(fc1, fc2, g=lambda t: funcol.all_reduce(t, "sum", dist.group.WORLD))


def gathers_activations(stage, microbatches):
    import torch.distributed._functional_collectives as funcol

    funcol.all_gather_tensor(torch.ones(2), 0, dist.group.WORLD)


def one_at_a_time(stages, microbatches):
    """Two chunks, one micro-batch at a time through both and back: right gradients, no pipeline."""
    m = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        for stage in stages:
            x = inputs if stage.is_first else torch.empty(stage.input_shape)
            if not stage.is_first:
                dist.recv(x, src=stage.prev_rank)
            y = stage.forward(i, x, targets if stage.is_last else None)
            if not stage.is_last:
                dist.send(y, dst=stage.next_rank)
        for stage in reversed(stages):
            grad = 1.0 / m if stage.is_last else torch.empty(stage.output_shape)
            if not stage.is_last:
                dist.recv(grad, src=stage.next_rank)
            g = stage.backward(i, grad)
            if not stage.is_first:
                dist.send(g, dst=stage.prev_rank)


def torch_pipeline(stage, microbatches):
    from torch.distributed.pipelining import PipelineStage

    PipelineStage(nn.Linear(6, 6), stage.rank, stage.num_stages, torch.device("cpu"))
'''
_ANSWERS = {"__name__": "lesson10_test_answers"}
exec(compile(_SOURCE, "<10.x test answers>", "exec"), _ANSWERS)


def test_10_1_refuses_dtensor_with_the_exercises_reason(factory):
    """Does a TensorParallelMLP that hands the work to parallelize_module fail, saying DTensor is switched off and why?"""
    ex = exercise("10.1")
    with pytest.raises(GradingFailure, match=r"forward: rank 0 called torch's own DTensor on 1 rank.*init_device_mesh "
                                             r"is switched off here: Exercise 10\.1 asks you to build tensor "
                                             r"parallelism yourself") as info:
        ex.grade(_ANSWERS["Parallelized"], "forward")
    assert ex.forbid_reason in str(info.value)


@needs_public_functional
@pytest.mark.parametrize("answer", ["FunctionalMLP", "ProcessGroupMLP"])
def test_10_1_counts_an_all_reduce_however_it_is_made(factory, answer):
    """Do f and g that sum with a functional collective, or a ProcessGroup's allreduce, earn the gradients and
    the communication part: one all-reduce in forward and one in backward, whichever way each was made?"""
    ex = exercise("10.1")
    for part in ("backward", "communication"):
        ex.grade(_ANSWERS[answer], part)


def test_10_1_accepts_no_call_on_one_rank_and_names_swapped_f_and_g(factory):
    """Does an answer that skips the all-reduces on one rank (nothing to add there) earn every part, and does one
    with f and g swapped (the input summed in forward: the output and the input differ in width, so the trace
    tells) lose the communication part, saying so?"""
    ex = exercise("10.1")
    for part in ("forward", "backward", "communication", "shards"):
        ex.grade(_ANSWERS["SkipsAlone"], part)
    with pytest.raises(GradingFailure, match=r"communication: on 2 ranks, float64, rank \d's forward made all_reduce of "
                                             r"\d+ bytes; it should make exactly one all-reduce, of fc2's output \(g\).*"
                                             r"Are f and g swapped\?"):
        ex.grade(_ANSWERS["SwappedFG"], "communication")


def test_10_2_refuses_the_1f1b_order(factory):
    """Does a 1F1B schedule, right in gradients, messages and bubble, lose 10.2's bubble part, saying that GPipe runs
    every forward before any backward?"""
    from autograder.lessons.reference import one_f_one_b_step

    ex = exercise("10.2")
    ex.grade(one_f_one_b_step, "gradients")
    ex.grade(one_f_one_b_step, "messages")
    with pytest.raises(GradingFailure, match=r"bubble: with \d stages and \d micro-batches, stage \d ran micro-batch \d's "
                                             r"backward before micro-batch \d's forward\. GPipe runs every micro-batch "
                                             r"forward, then every one backward"):
        ex.grade(one_f_one_b_step, "bubble")


@needs_public_functional
def test_10_1_names_an_all_reduce_that_autograd_differentiates_by_itself(factory):
    """Does a g left to the functional all-reduce's own backward (a second sum) lose the communication part, with
    feedback that lists both backward all-reduces, says how they were made and says why there are two?"""
    with pytest.raises(GradingFailure, match=r"(?s)communication: .*backward made all_reduce of \d+ bytes \(a functional "
                                             r"collective\), all_reduce of \d+ bytes \(a functional collective\).*"
                                             r"g's all-reduce was differentiated too"):
        exercise("10.1").grade(_ANSWERS["FunctionalWithoutG"], "communication")


@needs_pipelining
@pytest.mark.parametrize("number", ["10.2", "10.3"])
def test_pipeline_exercises_refuse_torchs_pipelining_and_functional_gathers(factory, number):
    """Do 10.2 and 10.3 refuse torch.distributed.pipelining and _functional_collectives.all_gather_tensor (every
    collective, however it is reached), each with the exercise's reason and the harness's words for what was called?"""
    ex = exercise(number)
    with pytest.raises(GradingFailure, match=r"rank \d called torch's own pipelining \(torch\.distributed\.pipelining\) "
                                             r"on 2 ranks.*PipelineStage is switched off here") as info:
        ex.grade(_ANSWERS["torch_pipeline"], "gradients")
    assert ex.forbid_reason in str(info.value)
    with pytest.raises(GradingFailure, match=r"rank \d called a built-in collective on 2 ranks.*_functional_collectives"
                                             r"\.all_gather_tensor is switched off here") as info:
        ex.grade(_ANSWERS["gathers_activations"], "gradients")
    assert ex.forbid_reason in str(info.value)


def test_10_4_earns_both_parts_with_a_breadth_first_schedule_and_names_one_that_does_not_pipeline(factory):
    """Does the breadth-first interleaved schedule earn 10.4's gradients and bubble, and does one that takes each
    micro-batch through both chunks and back before the next (right gradients) lose the bubble, quoting the formula
    and showing its steps?"""
    from autograder.lessons.reference import interleaved_step

    ex = exercise("10.4")
    ex.grade(interleaved_step, "gradients")
    ex.grade(interleaved_step, "bubble")
    ex.grade(_ANSWERS["one_at_a_time"], "gradients")
    with pytest.raises(GradingFailure, match=r"(?s)bubble: with 2 stages and 4 micro-batches, 2 chunks per rank: .*a "
                                             r"bubble of \(p - 1\) / \(v m \+ p - 1\) = 1/9\..*stage 0 \| F0a"):
        ex.grade(_ANSWERS["one_at_a_time"], "bubble")
