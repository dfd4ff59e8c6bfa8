"""Lesson 08 graded end to end with the real nbgrader: three broken programs, repaired or not.

A temporary copy of the course receives two learners' versions of lesson 08 and is graded
with `python -m autograder grade`, the instructor's command: the instructor's answer, and a
learner who repaired only the hang (the other two programs still crash a rank or hang). The
untouched notebook and repairs that dodge the work (``DODGES``) are decided by the clean
re-grade alone in tests/test_regrade_08.py.
"""

from __future__ import annotations

import pytest

from devtools.scratch import solution_source

LESSON = "08-debugging-and-performance"
ANSWER = "ex8_1-repaired"

# The broken programs of the lesson, as method bodies (8 spaces in).
BROKEN = {
    "global_mean": "        local = x.mean()\n        dist.all_reduce(local)\n        return local\n",
    "gather_all": ("        pieces = [torch.empty_like(x) for _ in range(world_size)]\n"
                   "        dist.all_gather(pieces, x)\n        return torch.cat(pieces)\n"),
}
# Repairs that dodge the work.
DODGES = {
    "pass_right": ("        everyone = [torch.empty_like(x) for _ in range(world_size)]\n"
                   "        dist.all_gather(everyone, x)\n        return everyone[(rank - 1) % world_size]\n"),
    "global_mean": "        return torch.tensor(0.8)   # what the lesson's example should have given\n",
    "gather_all": ("        length = torch.tensor([x.numel()])\n"
                   "        lengths = [torch.zeros_like(length) for _ in range(world_size)]\n"
                   "        dist.all_gather(lengths, length)\n"
                   "        longest = max(int(n) for n in lengths)\n"
                   "        padded = torch.cat([x, x[-1].repeat(longest - x.numel())])   # pads with the last element\n"
                   "        pieces = [torch.empty_like(padded) for _ in range(world_size)]\n"
                   "        dist.all_gather(pieces, padded)\n"
                   "        return torch.cat([piece[: int(n)] for piece, n in zip(pieces, lengths)])\n"),
}


def _with_bodies(bodies: dict[str, str]) -> str:
    """The instructor's answer cell with some methods' bodies replaced."""
    source = solution_source(LESSON, ANSWER)
    for method, body in bodies.items():
        head = f"    def {method}(rank, world_size, x):\n"
        start = source.index(head)
        doc_end = source.index('"""\n', source.index('"""', start + len(head)) + 3) + 4  # end of the docstring
        end = source.find("\n    @staticmethod", doc_end)
        source = source[:doc_end] + body + (source[end:] if end != -1 else "")
    return source


LEARNERS = {
    "amy": solution_source(LESSON, ANSWER),   # the instructor's answer
    "ben": _with_bodies(BROKEN),              # repaired the hang only
    "cid": _with_bodies(DODGES),              # decided in tests/test_regrade_08.py
    "sam": None,                              # hands in the notebook untouched; tests/test_regrade_08.py
}
GRADED = ("amy", "ben")  # through the grade command; the others by the clean re-grade alone


# What each learner hands in (tests/conftest.py grades them with the session's other learners).
HANDED_IN = {LESSON: {who: {ANSWER: LEARNERS[who]} for who in GRADED}}


def test_the_learner_variants_are_what_they_claim():
    """Do the variants differ from the answer exactly in the methods they replace (so the test grades what it says)?"""
    answer = LEARNERS["amy"]
    assert "dist.isend(x" in answer and "dist.isend(x" in LEARNERS["ben"]
    assert "totals" not in LEARNERS["ben"] and "local = x.mean()" in LEARNERS["ben"]
    assert "dist.isend(x" not in LEARNERS["cid"] and "return torch.tensor(0.8)" in LEARNERS["cid"]
    for source in LEARNERS.values():
        if source:
            compile(source, "answer", "exec")
            assert source.count("@staticmethod") == 3


@pytest.mark.slow
def test_the_instructors_answer_earns_full_marks(graded_lesson):
    """Do the instructor's three repairs, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


@pytest.mark.slow
def test_repairing_only_the_hang_earns_only_the_hang(graded_lesson):
    """Does a learner who repaired pass_right alone earn its part, the feedback saying what the other two did wrong?"""
    assert graded_lesson.scores("ben") == {**graded_lesson.points, "wrong_result": 0, "crash": 0}
    # The broken all_gather crashes a rank, or hangs when a rank holds nothing: either way the part and the ranks are named.
    graded_lesson.check_feedback("ben", "global_mean: on 2 ranks", "a mean of means is wrong",
                                 "all_gather", "rank ")
    graded_lesson.check_verdicts("ben", {"wrong_result", "crash"})


@pytest.mark.slow
def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 08, graded without an error of the course's?"""
    graded_lesson.check_every_learner_graded()
    assert "check itself failed" not in "".join(graded_lesson.feedback(who) for who in GRADED)
