"""Exercises 10.1-10.4's checks against answers that reach for torch's own model parallelism, right answers of
other shapes, and the usual wrong ones.

10.1 switches DTensor off (``forbid=DTENSOR``) and counts every all-reduce the trace sees,
however it was made, accepts any split of the hidden units between the ranks, and probes that
rank 0's output depends on the other ranks; 10.2-10.4 switch off every collective and
``torch.distributed.pipelining`` (``forbid=COLLECTIVES + (PIPELINING,)``), and their gradients
parts run stages with a frozen bias and an unused parameter. Each test grades a part the way a
hidden test cell does (``grade("10.1", ...)``) on fresh gloo ranks and reads the
feedback a learner would read.
"""

from __future__ import annotations

import re

import pytest

from _torch_features import needs_pipelining, needs_public_functional

from autograder import exercise
from autograder.kit.harness import GradingFailure
from autograder.hidden import grade

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


def make_answer(total, keep_flags=True):
    """The instructor's f and g, summing with ``total``; each shard keeps its weight's requires_grad unless told not to."""

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
            if keep_flags:
                for shard, whole in ((self.w1, fc1.weight), (self.b1, fc1.bias), (self.w2, fc2.weight), (self.b2, fc2.bias)):
                    shard.requires_grad_(whole.requires_grad)
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
IgnoresFrozen = make_answer(_sum_unless_alone, keep_flags=False)


class Strided(SkipsAlone):
    """Right, another shape: rank r keeps hidden units r, r + p, r + 2p, ... (fc1's rows, fc2's columns)."""

    def __init__(self, fc1, fc2):
        super().__init__(fc1, fc2)
        rank, p = dist.get_rank(), dist.get_world_size()
        for name, whole, part in (("w1", fc1.weight, (slice(rank, None, p),)), ("b1", fc1.bias, (slice(rank, None, p),)),
                                  ("w2", fc2.weight, (slice(None), slice(rank, None, p)))):
            setattr(self, name, nn.Parameter(whole.detach()[part].clone(), requires_grad=whole.requires_grad))


class WholeCopies(nn.Module):
    """Keeps both whole layers and computes on each rank alone: right values, no tensor parallelism."""

    def __init__(self, fc1, fc2):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class BiasBeforeSum(SkipsAlone):
    """fc2's bias added by every rank inside g, before the all-reduce."""

    def forward(self, x):
        h = F.gelu(F.linear(self.Copy.apply(x), self.w1, self.b1))
        return self.Reduce.apply(F.linear(h, self.w2, self.b2))


class WrongDimension(SkipsAlone):
    """fc1 split along its input features (the columns of nn.Linear's weight), fc2 along its output features."""

    def __init__(self, fc1, fc2):
        super().__init__(fc1, fc2)
        rank, p = dist.get_rank(), dist.get_world_size()
        self.w1 = nn.Parameter(fc1.weight.detach().chunk(p, dim=1)[rank].clone())
        self.w2 = nn.Parameter(fc2.weight.detach().chunk(p, dim=0)[rank].clone())


class DistNnG(SkipsAlone):
    """g left to torch.distributed.nn.functional.all_reduce, whose backward sums the gradient once more."""

    def forward(self, x):
        import torch.distributed.nn.functional as dist_nn

        h = F.gelu(F.linear(self.Copy.apply(x), self.w1, self.b1))
        return dist_nn.all_reduce(F.linear(h, self.w2)) + self.b2


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


def zeroes_every_gradient_first(stages, microbatches):
    """Gives every parameter a zero .grad before the step (zero_grad(set_to_none=False)): a frozen or unused
    parameter ends with zeros, not None."""
    from autograder.answers.lesson10 import gpipe_step, interleaved_step

    for stage in stages if isinstance(stages, list) else [stages]:
        for p in stage.parameters():
            p.grad = torch.zeros_like(p)
    (interleaved_step if isinstance(stages, list) else gpipe_step)(stages, microbatches)


def does_nothing(stage, microbatches):
    return None


def one_at_a_time_1f1b(stage, microbatches):
    """Each micro-batch forward and backward before the next: the memory of one, no pipeline."""
    from autograder.answers.lesson10 import _pipeline_backward, _pipeline_forward

    m, requests = len(microbatches), []
    for i in range(m):
        _pipeline_forward(stage, i, microbatches[i], requests)
        _pipeline_backward(stage, i, m, requests)
    for request, _ in requests:
        request.wait()


