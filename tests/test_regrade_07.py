"""Lesson 07's mistakes that the clean re-grade alone decides: three launcher scripts, two of them with a resume.

Each learner's notebook is written as `python -m autograder grade` receives it and decided by the
clean re-grade (``autograder.grading.clean``, whose verdicts are the only ones grading counts),
without nbgrader or a kernel (tests/_grading.py, :func:`regrade`): 7.1 under real torchrun agents,
7.2 under agents whose processes are killed. The learners are tests/test_grading_e2e_07.py's
(``LEARNERS``, whose docstring lists each one's mistakes), which tries the grade command's own
path on lesson 07 with the instructor's answers.
"""

from __future__ import annotations

import pytest

from _grading import regrade
from test_grading_e2e_07 import LEARNERS, LESSON, lost

pytestmark = pytest.mark.slow  # each test runs a clean re-grade of the whole lesson, torchrun agents and all


def test_a_hard_coded_rank_and_the_rng_restored_on_rank_zero_lose_their_parts(tmp_path):
    """Does rank = 0 everywhere lose 7.1's result, one-writer and other-topology parts, and the RNG restored on rank 0
    only lose 7.2's resumes and reshard (both resume), with feedback naming RANK, the RNG restored on some ranks only
    and the fault's seed?"""
    graded = regrade(tmp_path, LESSON, "ben", LEARNERS["ben"])
    assert graded.scores() == lost(graded, e7_1=("same_result", "rank_zero_only", "any_topology"),
                                   e7_2=("resumes", "reshard"))
    graded.check_feedback("torch.save was called 4 times", "global RANK", "RNG state was not the checkpoint's",
                          "restored on some ranks only", "fault seed")


def test_every_rank_writing_no_destroy_and_a_half_written_load_are_each_named(tmp_path):
    """Do every process saving and no destroy_process_group lose exactly their 7.1 parts, and a resume that loads a
    half-written checkpoint lose 7.2's atomic only, each named in the feedback?"""
    graded = regrade(tmp_path, LESSON, "cid", LEARNERS["cid"])
    assert graded.scores() == lost(graded, e7_1=("rank_zero_only", "clean_exit", "any_topology"), e7_2=("atomic",))
    graded.check_feedback("Exactly one process, global rank 0, must write the checkpoint", "dist.destroy_process_group()",
                          "was writing when it was killed")


def test_expecting_local_rank_argument_fails_with_the_fix_and_an_unanswered_72_earns_nothing(tmp_path):
    """Does a script that requires --local-rank score 0 on 7.1, the feedback saying torchrun sets LOCAL_RANK instead,
    and 7.2's untouched stub earn nothing on any of its parts?"""
    graded = regrade(tmp_path, LESSON, "dee", LEARNERS["dee"])
    assert set(graded.scores().values()) == {0}
    graded.check_feedback("read LOCAL_RANK from the environment")
