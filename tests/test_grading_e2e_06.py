"""Lesson 06 graded end to end with the real nbgrader: realistic wrong MiniDDPs lose the right parts.

A temporary copy of the course receives five learners' versions of lesson 06 and is graded
with `python -m autograder grade`, the instructor's command: the instructor's MiniDDP, and
four mistakes made from it, each a line or two away from the answer: no broadcast at
construction, every bucket reduced only after backward (no overlap), the all-reduces never
waited for, and the sum never divided by the world size.
"""

from __future__ import annotations

import json

import pytest

from devtools import scratch
from devtools.scratch import feedback, scores, solution_source

LESSON = "06-ddp"
ANSWER = "ex6_1-miniddp"


def _variant(old: str, new: str) -> str:
    source = solution_source(LESSON, ANSWER)
    assert old in source, f"the solution no longer contains {old!r}: update this test's mistakes"
    return source.replace(old, new)


MISTAKES = {
    # Each rank keeps the weights it built: nothing makes them rank 0's.
    "ben": ("dist.broadcast(tensor, src=0)", "pass"),
    # The hook counts but never starts a bucket: finish starts them all, after backward.
    "cid": ("            self._start(b)\n\n    def _start", "            pass\n\n    def _start"),
    # The result is read whether or not the all-reduce has finished.
    "dee": ("            work.wait()                             # only now does flat hold the sum\n", ""),
    # The sum is copied back as it is.
    "eli": ("            flat /= dist.get_world_size()\n", ""),
}
LEARNERS = ["amy", *MISTAKES]  # amy hands in the instructor's answer


LESSONS = [LESSON]


def hand_in(root, submissions):
    """This module's learners, graded with the others of the session (tests/conftest.py's graded_class)."""
    answers = {who: {ANSWER: _variant(*MISTAKES[who]) if who in MISTAKES else solution_source(LESSON, ANSWER)}
               for who in LEARNERS}
    scratch.hand_in(root, submissions, LESSON, answers)


@pytest.fixture(scope="module")
def graded(graded_class):
    return (graded_class[0], *scratch.layout(LESSON, "6.1"))



@pytest.mark.slow
def test_the_instructors_miniddp_earns_full_marks(graded):
    """Does the instructor's MiniDDP, handed in as a learner's, earn every point?"""
    root, cells, points = graded
    assert scores(root, LESSON, cells, "amy") == points


@pytest.mark.slow
def test_no_broadcast_loses_only_the_broadcast_part(graded):
    """Does a MiniDDP that never broadcasts lose the broadcast part alone, with feedback that says what to broadcast?"""
    root, cells, points = graded
    assert scores(root, LESSON, cells, "ben") == {**points, "broadcast": 0}
    assert "broadcast every parameter and buffer from rank 0" in feedback(root, LESSON, "ben")


@pytest.mark.slow
def test_reducing_after_backward_loses_only_the_overlap(graded):
    """Does a MiniDDP that starts every all-reduce after backward lose the overlap part alone, and say why?"""
    root, cells, points = graded
    assert scores(root, LESSON, cells, "cid") == {**points, "overlap": 0}
    assert "so communication overlaps the rest of backward" in feedback(root, LESSON, "cid")


@pytest.mark.slow
def test_never_waiting_loses_the_late_rank_part(graded):
    """Does a MiniDDP that reads its buckets without waiting lose the late-rank part (and score below full)?

    Without a late rank, whether an unwaited all-reduce has finished is a race, so only the
    part that makes one rank late is sure to catch it.
    """
    root, cells, points = graded
    got = scores(root, LESSON, cells, "dee")
    assert got["waits"] == 0 and got["broadcast"] == points["broadcast"]
    assert sum(got.values()) < sum(points.values())
    assert "wait for each all-reduce's work" in feedback(root, LESSON, "dee")


@pytest.mark.slow
def test_forgetting_to_divide_is_named(graded):
    """Does a MiniDDP that never divides lose every part that compares gradients, with feedback naming the division?"""
    root, cells, points = graded
    assert scores(root, LESSON, cells, "eli") == {**points, "gradients": 0, "waits": 0, "buckets": 0, "unused": 0}
    assert "divide the summed bucket by the world size" in feedback(root, LESSON, "eli")


@pytest.mark.slow
def test_grading_run_records_every_learner(graded):
    """Does the run record hold every learner of lesson 06, each graded without an error?"""
    root, _, points = graded
    record = json.loads((root / "autograder" / "grading-run.json").read_text())
    runs = {run["student"]: run for run in record["submissions"] if run["lesson"] == LESSON}
    assert set(runs) == set(LEARNERS)
    assert all(run["status"] == "ok" for run in runs.values()), runs
    assert runs["amy"]["score"] == pytest.approx(sum(points.values()))
