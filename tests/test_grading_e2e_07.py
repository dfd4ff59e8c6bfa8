"""Lesson 07 graded end to end with the real nbgrader: launcher-ready scripts and scripts that survive a lost process.

A temporary copy of the course receives the instructor's answers to lesson 07 as a learner's, graded
with `python -m autograder grade`, the instructor's command: `main()` (7.1) runs under real torchrun
agents (two simulated hosts of two processes, and one host of three), and `resilient_main()` (7.2)
under agents whose processes are killed with SIGKILL, at a random step and halfway through a
checkpoint write. Three learners' mistakes, packed so that few learners cover many parts, are
decided by the clean re-grade alone in tests/test_regrade_07.py (``MISTAKES``, ``MISTAKES_72``): a
hard-coded rank (7.1) with the RNG restored on rank 0 only (7.2), every process writing the
checkpoint without destroying its process group (7.1) with a resume that loads a half-written
checkpoint (7.2), and a script that expects the `--local-rank` argument of the old launcher (7.1)
with 7.2 left unanswered.
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
MISTAKES_72 = {
    # Only rank 0 restores torch's RNG state: the other ranks' dropout masks differ after a restart.
    "ben": (('        torch.set_rng_state(state["rng"])', '        if rank == 0:\n            torch.set_rng_state(state["rng"])'),),
    # Resumes from the newest folder whether or not DCP finished writing it (.metadata).
    "cid": (('if os.path.exists(os.path.join(CKPT_DIR, d, ".metadata"))', ""),),
}
LEARNERS = {who: {**answers, **({ANSWER_72: variant(LESSON, ANSWER_72, *MISTAKES_72[who])} if who in MISTAKES_72
                                 else {ANSWER_72: variant(LESSON, ANSWER_72)} if who == "amy" else {})}
            for who, answers in with_mistakes(LESSON, ANSWER, MISTAKES).items()}
# What goes through the grade command (tests/conftest.py grades it with the session's other learners): amy, the
# instructor's answers. ben, cid and dee: tests/test_regrade_07.py.
HANDED_IN = {LESSON: {"amy": LEARNERS["amy"]}}


def lost(graded, **zero) -> dict[str, float]:
    """Full marks but for the parts named ``exercise=(part, ...)`` (exercise as ``e7_1``), which earn 0."""
    scores = dict(graded.points)
    for number, parts in zero.items():
        for part in parts:
            scores[f"{number[1:].replace('_', '.')}/{part}"] = 0
    return scores


def test_the_instructors_script_earns_full_marks(graded_lesson):
    """Do the instructor's main() (two torchrun agents and one) and resilient_main() (killed at a random step and while
    writing a checkpoint, resumed on 2 and 3 processes) earn every point of both exercises?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 07, graded without an error of the course's?"""
    graded_lesson.check_every_learner_graded()
