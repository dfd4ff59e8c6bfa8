"""The grading's pure logic, without ranks: scoring, feedback wording, verdict cells and the class summary.

The end-to-end tests grade real notebooks with nbgrader in the sandbox; these ask the same
questions of the pieces in between, with data made up here, so that a wording or a rule can
be checked in milliseconds. No test here starts a rank or a kernel.

Run alone: ``pytest tests/test_grading_units.py -q`` (a few seconds, most of it importing torch).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import nbformat
import pytest

from autograder.grading.summary import failure_kind, part_rows, summarise
from autograder.grading.verdicts import CLEAN_NOTE, verdict_outputs
from autograder.lessons.gradcheck import judge_signature
from autograder.kit.harness import CheckError, GradingFailure
from conftest import ROOT
from autograder.kit.exercise import DEFERRED, SELF_CHECK, Attempt, Exercise, HiddenTestUnavailable, Part
from autograder.lessons.ringcheck import judge_rows, judge_schedule
from autograder.kit.torchrun import Failure, Frame, ScriptRun
from autograder.kit.torchrun_feedback import failure_text


class _Declared:
    """An exercise with one part, "correct", and that part's check (the hidden package's role)."""

    def __init__(self, check, **extra) -> None:
        self.exercise = Exercise(number="9.1", function="answer", title="the answer",
                                 parts=(Part("correct", 2, "returns 42."),), **extra)
        self.check = check

    def grade(self, fn, part: str) -> None:
        self.exercise.grade(fn, part, self.check)


def _exercise(check=lambda attempt: None, **extra) -> _Declared:
    return _Declared(check, **extra)


def _fails(check, *args) -> str:
    """The text of the GradingFailure that ``check(*args)`` raises."""
    with pytest.raises(GradingFailure) as failed:
        check(*args)
    return failed.value.text


# -- the kit: declarations, scoring, where a fault lies --------------------------------------------


def test_a_failure_keeps_its_part_and_text_apart():
    """Does a GradingFailure say "part: text", keep both as fields, and survive pickling (it crosses processes)?"""
    failure = GradingFailure("rank 1 returned 3.", part="correct")
    again = pickle.loads(pickle.dumps(failure))
    assert (str(again), again.part, again.text) == ("correct: rank 1 returned 3.", "correct", "rank 1 returned 3.")
    assert str(GradingFailure("no part here.")) == "no part here."


def test_attempt_fail_names_the_part():
    """Does a check's attempt.fail(...) become the part's failure, with the part's name in front?"""
    attempt = Attempt(_exercise().exercise, "correct", print)
    text = _fails(attempt.fail, "on 2 ranks, rank 1 returned 7.")
    assert text == "on 2 ranks, rank 1 returned 7."


def test_forbidden_calls_add_the_parts_own_rules():
    """Does a part's own switched-off calls add to the exercise's, and does the self-check keep only the exercise's?"""
    ex = Exercise(number="9.1", function="f", title="t", forbid=("all_reduce",), forbid_reason="build it",
                  parts=(Part("hang", 1, "h.", forbid=("broadcast",), forbid_reason="order the sends"),
                         Part("other", 1, "o.")))
    assert ex.forbidden("hang") == {"all_reduce": "build it", "broadcast": "order the sends"}
    assert ex.forbidden("other") == ex.forbidden(SELF_CHECK) == {"all_reduce": "build it"}
    under = Attempt(ex, SELF_CHECK, print).under("hang")
    assert (under.part, under.rules) == (SELF_CHECK, "hang")
    with pytest.raises(ValueError, match="has no part 'hnag'; its parts are hang, other"):
        Attempt(ex, SELF_CHECK, print).under("hnag")


def test_a_declaration_that_cannot_be_graded_is_refused():
    """Are a bad number, twice the same part, and switched-off calls without a reason refused when declared?"""
    with pytest.raises(ValueError, match="should look like '4.1'"):
        Exercise(number="9", function="f", title="t", parts=(Part("a", 1, "a."),))
    with pytest.raises(ValueError, match="distinct names"):
        Exercise(number="9.1", function="f", title="t", parts=(Part("a", 1, "a."), Part("a", 1, "b.")))
    with pytest.raises(ValueError, match="give the forbid_reason"):
        Part("a", 1, "a.", forbid=("send",))


