"""Lesson 09 graded end to end with the real nbgrader: realistic wrong ShardedOptimizers lose the right parts.

A temporary copy of the course receives six learners' versions of lesson 09 and is graded
with `python -m autograder grade`, the instructor's command: the instructor's ZeRO-1, the same
as a subclass of ``torch.optim.Optimizer`` (full marks too), and four mistakes made from it,
each a few lines away from the answer: state not sharded (every rank keeps a copy of all the
parameters, all-reduces and steps it: DDP with extra steps), gradients summed instead of
averaged, updated shards never gathered, and an inner optimizer that steps the whole model
besides the shard.
"""

from __future__ import annotations

import pytest

from _grading import with_mistakes

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "09-sharding"
ANSWER = "ex9_1-shardedoptimizer"

# Each learner's changes to the instructor's answer: (old, new) pairs.
MISTAKES = {
    # Every rank keeps the whole flat vector, all-reduces the whole gradient and steps everything.
    "ben": (("mine = flat[self.rank * self.shard:(self.rank + 1) * self.shard]", "mine = flat"),
            ("mean = torch.empty_like(self.local)\n        reduce_scatter_flat(mean, grads)",
             "mean = grads.clone()\n        dist.all_reduce(mean)"),
            ("flat = torch.empty_like(grads)\n        all_gather_flat(flat, self.local.detach())",
             "flat = self.local.detach()")),
    # The reduce-scatter's sum goes to the optimizer as it is.
    "cal": (("self.local.grad = mean.div_(self.world_size)", "self.local.grad = mean"),),
    # No all-gather: each rank writes back its own updated slice only.
    "dan": (("flat = torch.empty_like(grads)\n        all_gather_flat(flat, self.local.detach())",
             "flat = self.flatten([p.detach() for p in self.params])\n"
             "        flat[self.rank * self.shard:(self.rank + 1) * self.shard] = self.local.detach()"),),
    # The inner optimizer gets the model's parameters too, so every rank steps the whole model.
    "eve": (("self.optimizer = optimizer_cls([self.local], **kwargs)",
             "self.optimizer = optimizer_cls([self.local] + self.params, **kwargs)"),),
    # Right, in another shape: a torch optimizer itself (schedulers and state_dict see every parameter), whose
    # own param_groups list the whole model while its inner optimizer steps the shard.
    "fay": (("class ShardedOptimizer:", "class ShardedOptimizer(torch.optim.Optimizer):"),
            ("        self.params = list(params)\n",
             "        self.params = list(params)\n        super().__init__(self.params, kwargs)\n"),
            ("    def step(self):", "    def step(self, closure=None):")),
}
# What each learner hands in (tests/conftest.py grades them with the session's other learners):
# amy the instructor's answer, the others their mistake.
HANDED_IN = {LESSON: with_mistakes(LESSON, ANSWER, MISTAKES)}


def test_the_instructors_sharded_optimizer_earns_full_marks(graded_lesson):
    """Does the instructor's ShardedOptimizer, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_state_not_sharded_loses_state_and_traffic(graded_lesson):
    """Does an optimizer that keeps and steps every parameter on every rank (an all-reduce, no shards) keep the
    parts that compare parameters and lose the state and traffic parts, with feedback naming both mistakes?"""
    assert graded_lesson.scores("ben") == {**graded_lesson.points, "state": 0, "traffic": 0}
    graded_lesson.check_feedback("ben", "the whole model", "step() called all_reduce")


def test_summed_gradients_are_named(graded_lesson):
    """Does an optimizer that sums the ranks' gradients lose the SGD part, with feedback that says to divide?"""
    got = graded_lesson.scores("cal")
    assert got["sgd"] == 0 and got["state"] == graded_lesson.points["state"]
    assert got["traffic"] == graded_lesson.points["traffic"]
    graded_lesson.check_feedback("cal", "divide its result by the world size")


def test_shards_never_gathered_lose_every_part_but_state(graded_lesson):
    """Does an optimizer that never all-gathers lose the parameter and traffic parts, saying that the ranks disagree?"""
    assert graded_lesson.scores("dan") == {**graded_lesson.points, "sgd": 0, "adamw": 0, "traffic": 0}
    graded_lesson.check_feedback("dan", "differs from rank 0", "all-gather the updated shards")


def test_a_whole_model_step_loses_only_the_state_part(graded_lesson):
    """Does an inner optimizer that also steps every model parameter lose the state part alone, and say so?"""
    assert graded_lesson.scores("eve") == {**graded_lesson.points, "state": 0}
    graded_lesson.check_feedback("eve", "the whole model")


def test_a_subclass_of_torchs_optimizer_earns_full_marks(graded_lesson):
    """Does a correct ShardedOptimizer that subclasses torch.optim.Optimizer (the whole model in its own
    param_groups, the shard stepped by an inner optimizer) earn every point, "state" included?"""
    assert graded_lesson.scores("fay") == graded_lesson.points


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 09, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
