"""Lesson 07 graded end to end with the real nbgrader: launcher-ready scripts, right and wrong.

A temporary copy of the course receives four learners' versions of lesson 07 and is graded
with `python -m autograder grade`, the instructor's command. Each learner's `main()` runs
under real torchrun agents (two simulated hosts of two processes, and one host of three):
the instructor's answer, and three mistakes from the lesson: a hard-coded rank, every
process writing the checkpoint without destroying its process group, and a script that
expects the `--local-rank` argument of the old launcher.
"""

from __future__ import annotations

import pytest

from _grading import with_mistakes

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "07-launching-at-scale"
ANSWER = "ex7_1-main"

# Each learner's changes to the instructor's answer: (old, new) pairs.
RANK_LINE = '    rank = int(os.environ["RANK"])              # the global rank, not LOCAL_RANK: it is 0 once per host\n'
MISTAKES = {
    # Every process believes it is rank 0: the same shard everywhere, and everyone saves and logs.
    "ben": ((RANK_LINE, "    rank = 0\n"),),
    # Everyone saves, and nobody destroys the process group.
    "cid": (("    if rank == 0:                               # once per job\n", "    if True:\n"),
            ("\n    dist.destroy_process_group()", "")),
    # Written for torch.distributed.launch: requires --local-rank, which torchrun never passes.
    "dee": ((RANK_LINE, RANK_LINE + "    import argparse\n    parser = argparse.ArgumentParser()\n"
             '    parser.add_argument("--local-rank", type=int, required=True)\n    parser.parse_args()\n'),),
}
# What each learner hands in (tests/conftest.py grades them with the session's other learners):
# amy the instructor's answer, the others their mistakes.
HANDED_IN = {LESSON: with_mistakes(LESSON, ANSWER, MISTAKES)}


def test_the_instructors_script_earns_full_marks(graded_lesson):
    """Does the instructor's main(), run by two torchrun agents and by one, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_a_hard_coded_rank_loses_the_result_and_the_single_writer(graded_lesson):
    """Does rank = 0 everywhere lose the result, the one-writer part and the other topology, with feedback naming RANK?"""
    assert graded_lesson.scores("ben") == {**graded_lesson.points, "same_result": 0, "rank_zero_only": 0, "any_topology": 0}
    graded_lesson.check_feedback("ben", "torch.save was called 4 times", "global RANK")


def test_every_rank_writing_and_no_destroy_are_both_named(graded_lesson):
    """Do every process saving and no destroy_process_group lose exactly their parts, each named in the feedback?"""
    assert graded_lesson.scores("cid") == {**graded_lesson.points, "rank_zero_only": 0, "clean_exit": 0, "any_topology": 0}
    graded_lesson.check_feedback("cid", "Exactly one process, global rank 0, must write the checkpoint",
                                 "dist.destroy_process_group()")


def test_expecting_local_rank_argument_fails_with_the_fix(graded_lesson):
    """Does a script that requires --local-rank score 0, the feedback saying torchrun sets LOCAL_RANK instead?"""
    assert set(graded_lesson.scores("dee").values()) == {0}
    graded_lesson.check_feedback("dee", "read LOCAL_RANK from the environment")


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 07, graded without an error of the course's?"""
    graded_lesson.check_every_learner_graded()