def backward_first_1f1b(stage, microbatches):
    """Right, another shape: p - s forwards, then one backward and one forward in turn (1F1B's order)."""
    from autograder.answers.lesson10 import _pipeline_backward, _pipeline_forward

    m, requests = len(microbatches), []
    warmup = min(stage.num_stages - stage.rank, m)
    for i in range(warmup):
        _pipeline_forward(stage, i, microbatches[i], requests)
    for i in range(m):
        _pipeline_backward(stage, i, m, requests)
        if warmup + i < m:
            _pipeline_forward(stage, warmup + i, microbatches[warmup + i], requests)
    for request, _ in requests:
        request.wait()


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
        grade(ex.number, _ANSWERS["Parallelized"], "forward")
    assert ex.forbid_reason in str(info.value)


@needs_public_functional
@pytest.mark.parametrize("answer", ["FunctionalMLP", "ProcessGroupMLP"])
def test_10_1_counts_an_all_reduce_however_it_is_made(factory, answer):
    """Do f and g that sum with a functional collective, or a ProcessGroup's allreduce, earn the gradients and
    the communication part: one all-reduce in forward and one in backward, whichever way each was made?"""
    ex = exercise("10.1")
    for part in ("backward", "communication"):
        grade(ex.number, _ANSWERS[answer], part)


def test_10_1_accepts_no_call_on_one_rank_and_names_swapped_f_and_g(factory):
    """Does an answer that skips the all-reduces on one rank (nothing to add there) earn every part, and does one
    with f and g swapped (the input summed in forward: the output and the input differ in width, so the trace
    tells) lose the communication part, saying so?"""
    ex = exercise("10.1")
    for part in ("forward", "backward", "communication", "shards"):
        grade(ex.number, _ANSWERS["SkipsAlone"], part)
    with pytest.raises(GradingFailure, match=r"communication: on 2 ranks, float64, rank \d's forward made all_reduce of "
                                             r"\d+ bytes; it should make exactly one all-reduce, of fc2's output \(g\).*"
                                             r"Are f and g swapped\?"):
        grade(ex.number, _ANSWERS["SwappedFG"], "communication")


def test_10_2_refuses_the_1f1b_order(factory):
    """Does a 1F1B schedule, right in gradients, messages and bubble, lose 10.2's bubble part, saying that GPipe runs
    every forward before any backward?"""
    from autograder.answers.lesson10 import one_f_one_b_step

    ex = exercise("10.2")
    grade(ex.number, one_f_one_b_step, "gradients")
    grade(ex.number, one_f_one_b_step, "messages")
    with pytest.raises(GradingFailure, match=r"bubble: with \d stages and \d micro-batches, stage \d ran micro-batch \d's "
                                             r"backward before micro-batch \d's forward\. GPipe runs every micro-batch "
                                             r"forward, then every one backward"):
        grade(ex.number, one_f_one_b_step, "bubble")


@needs_public_functional
def test_10_1_names_an_all_reduce_that_autograd_differentiates_by_itself(factory):
    """Does a g left to the functional all-reduce's own backward (a second sum) lose the communication part, with
    feedback that lists both backward all-reduces, says how they were made and says why there are two?"""
    with pytest.raises(GradingFailure, match=r"(?s)communication: .*backward made all_reduce of \d+ bytes \(a functional "
                                             r"collective\), all_reduce of \d+ bytes \(a functional collective\).*"
                                             r"g's all-reduce was differentiated too"):
        grade("10.1", _ANSWERS["FunctionalWithoutG"], "communication")