def test_heading_and_points_come_from_the_declaration():
    """Is a hidden test cell's heading the exercise, the part, its points and what it checks?"""
    ex = _exercise().exercise
    assert ex.heading("correct") == '# Exercise 9.1, part "correct" (2 points): returns 42.'
    assert (ex.points, ex.lesson, ex.label) == (2, 9, "Exercise 9.1")


def test_a_check_that_breaks_is_the_courses_fault():
    """Does a check that raises anything but GradingFailure come out as CheckError, naming the part and the error?"""
    def broken(attempt):
        return {}["missing"]

    with pytest.raises(CheckError) as error:
        _exercise(broken).grade(lambda: 42, "correct")
    assert (error.value.exercise, error.value.part) == ("Exercise 9.1", "correct")
    assert "KeyError: 'missing'" in str(error.value) and "not in your answer" in str(error.value)
    again = pickle.loads(pickle.dumps(error.value))
    assert str(again) == str(error.value)


def test_something_that_is_not_a_function_is_asked_for_by_name():
    """Does grading a value that cannot be called ask for the function by its name?"""
    with pytest.raises(GradingFailure, match="Exercise 9.1: define a function named `answer` \\(found int\\)"):
        _exercise().grade(42, "correct")


def test_the_learners_copy_says_where_the_hidden_test_went():
    """Does grading a part without its check (a learner's copy has none) name the exercise, the part and the
    self-check to run instead?"""
    ex = Exercise(number="9.1", function="answer", title="t", visible_check=lambda attempt: "ok",
                  parts=(Part("correct", 1, "c."),))
    with pytest.raises(HiddenTestUnavailable) as told:
        ex.grade(lambda: 42, "correct")
    assert 'Exercise 9.1, part "correct": this copy of the course has no hidden tests' in str(told.value)
    assert 'exercise("9.1").self_check(answer)' in str(told.value)


def test_under_make_grade_the_kernel_defers_to_the_clean_run(monkeypatch, capsys):
    """While make grade runs the notebook, does a hidden test cell print the placeholder and run no check?"""
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv("COURSE_CLEAN_RUN_DECIDES", "1")
    _exercise(lambda attempt: attempt.fail("would fail")).grade(lambda: 0, "correct")
    assert capsys.readouterr().out.strip() == DEFERRED


# -- the lessons' judges, given what ranks would have returned -------------------------------------


def test_a_schedule_that_never_shifts_is_told_which_chunk_completed():
    """4.1: a reduce-scatter that leaves chunk r+1 complete on rank r: is the learner told to shift it?"""
    attempt = Attempt(_exercise(), "reduce_scatter", print)
    p = 3  # rank r sends chunk r, receives chunk r-1: the classic schedule that ends one chunk off
    rows = [[((r - step) % p, (r - step - 1) % p) for r in range(p)] for step in range(p - 1)]
    text = _fails(judge_schedule, attempt, "reduce-scatter", p, rows)
    assert "rank 0's chunk 0 holds the sum of ranks" in text and "complete instead: shift the schedule" in text


def test_a_schedule_that_receives_the_wrong_chunk_names_the_step():
    """4.1: when rank r adds into a chunk its left neighbour did not send, does the feedback name step, rank and chunk?"""
    attempt = Attempt(_exercise(), "reduce_scatter", print)
    rows = [[(0, 1), (0, 1)]]  # both send chunk 0 but receive into chunk 1
    text = _fails(judge_schedule, attempt, "reduce-scatter", 2, rows)
    assert text.startswith("on 2 ranks, at reduce-scatter step 0, rank 0 receives into chunk 1, but its left neighbour")


