"""The instructor workflow end to end, with the real nbgrader: release, submit, autograde, feedback, export.

A temporary copy of the course (COURSE_ROOT) receives five learners' versions of lesson 04
(its four exercises, from the chunk schedule to the ring all-reduce), two of lesson 03, one of
lesson 01, and two of lesson 02 (the instructor's ring sum, and the same ring sum followed by
code that tries to leave its folder), and is graded with `python -m autograder grade`, the
command the instructors' guide (docs/instructors.md, "Grading with nbgrader") gives.

Every notebook costs a whole grading run, so one learner carries more than one case where
the cases cannot hide each other: alice hands in the instructor's answers with one test cell
deleted and another rewritten to pass (full marks prove both the answers and the restored
cells), and carol's built-in collectives come with lines that patch the grading in her kernel
(she must still earn only what the built-ins earn). alice's lessons 01 and 03 are the
instructor's answers: with the other modules' learners (tests/test_grading_e2e_05.py to
_12.py, tests/test_release_learner.py) every lesson's hidden tests pass on its solution here,
which tests/test_notebooks.py leaves to this run (it runs the notebooks without them, as a
learner's runs). A ring sum worked out alone behind dummy messages is decided by the clean
re-grade alone in tests/test_regrade_02.py.
"""

from __future__ import annotations

import csv
import html
import json
import re
from pathlib import Path

import pytest

from devtools.scratch import GRADER_PATCH, RING_ANSWERS, sandbox_flags, solution_source, submission
from autograder.grading.summary import CSV_NAME, HTML_NAME

WHOLE_TENSOR_RING = RING_ANSWERS["whole_tensor"]
CALLS_ALL_REDUCE = RING_ANSWERS["built_in"]
RECEIVE_FIRST = RING_ANSWERS["receive_first"]

LESSON = "04-ring-all-reduce"
LESSON03 = "03-collectives"
LESSON02 = "02-point-to-point"
LESSON01 = "01-processes-and-ranks"
ROOT = Path(__file__).resolve().parent.parent
LESSON04_LEARNERS = {"alice", "bob", "carol", "dave", "erin"}
LESSON03_LEARNERS = {"alice", "carol"}
LESSON02_LEARNERS = {"alice", "oscar"}  # each extra notebook costs a whole autograde run
LESSON01_LEARNERS = {"alice"}

# -- bob: nearly there --------------------------------------------------------------------

# The all-gather phase starts one chunk too far round: rank r sends chunk r+1, which it
# does not hold yet. The reduce-scatter phase is right.
SCHEDULE_ALL_GATHER_OFF_BY_ONE = '''def ring_chunks(phase, step, rank, world_size):
    if phase == "reduce-scatter":
        send = (rank - step - 1) % world_size
    else:
        send = (rank - step + 1) % world_size
    return send, (send - 1) % world_size
'''

# Correct and bandwidth-optimal, but not a ring: every rank sends chunk j straight to rank j.
DIRECT_REDUCE_SCATTER = '''def ring_reduce_scatter(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    start, stop = bounds[rank]
    incoming = [torch.empty(stop - start, dtype=flat.dtype) for _ in range(p)]
    requests = [dist.isend(flat[bounds[j][0]:bounds[j][1]], j) for j in range(p) if j != rank]
    requests += [dist.irecv(incoming[j], j) for j in range(p) if j != rank]
    for request in requests:
        request.wait()
    for j in range(p):
        if j != rank:
            flat[start:stop] += incoming[j]
    return tensor
'''

# -- oscar: a right answer, then code that tries to leave its folder while it is graded -------

ESCAPE = '''

import json as _json, os as _os, pathlib as _pathlib, pwd as _pwd
_report = {"written": [], "gradebooks": [], "solutions": []}
_here = _pathlib.Path.cwd()
for _folder in [_here, *_here.parents, _pathlib.Path(_pwd.getpwuid(_os.getuid()).pw_dir)]:
    try:
        (_folder / "pwned.txt").write_text("was here")
        _report["written"].append(str(_folder))
    except OSError:
        pass
    _report["gradebooks"] += [str(p) for p in _folder.glob("*.db")] + [str(p) for p in _folder.glob("*/gradebook.db")]
    _report["solutions"] += [str(p) for p in _folder.glob("solutions/*")]
print("ESCAPE " + _json.dumps(_report))
'''