@needs_pipelining
@pytest.mark.parametrize("number", ["10.2", "10.3"])
def test_pipeline_exercises_refuse_torchs_pipelining_and_functional_gathers(factory, number):
    """Do 10.2 and 10.3 refuse torch.distributed.pipelining and _functional_collectives.all_gather_tensor (every
    collective, however it is reached), each with the exercise's reason and the harness's words for what was called?"""
    ex = exercise(number)
    with pytest.raises(GradingFailure, match=r"rank \d called torch's own pipelining \(torch\.distributed\.pipelining\) "
                                             r"on 2 ranks.*PipelineStage is switched off here") as info:
        grade(ex.number, _ANSWERS["torch_pipeline"], "gradients")
    assert ex.forbid_reason in str(info.value)
    with pytest.raises(GradingFailure, match=r"rank \d called a built-in collective on 2 ranks.*_functional_collectives"
                                             r"\.all_gather_tensor is switched off here") as info:
        grade(ex.number, _ANSWERS["gathers_activations"], "gradients")
    assert ex.forbid_reason in str(info.value)


def test_10_4_earns_both_parts_with_a_breadth_first_schedule_and_names_one_that_does_not_pipeline(factory):
    """Does the breadth-first interleaved schedule earn 10.4's gradients and bubble, and does one that takes each
    micro-batch through both chunks and back before the next (right gradients) lose the bubble, quoting the formula
    and showing its steps?"""
    from autograder.answers.lesson10 import interleaved_step

    ex = exercise("10.4")
    grade(ex.number, interleaved_step, "gradients")
    grade(ex.number, interleaved_step, "bubble")
    grade(ex.number, _ANSWERS["one_at_a_time"], "gradients")
    with pytest.raises(GradingFailure, match=r"(?s)bubble: with 2 stages and 4 micro-batches, 2 chunks per rank: .*a "
                                             r"bubble of \(p - 1\) / \(v m \+ p - 1\) = 1/9\..*stage 0 \| F0a"):
        grade(ex.number, _ANSWERS["one_at_a_time"], "bubble")


def test_10_1_gives_full_marks_to_a_strided_split_of_the_hidden_units(factory):
    """Does a module whose rank r keeps hidden units r, r + p, r + 2p, ... (fc1's rows and bias, fc2's columns, the
    frozen ones frozen) earn the shards part and pass the self-check, as the lesson's blocks do? (Every part, through
    the grade command: tests/test_grading_e2e_10.py.)"""
    grade("10.1", _ANSWERS["Strided"], "shards")
    exercise("10.1").self_check(_ANSWERS["Strided"])


def test_10_1_whole_copies_computed_alone_earn_nothing(factory):
    """Does a module that keeps both whole layers and computes on each rank alone (right values, no communication)
    lose every part, forward and backward because rank 0's results do not change with the other ranks' inputs?"""
    ex = exercise("10.1")
    answer = _ANSWERS["WholeCopies"]
    with pytest.raises(GradingFailure, match=r"forward: on 2 ranks, float64: rank 0's output stayed the same when every "
                                             r"other rank ran forward on another input: rank 0 computed it alone"):
        grade(ex.number, answer, "forward")
    with pytest.raises(GradingFailure, match=r"backward: on 2 ranks, float64: rank 0's input gradient stayed the same"
                                             r".*f's backward sums the parts over the ranks"):
        grade(ex.number, answer, "backward")
    with pytest.raises(GradingFailure, match=r"communication: .*forward made no call at all"):
        grade(ex.number, answer, "communication")
    with pytest.raises(GradingFailure, match=r"shards: .*holds all of fc1\.weight, unsplit"):
        grade(ex.number, answer, "shards")


def test_10_1_a_frozen_weight_must_stay_without_a_gradient(factory):
    """With fc1.weight and fc2.bias given frozen (requires_grad=False), does an answer whose shards ignore the flag
    (so they get gradients) lose the backward part alone, naming the parameter and the fix?"""
    ex = exercise("10.1")
    for part in ("forward", "communication", "shards"):
        grade(ex.number, _ANSWERS["IgnoresFrozen"], part)
    with pytest.raises(GradingFailure, match=r"backward: on 2 ranks, float64: rank 0's w1, which holds "
                                             r"fc1\.weight\[0:6, :\], has a gradient after backward, but fc1\.weight "
                                             r"was given frozen \(requires_grad=False\).*"
                                             r"requires_grad=fc1\.weight\.requires_grad"):
        grade(ex.number, _ANSWERS["IgnoresFrozen"], "backward")