def test_a_wrong_row_names_the_case_and_why_uneven_sizes_matter():
    """4.2-4.4: does a wrong case's feedback give the world size, dtype, shape, rank and the uneven split?"""
    attempt = Attempt(_exercise().exercise, "correct", print)
    result = [[{"shape": (10,), "dtype": "float32", "ok": False, "why": "first wrong element at flat index 9"}], []]
    text = _fails(judge_rows, attempt, 3, result)
    assert text.startswith("on 3 ranks, a float32 tensor of shape (10,) (10 elements), rank 0: first wrong element")
    assert "10 elements do not split evenly over 3 ranks" in text
    judge_rows(attempt, 2, [[{"shape": (4,), "dtype": "int64", "ok": True}]] * 2)  # all right: no failure


def _signatures(values, weight_changed=False, asynchronous=False) -> list[dict]:
    """What signature_worker returns, for each rank's final .grad (None, or a list)."""
    return [{"grad": None if v == [None] else v, "weight_changed": weight_changed, "asynchronous": asynchronous}
            for v in values]


@pytest.mark.parametrize("values, options, says", [
    ([[7.0], [7.0], [7.0]], {}, "exactly world_size = 3 times too large. Did you divide by the world size?"),
    ([[7 / 3], [2.0], [4.0]], {}, "Rank 0 is right but the others are not"),
    ([[1.0], [2.0], [4.0]], {}, "Each rank kept its own gradient"),
    ([[None], [7 / 3], [7 / 3]], {}, "rank 0's .grad became None"),
    ([[1.0], [2.0], [4.0]], {"weight_changed": True}, "averaged the weights instead of the gradients"),
    ([[7.0], [7.0], [7.0]], {"asynchronous": True}, "a division made before wait() on an asynchronous all_reduce"),
    ([[2.0], [3.0], [4.0]], {"asynchronous": True}, "half-finished exchange"),
    # float32 on the way: the values print as the mean at 6 digits, so they are shown in full, and why they fail.
    ([[2.3333332538604736]] * 3, {}, "rank 0 ended with 2.3333332538604736; "),
    ([[2.3333332538604736]] * 3, {}, "within a millionth of the mean but not on it"),
])
def test_the_signature_gradient_names_the_mistake(values, options, says):
    """5.1: from each rank's 2**rank gradient, does the feedback say what the learner's averaging did wrong, and never
    show failing values that read as the right ones?"""
    text = _fails(judge_signature, Attempt(_exercise(), "correct", print), 3, _signatures(values, **options))
    assert says in text
    if [7 / 3] not in values:  # a rank that holds the mean may say so; one that does not must not look as if it did
        assert "ended with 2.33333;" not in text


def test_the_signature_of_a_right_mean_passes():
    judge_signature(Attempt(_exercise(), "correct", print), 3, _signatures([[7 / 3]] * 3))


# -- a torchrun job's feedback, from the records its processes write ------------------------------


def _run(tmp_path: Path, **fields) -> ScriptRun:
    (tmp_path / "train.py").write_text("import os\n\ndef main():\n    raise ValueError('bad batch')\n")
    fields.setdefault("codes", [1, 1])
    return ScriptRun(nnodes=2, nproc=2, folder=tmp_path, output=["[agent 0] hello"], **fields)


def test_the_first_failure_is_told_with_its_line_and_without_the_wrapper(tmp_path):
    """Does a failed job name the first process to fail, its exception, its line in train.py, and hide the course's wrapper?"""
    frames = [Frame(str(tmp_path / "graded_run.py"), 70, "_script", "runpy.run_path(...)"),
              Frame(str(tmp_path / "train.py"), 4, "main", "raise ValueError('bad batch')")]
    first = Failure(agent=0, rank=1, local_rank=1, exitcode=1, when=1.0, exc_type="ValueError",
                    exc_message="bad batch", frames=frames)
    later = Failure(agent=1, rank=2, local_rank=0, exitcode=-15, when=2.0)
    text = failure_text(_run(tmp_path, failures=[first, later]))
    assert text.startswith("under 2 torchrun agents (simulated hosts) of 2 processes each, a process failed")
    assert "rank 1 (local rank 1 under torchrun agent 0) raised ValueError: bad batch" in text
    assert "at train.py line 4, in main: raise ValueError('bad batch')" in text
    assert "Also failed after it: rank 2 (SIGTERM)" in text and "graded_run.py" not in text


