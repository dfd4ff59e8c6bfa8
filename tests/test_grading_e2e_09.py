"""Lesson 09 graded end to end with the real nbgrader: ShardedOptimizers with frozen and unused parameters.

A temporary copy of the course receives two learners' versions of lesson 09 and is graded
with `python -m autograder grade`, the instructor's command (issue 48: frozen and unused
parameters through the instructor's grade command): the instructor's ZeRO-1, and a zero given
to the optimizer in place of every missing gradient (frozen and unused parameters then move).
The other mistakes of ``MISTAKES`` (a step() that exchanges but never steps, state not sharded,
gradients summed, shards never gathered, a whole-model inner step) and two right answers of
other shapes (one flat slice that keeps the frozen layer and puts back the values of parameters
without a gradient after its step; a subclass of ``torch.optim.Optimizer``) are decided by the
clean re-grade alone in tests/test_regrade_09.py.
"""
from __future__ import annotations

import pytest

from _grading import with_mistakes

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "09-sharding"
ANSWER = "ex9_1-shardedoptimizer"

# Each learner's changes to the instructor's answer: (old, new) pairs.
GATHER = "flat = torch.empty_like(grads)\n        all_gather_flat(flat, torch.cat([piece.detach() for _, piece in self.pieces]))"
MISTAKES = {
    # Every rank keeps the whole flat vector, all-reduces the whole gradient and steps everything.
    "ben": (("start, end = self.rank * self.shard, (self.rank + 1) * self.shard",
             "start, end = 0, self.shard * self.world_size"),
            ("mean = torch.empty(self.shard, dtype=grads.dtype)\n        reduce_scatter_flat(mean, grads)",
             "mean = grads.clone()\n        dist.all_reduce(mean)"),
            (GATHER, "flat = torch.cat([piece.detach() for _, piece in self.pieces])")),
    # The reduce-scatter's sum goes to the optimizer as it is.
    "cal": (("mean /= self.world_size", "mean /= 1"),),
    # No all-gather: each rank writes back its own updated slice only.
    "dan": ((GATHER, "flat = self.flatten([p.detach() for p in self.params])\n"
                     "        flat[self.rank * self.shard:(self.rank + 1) * self.shard] = "
                     "torch.cat([piece.detach() for _, piece in self.pieces])"),),
    # The inner optimizer gets the model's parameters too, so every rank steps the whole model.
    "eve": (("self.optimizer = optimizer_cls([piece for _, piece in self.pieces], **kwargs)",
             "self.optimizer = optimizer_cls([piece for _, piece in self.pieces] + self.params, **kwargs)"),),
    # Right, in another shape: a torch optimizer itself (schedulers and state_dict see every parameter), whose
    # own param_groups list the whole model while its inner optimizer steps the shard.
    "fay": (("class ShardedOptimizer:", "class ShardedOptimizer(torch.optim.Optimizer):"),
            ("        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()\n",
             "        super().__init__(self.params, kwargs)\n"
             "        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()\n"),
            ("    def step(self):", "    def step(self, closure=None):")),
    # Issue 48: every parameter in the flat vector, and a zero for every missing gradient: the frozen layer decays
    # under AdamW, the branch the last steps skip coasts on SGD's momentum.
    "gus": (("self.params = [p for p in params if p.requires_grad]", "self.params = list(params)"),
            (" if has_grad else None", "")),
    # Issue 43: the exchange without the step: the untouched slices go round.
    "hal": (("        self.optimizer.step()                                  # steps my slice only\n", ""),),
}
# Right, in a third shape: one flat slice for the inner optimizer, the frozen layer kept in it, and after each step
# the values of the parameters that had no gradient put back.
FLAT_SLICE = """class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = list(params)
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.shard = -(-self.numel // self.world_size)
        mine = self.flatten([p.detach() for p in self.params])[self.rank * self.shard:(self.rank + 1) * self.shard]
        self.local = nn.Parameter(mine.clone())
        self.optimizer = optimizer_cls([self.local], **kwargs)

    def flatten(self, tensors):
        return F.pad(torch.cat([t.reshape(-1) for t in tensors]), (0, self.shard * self.world_size - self.numel))

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = self.flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        idle = self.flatten([torch.full_like(p, p.grad is None) for p in self.params]).bool()
        idle = idle[self.rank * self.shard:(self.rank + 1) * self.shard]
        mean = torch.empty_like(self.local)
        reduce_scatter_flat(mean, grads)
        self.local.grad = mean / self.world_size
        before = self.local.detach().clone()
        self.optimizer.step()
        self.local[idle] = before[idle]          # no gradient, no change
        flat = torch.empty_like(grads)
        all_gather_flat(flat, self.local.detach())
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
"""
# What each learner hands in (tests/conftest.py grades them with the session's other learners):
# amy the instructor's answer, gus his mistake; the others in tests/test_regrade_09.py.
GRADED = ("amy", "gus")
HANDED_IN = {LESSON: {who: answers for who, answers in with_mistakes(LESSON, ANSWER, MISTAKES).items() if who in GRADED}}


def test_the_instructors_sharded_optimizer_earns_full_marks(graded_lesson):
    """Does the instructor's ShardedOptimizer, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_a_zero_for_a_missing_gradient_loses_the_parts_that_compare_parameters(graded_lesson):
    """Does an optimizer that steps the frozen layer and a zero for every missing gradient lose "sgd" and "adamw",
    with feedback naming a parameter that moved without a gradient and the fix, and keep "state" and "traffic"?"""
    assert graded_lesson.scores("gus") == {**graded_lesson.points, "sgd": 0, "adamw": 0}
    graded_lesson.check_feedback("gus", "moved, though", "A zero in place of a missing gradient is not the same")


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 09, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
