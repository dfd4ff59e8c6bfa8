"""Lesson 07 graded end to end with the real nbgrader: launcher-ready scripts, right and wrong.

A temporary copy of the course receives four learners' versions of lesson 07 and is graded
with `python -m autograder grade`, the instructor's command. Each learner's `main()` runs
under real torchrun agents (two simulated hosts of two processes, and one host of three):
the instructor's answer, and three mistakes from the lesson: a hard-coded rank, every
process writing the checkpoint without destroying its process group, and a script that
expects the `--local-rank` argument of the old launcher.
"""

from __future__ import annotations

import json

import pytest

from devtools import scratch
from devtools.scratch import feedback, scores, solution_source

LESSON = "07-launching-at-scale"
ANSWER = "ex7_1-main"


def _variant(*changes: tuple[str, str]) -> str:
    source = solution_source(LESSON, ANSWER)
    for old, new in changes:
        assert old in source, f"the solution no longer contains {old!r}: update this test's mistakes"
        source = source.replace(old, new)
    return source


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
LEARNERS = ["amy", *MISTAKES]  # amy hands in the instructor's answer


LESSONS = [LESSON]


def hand_in(root, submissions):
    """This module's learners, graded with the others of the session (tests/conftest.py's graded_class)."""
    answers = {who: {ANSWER: _variant(*MISTAKES[who]) if who in MISTAKES else solution_source(LESSON, ANSWER)}
               for who in LEARNERS}
    scratch.hand_in(root, submissions, LESSON, answers)


@pytest.fixture(scope="module")
def graded(graded_class):
    return (graded_class[0], *scratch.layout(LESSON, "7.1"))



@pytest.mark.slow
def test_the_instructors_script_earns_full_marks(graded):
    """Does the instructor's main(), run by two torchrun agents and by one, earn every point?"""
    root, cells, points = graded
    assert scores(root, LESSON, cells, "amy") == points


@pytest.mark.slow
def test_a_hard_coded_rank_loses_the_result_and_the_single_writer(graded):
    """Does rank = 0 everywhere lose the result, the one-writer part and the other topology, with feedback naming RANK?"""
    root, cells, points = graded
    assert scores(root, LESSON, cells, "ben") == {**points, "same_result": 0, "rank_zero_only": 0, "any_topology": 0}
    text = feedback(root, LESSON, "ben")
    assert "torch.save was called 4 times" in text and "global RANK" in text


@pytest.mark.slow
def test_every_rank_writing_and_no_destroy_are_both_named(graded):
    """Do every process saving and no destroy_process_group lose exactly their parts, each named in the feedback?"""
    root, cells, points = graded
    assert scores(root, LESSON, cells, "cid") == {**points, "rank_zero_only": 0, "clean_exit": 0, "any_topology": 0}
    text = feedback(root, LESSON, "cid")
    assert "Exactly one process, global rank 0, must write the checkpoint" in text
    assert "dist.destroy_process_group()" in text


@pytest.mark.slow
def test_expecting_local_rank_argument_fails_with_the_fix(graded):
    """Does a script that requires --local-rank score 0, the feedback saying torchrun sets LOCAL_RANK instead?"""
    root, cells, points = graded
    assert set(scores(root, LESSON, cells, "dee").values()) == {0}
    assert "read LOCAL_RANK from the environment" in feedback(root, LESSON, "dee")


@pytest.mark.slow
def test_grading_run_records_every_learner(graded):
    """Does the run record hold every learner of lesson 07, graded without an error of the course's?"""
    root, _, points = graded
    record = json.loads((root / "autograder" / "grading-run.json").read_text())
    runs = {run["student"]: run for run in record["submissions"] if run["lesson"] == LESSON}
    assert set(runs) == set(LEARNERS)
    assert all(run["status"] == "ok" for run in runs.values()), runs
    assert runs["amy"]["score"] == pytest.approx(sum(points.values()))