def test_an_argparse_local_rank_gets_the_torchrun_hint(tmp_path):
    """Does a script that declared --local-rank and exited get told that torchrun sets LOCAL_RANK instead?"""
    failure = Failure(agent=0, rank=0, local_rank=0, exitcode=2, when=1.0, options=["--local-rank"],
                      stderr=["usage: train.py [-h] --local-rank LOCAL_RANK"])
    text = failure_text(_run(tmp_path, failures=[failure]))
    assert "exited with code 2 without a Python exception" in text and "usage: train.py" in text
    assert "read LOCAL_RANK from the environment" in text


def test_a_job_that_hung_says_where_each_process_was(tmp_path):
    """Does a stopped job show, per rank, its innermost line of train.py when the stacks were dumped?"""
    stacks = {"0": [Frame("/x/torch/distributed/c10d.py", 9, "barrier"), Frame(str(tmp_path / "train.py"), 4, "main")]}
    text = failure_text(_run(tmp_path, timed_out=True, stacks=stacks, codes=[None, None]))
    assert "did not finish within 90 s" in text
    assert "rank 0 was at train.py line 4, in main: raise ValueError('bad batch')" in text
    assert "process_group=" not in text  # no thread was writing a checkpoint beside it
    assert failure_text(ScriptRun(1, 2, tmp_path, [0], [])) is None
    # A checkpoint still written in another thread (async_save on the training's group): the fix is named.
    writing = [[Frame("/v/site-packages/torch/distributed/checkpoint/state_dict_saver.py", 487, "_save_state_dict")]]
    text = failure_text(_run(tmp_path, timed_out=True, stacks=stacks, beside={"0": writing}, codes=[None, None]))
    assert "rank 0 was at train.py line 4" in text and "still being written in a thread of its own" in text, text
    assert 'dcp.async_save(..., process_group=dist.new_group(backend="gloo"))' in text, text


def test_a_job_kept_alive_by_an_unwaited_async_save_is_told_to_wait_for_its_future(tmp_path):
    """When every process returned from main() and the job still hung: are the threads that kept each one alive named,
    with async_save's fix when they were writing a checkpoint; and is an idle pool thread, which Python ends at exit,
    left out (the job then gets the usual words for a hang)?"""
    site = "/venv/lib/python3.11/site-packages/torch/distributed"
    writing = [Frame(f"{site}/distributed_c10d.py", 4287, "all_gather"),
               Frame(f"{site}/checkpoint/state_dict_saver.py", 513, "_save_state_dict"),
               Frame("/python/lib/python3.11/concurrent/futures/thread.py", 58, "run")]
    idle = [Frame("/python/lib/python3.11/threading.py", 320, "wait"),
            Frame("/python/lib/python3.11/concurrent/futures/thread.py", 81, "_worker")]
    exits = {"0": False, "1": False, "2": False, "3": False}
    waiting = {"0": [("AsyncCheckpointExecutor_0", writing)] * 3, "1": [("AsyncCheckpointExecutor_0", writing)],
               "2": [("ThreadPoolExecutor-0_0", idle)], "3": []}
    text = failure_text(_run(tmp_path, timed_out=True, codes=[None, None], exits=exits, waiting=waiting))
    assert "every process had returned from main() (its exit was recorded), yet the job did not end" in text, text
    assert ("rank 0: 3 threads, the newest named AsyncCheckpointExecutor_0, in torch/distributed/distributed_c10d.py "
            "line 4287, in all_gather") in text, text
    assert "rank 1: a thread named AsyncCheckpointExecutor_0" in text and "rank 2" not in text, text
    assert "call .result() on it before the next save and before dist.destroy_process_group()" in text, text
    # Only idle threads: the usual words. A process that never returned from main(): the usual words.
    quiet = {"0": [("ThreadPoolExecutor-0_0", idle)]}
    for fields in ({"exits": exits, "waiting": quiet}, {"exits": {"0": False}, "waiting": waiting}):
        text = failure_text(_run(tmp_path, timed_out=True, codes=[None, None], **fields))
        assert "returned from main()" not in text and "A process that waits for a collective" in text, text