# -- carol: calls the built-in collectives ----------------------------------------------------


CALLS_ALL_REDUCE_FOR_REDUCE_SCATTER = '''def ring_reduce_scatter(tensor):
    dist.all_reduce(tensor)   # every chunk summed, my own included
    return tensor
'''

CALLS_BROADCAST_FOR_ALL_GATHER = '''def ring_all_gather(tensor):
    flat = tensor.view(-1)
    for owner, (start, stop) in enumerate(chunk_bounds(flat.numel(), dist.get_world_size())):
        dist.broadcast(flat[start:stop], src=owner)
    return tensor
'''

CALLS_BROADCAST = '''def my_broadcast(tensor, src):
    dist.broadcast(tensor, src)
'''

CALLS_ALL_GATHER = '''def my_all_gather(tensor_list, tensor):
    dist.all_gather(tensor_list, tensor)
'''

FLAT_ALL_REDUCE = '''def hierarchical_all_reduce(tensor, ranks_per_node):
    dist.all_reduce(tensor)   # the right sum, but no reduce, no subgroups, no broadcast
    return tensor
'''

# -- dave: deadlocks -------------------------------------------------------------------------



def _layout(lesson: str) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """Each exercise's answer-cell grade_id, and each graded test cell's id -> (exercise, part)."""
    from autograder import exercises
    from autograder.notebooks.cells import graded_cells, lesson_number

    path = ROOT / "solutions" / lesson / f"{lesson}.ipynb"
    declared = exercises(lesson_number(path))
    answers = {}
    for cell in json.loads(path.read_text())["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        for ex in declared:
            if meta.get("solution") and f"def {ex.function}(" in "".join(cell["source"]):
                answers[ex.number] = meta["grade_id"]
    parts = {cell.grade_id: (cell.number, cell.part) for cell in graded_cells(path)}
    return answers, parts


LESSONS = [LESSON01, LESSON02, LESSON03, LESSON]


def hand_in(root: Path, subs: Path) -> None:
    """This module's learners, graded with the others of the session (tests/conftest.py's graded_class)."""
    layouts = {lesson: _layout(lesson) for lesson in LESSONS}
    ans, parts = layouts[LESSON]
    assert set(ans) == {"4.1", "4.2", "4.3", "4.4"} and len(parts) == 10, (ans, parts)
    release = root / "course" / LESSON / f"{LESSON}.ipynb"
    target = lambda who, lesson=LESSON: subs / who / lesson / f"{lesson}.ipynb"  # noqa: E731
    solution = {gid: solution_source(LESSON, gid) for gid in ans.values()}
    # alice: the instructor's answers, but she deletes one test cell and rewrites another to pass trivially.
    first_41 = next(gid for gid, (number, _) in parts.items() if number == "4.1")
    first_44 = next(gid for gid, (number, _) in parts.items() if number == "4.4")
    submission(release, target("alice"), solution, drop=(first_41,), edit={first_44: "pass"})
    submission(release, target("bob"), {**solution, ans["4.1"]: SCHEDULE_ALL_GATHER_OFF_BY_ONE,
                                        ans["4.2"]: DIRECT_REDUCE_SCATTER, ans["4.4"]: WHOLE_TENSOR_RING})
    # carol: the built-in collectives, then (in 4.4's cell) lines that make every hidden test pass in her kernel.
    submission(release, target("carol"), {**solution, ans["4.2"]: CALLS_ALL_REDUCE_FOR_REDUCE_SCATTER,
                                          ans["4.3"]: CALLS_BROADCAST_FOR_ALL_GATHER,
                                          ans["4.4"]: CALLS_ALL_REDUCE + GRADER_PATCH})
    submission(release, target("dave"), {**solution, ans["4.4"]: RECEIVE_FIRST})
    submission(release, target("erin"))  # the stubs, untouched

    ans3, parts3 = layouts[LESSON03]
    assert set(ans3) == {"3.1", "3.2", "3.3"} and len(parts3) == 8, (ans3, parts3)
    release3 = root / "course" / LESSON03 / f"{LESSON03}.ipynb"
    submission(release3, target("carol", LESSON03), {ans3["3.1"]: CALLS_BROADCAST, ans3["3.2"]: CALLS_ALL_GATHER,
                                                     ans3["3.3"]: FLAT_ALL_REDUCE})
    submission(release3, target("alice", LESSON03), {gid: solution_source(LESSON03, gid) for gid in ans3.values()})

    ans1, parts1 = layouts[LESSON01]
    assert set(ans1) == {"1.1", "1.2"} and len(parts1) == 3, (ans1, parts1)
    release1 = root / "course" / LESSON01 / f"{LESSON01}.ipynb"
    submission(release1, target("alice", LESSON01), {gid: solution_source(LESSON01, gid) for gid in ans1.values()})

    ans2, parts2 = layouts[LESSON02]
    assert set(ans2) == {"2.1"} and len(parts2) == 3, (ans2, parts2)
    release2 = root / "course" / LESSON02 / f"{LESSON02}.ipynb"
    submission(release2, target("alice", LESSON02), {ans2["2.1"]: solution_source(LESSON02, ans2["2.1"])})
    # Only a sandbox may meet oscar's escape: without one it would really write pwned.txt in every
    # folder above the grading and in the home folder of whoever runs the tests.
    escape = "" if sandbox_flags() else ESCAPE
    submission(release2, target("oscar", LESSON02), {ans2["2.1"]: solution_source(LESSON02, ans2["2.1"]) + escape})


@pytest.fixture(scope="module")
def graded(graded_class):
    root, out = graded_class
    return root, {lesson: _layout(lesson)[1] for lesson in LESSONS}, out


def _cell_scores(root: Path, lesson: str, student: str | None) -> dict[str, float]:
    """Grade cell name -> the student's score, or (student None) -> the cell's points."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'autograder' / 'gradebook.db'}") as gb:
        if student is None:
            return {c.name: c.max_score for c in gb.find_notebook(lesson, lesson).grade_cells}
        return {g.name: g.score for g in gb.find_submission_notebook(lesson, lesson, student).grades}


def _scores(graded, student: str | None, lesson: str = LESSON) -> dict[tuple[str, str], float]:
    """(exercise, part) -> the student's score on it, or (student None) -> its points."""
    root, parts, _ = graded
    found = _cell_scores(root, lesson, student)
    assert set(found) == set(parts[lesson]), "every graded cell is one declared part"
    return {parts[lesson][name]: score for name, score in found.items()}


def _total(graded, lesson: str = LESSON) -> float:
    return sum(_scores(graded, None, lesson).values())


def _feedback(root: Path, student: str, lesson: str = LESSON) -> str:
    return (root / "autograder" / "feedback" / student / lesson / f"{lesson}.html").read_text()


def test_instructor_solution_scores_full_marks(graded):
    """Do the instructor's own answers to every exercise of lessons 01, 03 and 04, submitted as a learner's, earn every
    point (in lesson 04 with one test cell deleted and another edited)?"""
    for lesson in (LESSON01, LESSON03, LESSON):
        assert _scores(graded, "alice", lesson) == _scores(graded, None, lesson), lesson


def test_near_misses_lose_only_the_parts_they_miss(graded):
    """Does bob (an all-gather schedule one chunk off, a correct reduce-scatter that is not a ring, the whole-tensor ring) lose exactly those parts, with feedback saying why?"""
    root, _, _ = graded
    lost = {("4.1", "all_gather"), ("4.2", "ring"), ("4.3", "correct"), ("4.3", "ring"), ("4.4", "bandwidth")}
    points = _scores(graded, None)
    assert _scores(graded, "bob") == {key: 0 if key in lost else value for key, value in points.items()}
    feedback = _feedback(root, "bob")
    assert "does not hold yet" in feedback  # 4.1: the schedule sends a chunk the rank lacks
    assert "right neighbour" in feedback  # 4.2: not a ring
    assert "2(p-1)" in feedback and "whole tensor" in feedback  # 4.4: the bandwidth bound
    # Each failing part reads as its exercise, part and points, then the message; no frame of the checks.
    text = html.unescape(re.sub(r"<[^>]+>", "", feedback))
    assert 'Exercise 4.4, part "bandwidth": 0 of 3 points.' in text and 'Exercise 4.1, part "all_gather": 0 of 1 point.' in text
    assert not [name for name in ("exercise.py", "lesson04.py", "ringcheck.py", "Traceback (most recent call last)") if name in text]


def test_built_in_collectives_earn_nothing(graded):
    """Does carol, who calls the built-in collectives in every build-it-yourself exercise, earn none of their points, with feedback naming the switched-off call?"""
    root, _, _ = graded
    scores = _scores(graded, "carol")
    assert {key: value for key, value in scores.items() if key[0] != "4.1"} == dict.fromkeys(
        [key for key in scores if key[0] != "4.1"], 0)
    assert scores[("4.1", "reduce_scatter")] > 0  # her schedule is the solution's
    assert "switched off here" in _feedback(root, "carol")
    scores3 = _scores(graded, "carol", LESSON03)
    assert all(scores3[key] == 0 for key in scores3 if key[0] in ("3.1", "3.2")), scores3
    assert "switched off here" in _feedback(root, "carol", LESSON03)


def test_a_flat_all_reduce_is_not_hierarchical(graded):
    """Does a plain dist.all_reduce for Exercise 3.3 (collectives allowed there) earn the sums but not the hierarchy, the trace saying why?"""
    root, _, _ = graded
    points = _scores(graded, None, LESSON03)
    scores = _scores(graded, "carol", LESSON03)
    assert scores[("3.3", "correct")] == points[("3.3", "correct")] and scores[("3.3", "hierarchy")] == 0
    assert "the whole world (the default group)" in _feedback(root, "carol", LESSON03)


def test_receive_first_deadlock_scores_zero_without_hanging(graded):
    """Does a receive-first deadlock in the ring score 0 on every part of 4.4 only, with feedback naming the wait?"""
    root, _, out = graded
    points = _scores(graded, None)
    assert _scores(graded, "dave") == {key: 0 if key[0] == "4.4" else value for key, value in points.items()}
    feedback = _feedback(root, "dave")
    assert "deadlocked" in feedback and "recv" in feedback
    assert "dist.isend" in feedback and "even ranks send first" in feedback  # the fix, not only the cycle
    assert "autograded dave/" in out


def test_untouched_stubs_score_zero(graded):
    """Does the learner notebook as released score 0 on every graded part?"""
    root, _, _ = graded
    assert set(_scores(graded, "erin").values()) == {0}
    assert "NotImplementedError" in _feedback(root, "erin")


def test_deleted_and_edited_test_cells_are_restored(graded):
    """Are a deleted test cell put back and an edited one restored, so a tampering learner is graded normally?"""
    root, parts, _ = graded
    assert _scores(graded, "alice") == _scores(graded, None)
    # The deleted 4.1 cell and the 4.4 cell rewritten to `pass` are graded with the course's own tests again.
    notebook = json.loads((root / "autograder" / "autograded" / "alice" / LESSON / f"{LESSON}.ipynb").read_text())
    sources = {cell.get("metadata", {}).get("nbgrader", {}).get("grade_id"): "".join(cell["source"])
               for cell in notebook["cells"]}
    tested = {gid: number for gid, (number, _) in parts[LESSON].items() if number in ("4.1", "4.4")}
    assert set(tested) <= set(sources), set(tested) - set(sources)
    assert all(f'grade("{number}"' in sources[gid] for gid, number in tested.items()), tested


def test_grades_csv_lists_every_learner(graded):
    """Does the exported CSV hold one row per learner and lesson with the right total?"""
    root, _, _ = graded
    rows = {(r["assignment"], r["student_id"]): r for r in csv.DictReader((root / "autograder" / "grades.csv").open())}
    assert ({(LESSON, who) for who in LESSON04_LEARNERS} | {(LESSON03, who) for who in LESSON03_LEARNERS}
            | {(LESSON02, who) for who in LESSON02_LEARNERS} | {(LESSON01, who) for who in LESSON01_LEARNERS}) <= set(rows)
    assert float(rows[LESSON, "alice"]["score"]) == pytest.approx(_total(graded))
    assert float(rows[LESSON03, "carol"]["score"]) == pytest.approx(sum(_scores(graded, "carol", LESSON03).values()))
    assert float(rows[LESSON, "erin"]["score"]) == 0


def test_grading_run_record_matches_the_gradebook(graded):
    """Does autograder/grading-run.json record every learner's seconds, status and score per lesson, as the gradebook has them?"""
    root, _, _ = graded
    record = json.loads((root / "autograder" / "grading-run.json").read_text())
    runs = {(run["student"], run["lesson"]): run for run in record["submissions"] if run["lesson"] in LESSONS}
    assert set(runs) == ({(who, LESSON) for who in LESSON04_LEARNERS} | {(who, LESSON03) for who in LESSON03_LEARNERS}
                         | {(who, LESSON02) for who in LESSON02_LEARNERS} | {(who, LESSON01) for who in LESSON01_LEARNERS})
    for (_, lesson), run in runs.items():
        assert run["status"] == "ok" and run["seconds"] > 0, run
        assert run["max_score"] == pytest.approx(_total(graded, lesson)), run
    assert runs["alice", LESSON]["score"] == pytest.approx(_total(graded))
    assert runs["bob", LESSON]["score"] == pytest.approx(sum(_scores(graded, "bob").values()))
    assert runs["carol", LESSON03]["score"] == pytest.approx(sum(_scores(graded, "carol", LESSON03).values()))
    assert runs["erin", LESSON]["score"] == 0
    assert record["seconds"] >= max(run["seconds"] for run in runs.values()) and record["jobs"] >= 1
    assert record["sandbox"] == (not sandbox_flags())


def test_instructor_ring_sum_scores_full_marks(graded):
    """Does the instructor's ring_sum (lesson 02), handed in as a learner's, earn every point of Exercise 2.1?"""
    points = _scores(graded, None, LESSON02)
    assert sum(points.values()) == 4, points
    assert _scores(graded, "alice", LESSON02) == points


def test_patching_the_grader_in_the_kernel_earns_only_the_honest_score(graded):
    """Does carol, whose 4.4 answer cell replaces the course's grading in her kernel after calling the built-ins, earn
    only what the built-ins earn (tests/test_grading_e2e.py::test_built_in_collectives_earn_nothing), each 4.4 cell
    showing the fresh process's verdict and the patch it left out?"""
    root, parts, _ = graded
    record = json.loads((root / "autograder" / "grading-run.json").read_text())
    run = next(r for r in record["submissions"] if (r["student"], r["lesson"]) == ("carol", LESSON))
    ring = [p for p in run["parts"] if p["exercise"] == "4.4"]
    assert all(p["score"] == 0 for p in ring), ring
    assert any("autograder.kit.exercise.Exercise.grade = lambda" in line for line in run["left_out"]), run["left_out"]
    # Her kernel ran the patch, yet every 4.4 cell of her graded notebook holds the verdict of the fresh process.
    notebook = json.loads((root / "autograder" / "autograded" / "carol" / LESSON / f"{LESSON}.ipynb").read_text())
    for cell in notebook["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if parts[LESSON].get(gid, ("",))[0] == "4.4":
            errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
            assert [o["ename"] for o in errors] == ["GradingFailure"], cell["outputs"]
            assert "switched off here" in "\n".join(errors[0]["traceback"]), errors
    feedback = _feedback(root, "carol")
    assert "Left out of the fresh process" in feedback and "autograder.kit.exercise.Exercise.grade = lambda" in feedback


@pytest.mark.skipif(bool(sandbox_flags()), reason="bubblewrap cannot run here, so grading ran without the sandbox")
def test_a_submission_cannot_reach_outside_its_folder(graded):
    """Does oscar's code, graded in the sandbox, fail to write anywhere but its own folder, see no gradebook and no solutions, while his right answer still earns every point?"""
    root, _, _ = graded
    assert _scores(graded, "oscar", LESSON02) == _scores(graded, None, LESSON02)
    notebook = json.loads((root / "autograder" / "autograded" / "oscar" / LESSON02 / f"{LESSON02}.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) for c in notebook["cells"] for o in c.get("outputs", []))
    report = json.loads(text.split("ESCAPE ", 1)[1].splitlines()[0])
    # nbgrader copies what the notebook wrote in its working folder into the feedback folder too.
    own = (str(root / "autograder" / "autograded" / "oscar" / LESSON02), str(root / "autograder" / "feedback" / "oscar"))
    assert report["gradebooks"] == [] and report["solutions"] == [], report
    # Its own working copy and its private /tmp, nothing else (the job folder's path differs from `own`).
    assert report["written"] and all(w == "/tmp" or w.endswith(f"/oscar/{LESSON02}") for w in report["written"]), report
    strays = [p for p in root.rglob("pwned.txt") if not str(p).startswith(own)]
    assert strays == [] and not (Path.home() / "pwned.txt").exists(), strays


def test_class_summary_counts_passes_and_commonest_failures(graded):
    """Does the class summary count, per part, the learners graded and passed as the gradebook has them, name the commonest failure, and exist as CSV and HTML?"""
    root, _, out = graded
    rows = {(r["lesson"], r["exercise"], r["part"]): r for r in csv.DictReader((root / "autograder" / CSV_NAME).open())}
    points = _scores(graded, None)
    for (number, part), full in points.items():
        row = rows[(LESSON, number, part)]
        passed = sum(1 for who in LESSON04_LEARNERS if _scores(graded, who)[(number, part)] == full)
        assert (int(row["graded"]), int(row["passed"])) == (len(LESSON04_LEARNERS), passed), row
    assert "switched off" in rows[(LESSON, "4.4", "correct")]["common_failures"]
    html = (root / "autograder" / HTML_NAME).read_text()
    assert "Class summary" in html and "Slowest submissions" in html and "<td>4.4</td>" in html
    assert "Class summary" in out and "Slowest:" in out
    # Each group of failures is shown by a real message of it, numbers and all, never by its pattern ("on N ranks").
    shown = [line.strip() for line in out.split("Class summary", 1)[1].splitlines() if re.match(r"\s+\d+x ", line)]
    assert shown and not [line for line in shown if re.search(r"\bN\b", line)], shown
    assert any(re.search(r"\d", line.split("x ", 1)[1]) for line in shown), shown


def test_feedback_shows_no_path_of_the_grading_machine(graded):
    """Does no learner's feedback page name a folder of the machine that graded it (the course, the work folders,
    Python's installation), even where it shows a traceback?"""
    import sys

    from autograder.grading.sandbox import PACKAGE_DIRS

    root, _, _ = graded
    pages = sorted((root / "autograder" / "feedback").glob("*/*/*.html"))
    assert len(pages) >= len(LESSON04_LEARNERS)
    secret = {str(root), str(PACKAGE_DIRS[0].parent), "/tmp/course-grading-", sys.prefix, sys.base_prefix}
    found = {page.relative_to(root).as_posix(): [s for s in secret if s in page.read_text()] for page in pages}
    assert not {page: paths for page, paths in found.items() if paths}, found


def test_the_kernel_run_leaves_out_demonstrations_and_no_cell_it_keeps_fails(graded):
    """Does every notebook of the class (every lesson's, right answers and wrong) leave out cells that make nothing
    a graded cell uses, saying so where their output would be, and run the cells it keeps without an error outside
    the graded cells (where the verdicts go)? A left-out cell whose names a kept cell needs would fail here."""
    from autograder.grading.unused import NOT_RUN

    root = graded[0]
    notebooks = sorted((root / "autograder" / "autograded").glob("*/*/*.ipynb"))
    record = json.loads((root / "autograder" / "grading-run.json").read_text())
    assert {p.parent.name for p in notebooks} == {r["lesson"] for r in record["submissions"]}, notebooks
    for path in notebooks:
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        said = ["".join(o.get("text", "")) for c in cells for o in c.get("outputs", [])]
        assert NOT_RUN in said, f"{path}: no cell was left out"
        failed = [(c["source"][:1], o.get("ename")) for c in cells for o in c.get("outputs", [])
                  if o.get("output_type") == "error" and not c["metadata"].get("nbgrader")]
        assert not failed, f"{path}: cells outside the graded ones failed: {failed}"


def test_the_grade_command_prints_nothing_of_the_kernels(graded):
    """Does the output of `python -m autograder grade` hold its own lines only, none of what each submission's kernel
    prints on starting (ipykernel's note on Ctrl-C and how to connect another client)?"""
    out = graded[2]
    assert "autograded " in out and "Class summary" in out, out[-3000:]
    assert "Ctrl-C will not work" not in out and "--existing" not in out, out[-3000:]
