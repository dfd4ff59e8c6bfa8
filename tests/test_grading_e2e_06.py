"""Lesson 06 graded end to end with the real nbgrader: realistic wrong MiniDDPs lose the right parts.

A temporary copy of the course receives five learners' versions of lesson 06 and is graded
with `python -m autograder grade`, the instructor's command: the instructor's MiniDDP, and
four mistakes made from it, each a line or two away from the answer: no broadcast at
construction, every bucket reduced only after backward (no overlap), the all-reduces never
waited for, and the sum never divided by the world size.
"""

from __future__ import annotations

import pytest

from _grading import with_mistakes

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "06-ddp"
ANSWER = "ex6_1-miniddp"

# Each learner's changes to the instructor's answer: (old, new) pairs.
MISTAKES = {
    # Each rank keeps the weights it built: nothing makes them rank 0's.
    "ben": (("dist.broadcast(tensor, src=0)", "pass"),),
    # The hook counts but never starts a bucket: finish starts them all, after backward.
    "cid": (("            self._start(b)\n\n    def _start", "            pass\n\n    def _start"),),
    # The result is read whether or not the all-reduce has finished.
    "dee": (("            work.wait()                             # only now does flat hold the sum\n", ""),),
    # The sum is copied back as it is.
    "eli": (("            flat /= dist.get_world_size()\n", ""),),
}
# What each learner hands in (tests/conftest.py grades them with the session's other learners):
# amy the instructor's answer, the others their mistake.
HANDED_IN = {LESSON: with_mistakes(LESSON, ANSWER, MISTAKES)}


def test_the_instructors_miniddp_earns_full_marks(graded_lesson):
    """Does the instructor's MiniDDP, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_no_broadcast_loses_only_the_broadcast_part(graded_lesson):
    """Does a MiniDDP that never broadcasts lose the broadcast part alone, with feedback that says what to broadcast?"""
    assert graded_lesson.scores("ben") == {**graded_lesson.points, "broadcast": 0}
    graded_lesson.check_feedback("ben", "broadcast every parameter and buffer from rank 0")


def test_reducing_after_backward_loses_only_the_overlap(graded_lesson):
    """Does a MiniDDP that starts every all-reduce after backward lose the overlap part alone, and say why?"""
    assert graded_lesson.scores("cid") == {**graded_lesson.points, "overlap": 0}
    graded_lesson.check_feedback("cid", "so communication overlaps the rest of backward")


def test_never_waiting_loses_the_late_rank_part(graded_lesson):
    """Does a MiniDDP that reads its buckets without waiting lose the late-rank part (and score below full)?

    Without a late rank, whether an unwaited all-reduce has finished is a race, so only the
    part that makes one rank late is sure to catch it.
    """
    got = graded_lesson.scores("dee")
    assert got["waits"] == 0 and got["broadcast"] == graded_lesson.points["broadcast"]
    assert sum(got.values()) < graded_lesson.full_marks
    graded_lesson.check_feedback("dee", "wait for each all-reduce's work")


def test_forgetting_to_divide_is_named(graded_lesson):
    """Does a MiniDDP that never divides lose every part that compares gradients, with feedback naming the division?"""
    assert graded_lesson.scores("eli") == {**graded_lesson.points, "gradients": 0, "waits": 0, "buckets": 0, "unused": 0}
    graded_lesson.check_feedback("eli", "divide the summed bucket by the world size")


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 06, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