# -- what a graded cell shows, and the class summary ----------------------------------------------


def test_a_verdict_replaces_the_placeholder_and_names_what_was_left_out(tmp_path):
    """Does a failed part's cell show the exercise, the part and its points, then the message, the left-out lines,
    and no placeholder?"""
    cell = nbformat.v4.new_code_cell("exercise('9.1').grade(answer, 'correct')")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=DEFERRED + "\n")]
    result = {"exercise": "9.1", "part": "correct", "points": 2, "score": 0, "message": "correct: rank 1 was wrong.",
              "text": "rank 1 was wrong."}
    outputs = verdict_outputs(cell, result, ["cell 3, line 1: print(x)"], tmp_path)
    assert len(outputs) == 1 and outputs[0]["ename"] == "GradingFailure"
    assert outputs[0]["evalue"] == 'Exercise 9.1, part "correct": 0 of 2 points.'
    assert outputs[0]["traceback"][1] == "rank 1 was wrong."
    assert CLEAN_NOTE in "\n".join(outputs[0]["traceback"]) and "cell 3, line 1: print(x)" in outputs[0]["traceback"][-1]
    passed = verdict_outputs(cell, dict(result, score=2), [], tmp_path)
    assert passed[-1]["text"] == 'Exercise 9.1, part "correct": passed (2 of 2 points).\n'


def test_a_fault_of_the_course_keeps_its_whole_message(tmp_path):
    """Does a part whose check broke (CheckError) show the course's whole message, with where it failed for the
    instructor, rather than the learner's short verdict?"""
    cell = nbformat.v4.new_code_cell("exercise('9.1').grade(answer, 'correct')")
    message = ('Exercise 9.1, part "correct": the course\'s check itself failed (KeyError: 1).\nThis is a fault in '
               'the course\'s grading code.\nWhere it failed, for the instructor:\n  File "ringcheck.py", line 3, in x')
    result = {"exercise": "9.1", "part": "correct", "points": 2, "score": 0, "message": message, "text": message,
              "check_error": True}
    [output] = verdict_outputs(cell, result, [], tmp_path)
    assert output["ename"] == "CheckError" and output["evalue"] == message.splitlines()[0]
    assert output["traceback"][1:] == message.splitlines()[1:]


def _record() -> dict:
    def part(score, text=None):
        return {"exercise": "4.4", "part": "correct", "points": 4, "score": score, "text": text,
                "message": f"correct: {text}" if text else None}

    runs = [
        {"student": "ana", "lesson": "04-ring-all-reduce", "seconds": 9.0, "status": "ok", "parts": [part(4)]},
        {"student": "bo", "lesson": "04-ring-all-reduce", "seconds": 12.0, "status": "ok",
         "parts": [part(0, "on 4 ranks, rank 2 returned 1.5 instead of 6")]},
        {"student": "cy", "lesson": "04-ring-all-reduce", "seconds": 30.0, "status": "ok",
         "parts": [part(0, "on 3 ranks, rank 1 returned 2 instead of 9")]},
        {"student": "di", "lesson": "04-ring-all-reduce", "seconds": 5.0, "status": "failed", "tries": 2,
         "failure": "infrastructure", "error": "bwrap: Can't mount proc", "log": "di.log", "parts": []},
    ]
    return {"sandbox": True, "jobs": 2, "seconds": 60.0, "submissions": runs}


def test_failures_of_one_kind_are_counted_together():
    """Are two failures that differ only in numbers one kind, shown by a real message, and the passes counted?"""
    assert failure_kind("on 4 ranks, rank 2 returned 1.5 instead of 6") == "on N ranks, rank N returned N instead of N"
    [row] = part_rows(_record())
    assert (row["graded"], row["passed"]) == (3, 1)
    [(kind, n, example)] = row["failures"]
    assert n == 2 and example == "on 4 ranks, rank 2 returned 1.5 instead of 6"


