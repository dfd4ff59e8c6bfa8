"""The instructor workflow end to end, with the real nbgrader: release, submit, autograde, feedback, export.

A temporary copy of the course (COURSE_ROOT) receives six learners' versions of lesson 04,
and two of them also hand in lesson 02 (the instructor's ring sum, and a ring sum worked
out alone behind dummy messages); all of it is graded with `python -m autograder grade`,
the command the README gives instructors.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from autograder.scratch import course_copy, run_instructor_command, solution_source, submission

LESSON = "04-ring-all-reduce"
LESSON_02 = "02-point-to-point"
ROOT = Path(__file__).resolve().parent.parent

WHOLE_TENSOR_RING = '''def ring_allreduce(tensor):
    # The tutorial's ring: pass the whole running sum round p-1 times.
    rank, p = dist.get_rank(), dist.get_world_size()
    total, outgoing, incoming = tensor.clone(), tensor.clone(), torch.empty_like(tensor)
    for _ in range(p - 1):
        request = dist.isend(outgoing, (rank + 1) % p)
        dist.recv(incoming, (rank - 1) % p)
        request.wait()
        total += incoming
        outgoing = incoming.clone()
    tensor.copy_(total)
'''

CALLS_ALL_REDUCE = '''def ring_allreduce(tensor):
    dist.all_reduce(tensor)
'''

RECEIVE_FIRST = '''def ring_allreduce(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    for _ in range(p - 1):
        dist.recv(incoming, (rank - 1) % p)   # everybody waits, nobody sends
        dist.send(tensor, (rank + 1) % p)
        tensor += incoming
'''

# Exercise 2.1 for lesson 02: every message goes round the ring, but each rank works the
# total out from its own value alone; it cannot know the others' values.
LOCAL_RING_SUM = '''def ring_sum(rank, world_size, value):
    if world_size > 1:
        request = dist.isend(torch.zeros(1), (rank + 1) % world_size)
        dist.recv(torch.zeros(1), (rank - 1) % world_size)
        request.wait()
    return value * world_size
'''


def _ids(path: Path, number: str = "4.1") -> tuple[str, dict[str, str]]:
    """The exercise cell's grade_id, and each graded test cell's id -> the part it grades."""
    from autograder import exercise
    from autograder.cells import graded_cells

    ex = exercise(number)
    exercise_id = None
    for cell in json.loads(path.read_text())["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") and f"def {ex.function}" in "".join(cell["source"]):
            exercise_id = meta["grade_id"]
    parts = {cell.grade_id: cell.part for cell in graded_cells(path) if cell.number == ex.number}
    return exercise_id, parts


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grading")
    root = course_copy(tmp / "course", lessons=[LESSON, LESSON_02])
    release = root / "course" / LESSON / f"{LESSON}.ipynb"
    solution_nb = ROOT / "solutions" / LESSON / f"{LESSON}.ipynb"
    exercise, parts = _ids(solution_nb)
    assert exercise and len(parts) == 4, (exercise, parts)
    test_ids = list(parts)
    subs = tmp / "submissions"
    target = lambda who: subs / who / LESSON / f"{LESSON}.ipynb"  # noqa: E731
    solution = solution_source(LESSON, exercise)
    submission(release, target("alice"), {exercise: solution})
    submission(release, target("bob"), {exercise: WHOLE_TENSOR_RING})
    submission(release, target("carol"), {exercise: CALLS_ALL_REDUCE})
    submission(release, target("dave"), {exercise: RECEIVE_FIRST})
    submission(release, target("erin"))  # the stubs, untouched
    # frank: a correct answer, but deletes one test cell and rewrites another to pass trivially.
    submission(release, target("frank"), {exercise: solution}, drop=(test_ids[0],), edit={test_ids[1]: "pass"})
    # Lesson 02 from two of them only: each extra notebook costs a whole autograde run.
    release_02 = root / "course" / LESSON_02 / f"{LESSON_02}.ipynb"
    exercise_02, parts_02 = _ids(ROOT / "solutions" / LESSON_02 / f"{LESSON_02}.ipynb", "2.1")
    assert exercise_02 and len(parts_02) == 3, (exercise_02, parts_02)
    target_02 = lambda who: subs / who / LESSON_02 / f"{LESSON_02}.ipynb"  # noqa: E731
    submission(release_02, target_02("alice"), {exercise_02: solution_source(LESSON_02, exercise_02)})
    submission(release_02, target_02("carol"), {exercise_02: LOCAL_RING_SUM})
    done = run_instructor_command(root, "grade", str(subs))
    assert done.returncode == 0, done.stdout + done.stderr
    return root, exercise, parts, done.stdout, parts_02


def _cell_scores(root: Path, student: str | None, lesson: str = LESSON) -> dict[str, float]:
    """Grade cell name -> the student's score, or (student None) -> the cell's points."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'autograder' / 'gradebook.db'}") as gb:
        if student is None:
            return {c.name: c.max_score for c in gb.find_notebook(lesson, lesson).grade_cells}
        return {g.name: g.score for g in gb.find_submission_notebook(lesson, lesson, student).grades}


def _part_scores(root: Path, student: str, parts: dict[str, str], lesson: str = LESSON) -> dict[str, float]:
    return {parts[name]: score for name, score in _cell_scores(root, student, lesson).items() if name in parts}


def _points(root: Path, parts: dict[str, str], lesson: str = LESSON) -> dict[str, float]:
    return {parts[name]: score for name, score in _cell_scores(root, None, lesson).items() if name in parts}


