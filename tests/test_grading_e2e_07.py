"""Lesson 07 graded end to end with the real nbgrader: launcher-ready scripts and scripts that survive a lost process.

A temporary copy of the course receives four learners' versions of lesson 07 and is graded
with `python -m autograder grade`, the instructor's command. Each learner's `main()` (7.1) runs
under real torchrun agents (two simulated hosts of two processes, and one host of three), and
each `resilient_main()` (7.2) under agents whose processes are killed with SIGKILL, at a random
step and halfway through a checkpoint write: the instructor's answers, and mistakes packed so that
few learners cover many parts: a hard-coded rank (7.1) with the RNG restored on rank 0 only (7.2),
every process writing the checkpoint without destroying its process group (7.1) with a resume that
loads a half-written checkpoint (7.2), and a script that expects the `--local-rank` argument of the
old launcher (7.1) with 7.2 left unanswered.
"""

from __future__ import annotations

import pytest

from _grading import variant, with_mistakes

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "07-launching-at-scale"
ANSWER = "ex7_1-main"
ANSWER_72 = "ex7_2-resilient-main"

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
MISTAKES_72 = {
    # Only rank 0 restores torch's RNG state: the other ranks' dropout masks differ after a restart.
    "ben": (('        torch.set_rng_state(state["rng"])', '        if rank == 0:\n            torch.set_rng_state(state["rng"])'),),
    # Resumes from the newest folder whether or not DCP finished writing it (.metadata).
    "cid": (('if os.path.exists(os.path.join(CKPT_DIR, d, ".metadata"))', ""),),
}
HANDED_IN = {LESSON: {who: {**answers, **({ANSWER_72: variant(LESSON, ANSWER_72, *MISTAKES_72[who])} if who in MISTAKES_72
                                          else {ANSWER_72: variant(LESSON, ANSWER_72)} if who == "amy" else {})}
                      for who, answers in with_mistakes(LESSON, ANSWER, MISTAKES).items()}}
PARTS_71 = ("runs", "same_result", "rank_zero_only", "clean_exit", "any_topology")
PARTS_72 = ("resumes", "no_repeat", "atomic", "reshard", "clean_exit")


def lost(graded_lesson, **zero) -> dict[str, float]:
    """Full marks but for the parts named ``exercise=(part, ...)`` (exercise as ``e7_1``), which earn 0."""
    scores = dict(graded_lesson.points)
    for number, parts in zero.items():
        for part in parts:
            scores[f"{number[1:].replace('_', '.')}/{part}"] = 0
    return scores


def test_the_instructors_script_earns_full_marks(graded_lesson):
    """Do the instructor's main() (two torchrun agents and one) and resilient_main() (killed at a random step and while
    writing a checkpoint, resumed on 2 and 3 processes) earn every point of both exercises?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_a_hard_coded_rank_and_the_rng_restored_on_rank_zero_lose_their_parts(graded_lesson):
    """Does rank = 0 everywhere lose 7.1's result, one-writer and other-topology parts, and the RNG restored on rank 0
    only lose 7.2's resumes and reshard (both resume), with feedback naming RANK, the RNG and the fault's seed?"""
    assert graded_lesson.scores("ben") == lost(graded_lesson, e7_1=("same_result", "rank_zero_only", "any_topology"),
                                               e7_2=("resumes", "reshard"))
    graded_lesson.check_feedback("ben", "torch.save was called 4 times", "global RANK", "RNG state was not the checkpoint",
                                 "fault seed")


def test_every_rank_writing_no_destroy_and_a_half_written_load_are_each_named(graded_lesson):
    """Do every process saving and no destroy_process_group lose exactly their 7.1 parts, and a resume that loads a
    half-written checkpoint lose 7.2's atomic only, each named in the feedback?"""
    assert graded_lesson.scores("cid") == lost(graded_lesson, e7_1=("rank_zero_only", "clean_exit", "any_topology"),
                                               e7_2=("atomic",))
    graded_lesson.check_feedback("cid", "Exactly one process, global rank 0, must write the checkpoint",
                                 "dist.destroy_process_group()", "was writing when it was killed")


def test_expecting_local_rank_argument_fails_with_the_fix_and_an_unanswered_72_earns_nothing(graded_lesson):
    """Does a script that requires --local-rank score 0 on 7.1, the feedback saying torchrun sets LOCAL_RANK instead,
    and 7.2's untouched stub earn nothing on any of its parts?"""
    assert set(graded_lesson.scores("dee").values()) == {0}
    graded_lesson.check_feedback("dee", "read LOCAL_RANK from the environment")


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 07, graded without an error of the course's?"""
    graded_lesson.check_every_learner_graded()