def test_the_summary_files_say_who_was_slowest_and_who_could_not_be_graded(tmp_path):
    """Do the terminal text, the CSV and the HTML carry the pass rate, the commonest failure and the ungraded learner?"""
    text = summarise(_record(), tmp_path)
    assert "passed   1 / 3" in text and "2x on 4 ranks, rank 2 returned 1.5 instead of 6 (and 1 like it)" in text
    assert "Slowest: cy/04-ring-all-reduce 30 s" in text
    assert "di/04-ring-all-reduce: the grading machinery's failure after 2 tries: bwrap: Can't mount proc" in text
    csv_text = (tmp_path / "class-summary.csv").read_text()
    assert "04-ring-all-reduce,4.4,correct,4,3,1,0.33," in csv_text
    assert "bwrap: Can&#x27;t mount proc" in (tmp_path / "class-summary.html").read_text()
    json.dumps(_record())  # the record is plain data, as grading-run.json holds it


def test_a_failure_in_a_notebook_shows_the_exercise_part_and_message_only():
    """Does a failing part render as one 'GradingFailure: Exercise N, part "p": ...' block, with no frames of the kit?"""
    with pytest.raises(GradingFailure) as failed:
        _exercise(lambda attempt: attempt.fail("every rank holds the sum.\nDid you divide?")).grade(lambda: 0, "correct")
    lines = failed.value._render_traceback_()
    assert lines[0].endswith('GradingFailure\x1b[0m: Exercise 9.1, part "correct": every rank holds the sum.')
    assert lines[1:] == ["Did you divide?"]
    again = pickle.loads(pickle.dumps(failed.value))
    assert again.exercise == "Exercise 9.1" and again._render_traceback_() == lines


def test_a_package_without_bytecode_is_compiled_once_before_grading_and_an_unwritable_one_is_named(tmp_path, monkeypatch):
    """Does grading's preparation find a package installed without bytecode (uv's default), compile its folder once,
    then find nothing; and, where the folder is not the grader's to write, name it with the command that would?"""
    import importlib.util

    from autograder.grading.bytecode import missing, prepare

    site = tmp_path / "site-packages"
    (site / "unbuilt").mkdir(parents=True)
    (site / "unbuilt" / "__init__.py").write_text("VALUE = 1\n")
    (site / "unbuilt" / "inner.py").write_text("OTHER = 2\n")
    monkeypatch.syspath_prepend(str(site))
    assert missing(("unbuilt", "json")) == [site]

    said: list[str] = []
    assert prepare(("unbuilt",), say=said.append, writable=lambda folder: False) == [site]
    assert len(said) == 1 and "is not yours to write" in said[0], said
    assert f"-m compileall -q -j 0 {site}" in said[0], said

    said.clear()
    assert prepare(("unbuilt",), say=said.append) == []
    assert len(said) == 1 and said[0].startswith(f"Compiling the bytecode of {site} once"), said
    for module in ("__init__.py", "inner.py"):
        assert Path(importlib.util.cache_from_source(str(site / "unbuilt" / module))).is_file(), module
    said.clear()
    assert prepare(("unbuilt",), say=said.append) == [] and said == []


def test_grading_compiles_the_courses_own_packages_where_they_are():
    """Does grading's preparation bring the bytecode of the course's own modules up to date in the checkout (which the
    sandbox shows read-only, so a module without it would be compiled again by every sandboxed process)?"""
    import importlib.util

    from autograder.grading.bytecode import COURSE_PACKAGES, prepare

    assert COURSE_PACKAGES == ("helpers", "autograder")
    cached = [Path(importlib.util.cache_from_source(str(ROOT / path)))
              for path in ("helpers/_runtime/wire.py", "autograder/kit/pieces.py")]
    for path in cached:
        path.unlink(missing_ok=True)
    assert prepare((), say=lambda text: None) == []
    assert all(path.is_file() for path in cached), cached