def _other_points(root: Path, parts: dict[str, str]) -> float:
    """Points of graded cells outside the four ring parts that the solution also earns."""
    return sum(score for name, score in _cell_scores(root, "alice").items() if name not in parts)


def _feedback(root: Path, student: str, lesson: str = LESSON) -> str:
    return (root / "autograder" / "feedback" / student / lesson / f"{lesson}.html").read_text()


def test_instructor_solution_scores_full_marks(graded):
    """Does the instructor's own ring all-reduce, submitted as a learner's, earn every point?"""
    root, _, parts, _, _ = graded
    points = _points(root, parts)
    assert _part_scores(root, "alice", parts) == points


def test_whole_tensor_ring_loses_only_bandwidth(graded):
    """Does the tutorial's whole-tensor ring pass correctness, point-to-point and no-hang, and fail bandwidth with a reason?"""
    root, _, parts, _, _ = graded
    points = _points(root, parts)
    scores = _part_scores(root, "bob", parts)
    assert scores == {**points, "bandwidth": 0}
    feedback = _feedback(root, "bob")
    assert "bandwidth" in feedback and "2(p-1)" in feedback and "rank" in feedback


def test_ring_that_calls_all_reduce_earns_nothing(graded):
    """Is a 'ring' that calls dist.all_reduce caught in every part (the built-in collectives are off in all of them), with feedback naming the switched-off call?"""
    root, _, parts, _, _ = graded
    assert set(_part_scores(root, "carol", parts).values()) == {0}
    assert "switched off here" in _feedback(root, "carol")


def test_receive_first_deadlock_scores_zero_without_hanging(graded):
    """Does a receive-first deadlock score 0 on every part, with feedback naming the wait?"""
    root, _, parts, out, _ = graded
    assert set(_part_scores(root, "dave", parts).values()) == {0}
    feedback = _feedback(root, "dave")
    assert "did not finish" in feedback and "recv" in feedback
    assert "autograded dave/" in out


def test_untouched_stubs_score_zero(graded):
    """Does the learner notebook as released score 0 on every graded part?"""
    root, _, parts, _, _ = graded
    assert set(_part_scores(root, "erin", parts).values()) == {0}
    assert "NotImplementedError" in _feedback(root, "erin")


def test_deleted_and_edited_test_cells_are_restored(graded):
    """Are a deleted test cell put back and an edited one restored, so a tampering learner is graded normally?"""
    root, _, parts, _, _ = graded
    points = _points(root, parts)
    assert _part_scores(root, "frank", parts) == points


def test_grades_csv_lists_every_learner(graded):
    """Does the exported CSV hold one row per learner with the right total?"""
    root, _, parts, _, _ = graded
    every = list(csv.DictReader((root / "autograder" / "grades.csv").open()))
    rows = {r["student_id"]: r for r in every if r["assignment"] == LESSON}
    assert set(rows) >= {"alice", "bob", "carol", "dave", "erin", "frank"}
    assert {r["student_id"] for r in every if r["assignment"] == LESSON_02 and r["timestamp"]} == {"alice", "carol"}
    total = sum(_points(root, parts).values())
    assert float(rows["alice"]["score"]) == pytest.approx(total + _other_points(root, parts))
    assert float(rows["erin"]["score"]) == 0


def test_grading_run_record_matches_the_gradebook(graded):
    """Does autograder/grading-run.json record every learner's seconds, status and score, as the gradebook has them?"""
    root, _, parts, _, _ = graded
    record = json.loads((root / "autograder" / "grading-run.json").read_text())
    runs = {run["student"]: run for run in record["submissions"] if run["lesson"] == LESSON}
    assert set(runs) == {"alice", "bob", "carol", "dave", "erin", "frank"}
    assert sorted(run["student"] for run in record["submissions"] if run["lesson"] == LESSON_02) == ["alice", "carol"]
    points = _points(root, parts)
    total = sum(points.values()) + _other_points(root, parts)
    for run in runs.values():
        assert run["lesson"] == LESSON and run["status"] == "ok" and run["seconds"] > 0, run
        assert run["max_score"] == pytest.approx(total), run
    assert runs["alice"]["score"] == pytest.approx(total)
    assert runs["bob"]["score"] == pytest.approx(total - points["bandwidth"])
    assert runs["erin"]["score"] == 0
    assert record["seconds"] >= sum(run["seconds"] for run in record["submissions"])


def test_instructor_ring_sum_scores_full_marks(graded):
    """Does the instructor's ring_sum (lesson 02), handed in as a learner's, earn every point of Exercise 2.1?"""
    root, _, _, _, parts_02 = graded
    points = _points(root, parts_02, LESSON_02)
    assert sum(points.values()) == 4, points
    assert _part_scores(root, "alice", parts_02, LESSON_02) == points


def test_ring_sum_worked_out_alone_earns_nothing(graded):
    """Does a ring_sum that sends dummy messages round the ring but works the total out alone score 0 on every part, with feedback saying why?"""
    root, _, _, _, parts_02 = graded
    scores = _part_scores(root, "carol", parts_02, LESSON_02)
    assert set(scores) == {"correct", "point_to_point", "no_hang"} and set(scores.values()) == {0}, scores
    feedback = _feedback(root, "carol", LESSON_02)
    assert "every rank should return their sum" in feedback
    assert "Each rank knows only its own value" in feedback
