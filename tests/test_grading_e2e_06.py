"""Lesson 06 graded end to end with the real nbgrader: realistic wrong wrappers lose the right parts.

A temporary copy of the course receives two learners' versions of lesson 06 and is graded
with `python -m autograder grade`, the instructor's command: the instructor's answers to
6.1 (one all-reduce per parameter) and 6.2 (MiniDDP), and mistakes made from them, each a
line or two away from the answer: a 6.1 that waits for each all-reduce inside its hook and
gives a parameter no rank used a zero gradient, and a MiniDDP with no broadcast at construction.
The feedback page must show each failing part as its exercise, part, points and message, without
the checks' own traceback. Three more learners (a MiniDDP whose sum is never divided by the world
size, a 6.1 that never waits, MiniDDPs that reduce every bucket after backward or never wait) are
decided by the clean re-grade alone in tests/test_regrade_06.py.
"""
from __future__ import annotations

import pytest

from _grading import variant
from devtools.scratch import solution_source

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "06-ddp"
PER_PARAMETER, MINIDDP = "ex6_1-perparameterddp", "ex6_2-miniddp"

# Each learner's changes to the instructor's answers: (old, new) pairs, per answer cell.
MISTAKES_6_1 = {
    # The hook waits for its own all-reduce: right gradients, but backward stops at every parameter.
    "ben": (("        self.pending.append((param, work))\n",
             "        work.wait()\n        self.pending.append((param, work))\n"),
            # ... and hands every trainable parameter a gradient, a zero one where none came (issue 48).
            ("            param.grad /= dist.get_world_size()\n        self.pending = []",
             "            param.grad /= dist.get_world_size()\n        self.pending = []\n"
             "        for param in self.module.parameters():\n"
             "            if param.requires_grad and param.grad is None:\n"
             "                param.grad = torch.zeros_like(param)")),
    # finish_gradient_synchronization divides whatever is there: the all-reduces are never waited for.
    "cid": (("            work.wait()                            # only now does param.grad hold the sum\n", ""),),
}
MISTAKES_6_2 = {
    # Each rank keeps the weights it built: nothing makes them rank 0's.
    "ben": (("dist.broadcast(tensor, src=0)", "pass"),),
    # The hook counts but never starts a bucket: finish starts them all, after backward.
    "cid": (("            self._start(b)\n\n    def _start", "            pass\n\n    def _start"),
            # ... and writes the mean back into every parameter of a bucket, a zero into one whose gradient never came.
            ("                if p.grad is not None:              # one that never came stays None: no rank used it\n"
             "                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n"
             "                offset += p.numel()",
             "                mean = flat[offset:offset + p.numel()].view_as(p)\n"
             "                offset += p.numel()\n"
             "                p.grad = mean.clone() if p.grad is None else p.grad.copy_(mean)")),
    # The result is read whether or not the all-reduce has finished.
    "dee": (("            work.wait()                             # only now does flat hold the sum\n", ""),),
    # The sum is copied back as it is.
    "eli": (("            flat /= dist.get_world_size()\n", ""),),
}


def _answers(who: str) -> dict[str, str]:
    return {cell: variant(LESSON, cell, *mistakes[who]) if who in mistakes else solution_source(LESSON, cell)
            for cell, mistakes in ((PER_PARAMETER, MISTAKES_6_1), (MINIDDP, MISTAKES_6_2))}


# What each learner hands in (tests/conftest.py grades them with the session's other learners):
# amy the instructor's answers, ben his mistakes (cid's, dee's and eli's: tests/test_regrade_06.py).
HANDED_IN = {LESSON: {who: _answers(who) for who in ("amy", "ben")}}


def test_the_instructors_answers_earn_full_marks(graded_lesson):
    """Do the instructor's PerParameterDDP and MiniDDP, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_waiting_in_the_hook_and_no_broadcast_lose_only_their_parts(graded_lesson):
    """Does a 6.1 that waits inside its hook lose 'per_parameter', one that gives an unused parameter a zero gradient
    'unused', and a MiniDDP that never broadcasts 'broadcast', and nothing else, with feedback that says what to change?"""
    assert graded_lesson.scores("ben") == {**graded_lesson.points, "6.1/per_parameter": 0, "6.1/unused": 0,
                                           "6.2/broadcast": 0}
    graded_lesson.check_feedback("ben", "were waited for during backward", "wait for it only in finish_gradient_synchronization()",
                                 "broadcast every parameter and buffer from rank 0",
                                 "spare.weight, which no rank used, has a gradient", "None and zero are not the same")


def test_feedback_shows_part_verdict_and_message_not_the_checks_traceback(graded_lesson):
    """Does each failing part's cell on the feedback page read 'Exercise N.M, part "p": 0 of k points.' followed by the
    message, with no frame of the grading code (exercise.py, lesson06.py, gradcheck.py)?"""
    graded_lesson.check_verdicts("ben", {"6.1/per_parameter", "6.1/unused", "6.2/broadcast"})


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 06, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