@pytest.mark.parametrize("answer, part, says", [
    ("BiasBeforeSum", "forward", "every rank added the bias before the all-reduce"),
    ("WrongDimension", "shards", "that splits fc1.weight along the wrong dimension. Split fc1.weight by its output"),
    ("DistNnG", "backward", "g's backward must pass the gradient through unchanged"),
    ("DistNnG", "communication", "g's all-reduce was differentiated too"),
])
def test_10_1_names_the_usual_mistakes(factory, answer, part, says):
    """Do fc2's bias added before the sum, fc1 split along its input features and a g whose backward sums again each
    lose their part, with the mistake named?"""
    with pytest.raises(GradingFailure, match=re.escape(says)):
        grade("10.1", _ANSWERS[answer], part)


def test_10_2_a_zero_grad_on_every_parameter_gives_frozen_and_unused_ones_a_gradient(factory):
    """With a frozen bias and an unused parameter on every stage, does a step that first gives every parameter a zero
    .grad (right on the other cases) lose the gradients part, naming the frozen bias and the fix, its messages and
    bubble unharmed? (Dividing every .grad, which raises on them, and dividing only those there are: through the
    grade command, tests/test_grading_e2e_10.py.)"""
    ex = exercise("10.2")
    with pytest.raises(GradingFailure, match=r"gradients: with 3 stages and 4 micro-batches: stage 0's layer bias was "
                                             r"given frozen \(requires_grad=False\), yet after your step its \.grad is a "
                                             r"tensor.*`if p\.grad is not None`"):
        grade(ex.number, _ANSWERS["zeroes_every_gradient_first"], "gradients")
    for part in ("messages", "bubble"):
        grade(ex.number, _ANSWERS["zeroes_every_gradient_first"], part)


def test_10_2_no_hang_pays_only_a_step_that_ran(factory):
    """Does a gpipe_step that returns at once (it cannot hang: it does nothing) lose no_hang, saying what a step runs?"""
    with pytest.raises(GradingFailure, match=r"no_hang: with 2 stages and 8 micro-batches, stage 0 ran forward for "
                                             r"micro-batches \[\]; every stage runs each of the 8 micro-batches"):
        grade("10.2", _ANSWERS["does_nothing"], "no_hang")


def test_10_3_pays_only_the_1f1b_order(factory):
    """Does a schedule that takes one micro-batch at a time (right gradients) lose every part of 10.3 (1F1B), naming
    its order beside 1F1B's, the memory it never filled and the bubble it left? (GPipe's order handed in as 1F1B:
    tests/test_grading_e2e_10.py.)"""
    ex = exercise("10.3")
    fn = _ANSWERS["one_at_a_time_1f1b"]
    with pytest.raises(GradingFailure, match=r"(?s)gradients: with 2 stages and 4 micro-batches, stage 0 ran F0 B0 F1 B1 "
                                             r"F2 B2 F3 B3; 1F1B runs F0 F1 B0 F2 B1 F3 B2 B3 there: p - s - 1 = 1 warm-up "
                                             r"forward,.*the pipeline never fills"):
        grade(ex.number, fn, "gradients")
    with pytest.raises(GradingFailure, match=r"memory: with 2 stages and 4 micro-batches, stage 0 never held more than "
                                             r"1 micro-batch's activations at once; 1F1B first fills the pipeline"):
        grade(ex.number, fn, "memory")
    with pytest.raises(GradingFailure, match=r"bubble: with 2 stages and 4 micro-batches: .*your 1F1B step takes 24 units "
                                             r"and the bubble is 1/2"):
        grade(ex.number, fn, "bubble")


def test_10_3_self_check_passes_1f1b_written_backward_first_and_10_4_keeps_frozen_gradients_none(factory):
    """Does 1F1B written as p - s forwards, then backward-forward pairs, pass 10.3's self-check (its parts: through
    the grade command), and does an interleaved schedule that zeroes every .grad first lose 10.4's gradients on the
    stages with a frozen bias and an unused parameter?"""
    exercise("10.3").self_check(_ANSWERS["backward_first_1f1b"])
    with pytest.raises(GradingFailure, match=r"gradients: with 2 stages and 4 micro-batches: rank 0's chunk 0 \(layer 0 "
                                             r"of 4\) bias was given frozen"):
        grade("10.4", _ANSWERS["zeroes_every_gradient_first"], "gradients")
