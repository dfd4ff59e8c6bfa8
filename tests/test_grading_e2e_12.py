"""Lesson 12 graded end to end with the real nbgrader: planners and layout searches, right and wrong.

A temporary copy of the course receives two learners' versions of lesson 12 and is graded with
`python -m autograder grade`, the instructor's command, in the sandbox where the course's planner file is hidden:
the hidden checks get it sealed (autograder/hidden/sealed.py). dee packs one change per exercise, a line or two
away from the answer, so that few submissions cover many parts:

- amy hands in the instructor's three answers;
- dee divides the RMSNorm scales by tp (12.1), counts tensor parallelism's forward collectives only (12.2), and
  for 12.3 tries to borrow the course's own choice: importing the planner (as a module, or through the hidden
  checks' own loader), reading its file, or any open descriptor of a file that holds it; none is reachable from the ranks the answer runs on, so the fallback, a layout of twice
  the cluster's GPUs, is what gets graded.

cid, who holds every micro-batch's activations under 1F1B (12.1), counts an all-reduce's tensor once where a ring
sends 2(p - 1)/p of it (12.2), and searches for the slowest layout that fits (12.3), is decided by the clean
re-grade alone in tests/test_regrade_12.py (the mistakes stay here, beside dee's). Right answers of other shapes
(tuples, whole numbers, zero-byte entries) and the untouched stubs are graded by tests/test_lesson12.py and the
other lessons' end-to-end modules: the same checks, without a learner's grading more.
"""

from __future__ import annotations

import pytest

from _grading import variant
from devtools.scratch import solution_source

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "12-planning-a-run"
MEMORY, TRAFFIC, LAYOUT = "ex12_1-plan-memory", "ex12_2-plan-traffic", "ex12_3-choose-layout"

EVERY_MICROBATCH = (("flight = layout.in_flight(stage)", "flight = layout.microbatches"),)
NORMS_SPLIT = (("+ 2 * h   # the norms stay whole", "+ 2 * h // t"),
               ("[h + model.vocab // t * h] * last", "[h // t + model.vocab // t * h] * last"))
ALL_REDUCE_ONCE = (('add("all_reduce", "tp", m * 2 * (t - 1) / t * (', 'add("all_reduce", "tp", m * ('),)
TP_FORWARD_ONLY = (("(layers * (6 + 2 * again) + first + 2 * last)", "(layers * (3 + again) + first + 2 * last)"),
                   ("(layers * (4 + 2 * again) + first + last)", "(layers * (2 + again) + first + last)"))
BORROWS = '''# Exercise 12.3: choose a layout
def choose_layout(model, cluster):
    """The course's own choice, if anything here can reach it; else every GPU twice over."""
    import importlib
    import os
    import stat

    try:
        return importlib.import_module("autograder.answers.lesson12").choose_layout(model, cluster)
    except ImportError:
        pass
    try:
        return importlib.import_module("autograder.hidden.sealed").load("lesson12").choose_layout(model, cluster)
    except Exception:
        pass
    import autograder

    places = [os.path.join(autograder.__path__[0], "answers", "lesson12.py")]
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:    # every process this one can see, the grader's too
        try:
            places += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            pass
    for place in places:
        try:
            if not stat.S_ISREG(os.stat(place).st_mode):
                continue
            with open(place, "rb") as f:
                text = f.read()
        except OSError:
            continue
        if b"def choose_layout" in text:
            found = {"__name__": "borrowed"}
            exec(compile(text, "borrowed", "exec"), found)
            return found["choose_layout"](model, cluster)
    return Layout(dp=2 * cluster.gpus, micro_batch=max(1, model.batch // (2 * cluster.gpus)), precision="bf16")
'''
SLOWEST = (("p.fits and (best is None or p.step < best[0])", "p.fits and (best is None or p.step > best[0])"),)

HANDED_IN = {LESSON: {
    "amy": {grade_id: solution_source(LESSON, grade_id) for grade_id in (MEMORY, TRAFFIC, LAYOUT)},
    "dee": {MEMORY: variant(LESSON, MEMORY, *NORMS_SPLIT), TRAFFIC: variant(LESSON, TRAFFIC, *TP_FORWARD_ONLY),
            LAYOUT: BORROWS},
}}


def _lose(graded_lesson, student: str, *parts: str) -> None:
    assert graded_lesson.scores(student) == {**graded_lesson.points, **dict.fromkeys(parts, 0)}


def test_the_instructors_answers_earn_full_marks(graded_lesson):
    """Do the instructor's three answers, handed in as a learner's, earn every point, the hidden checks comparing with
    the course's planner that the sandbox hides from the learner's code?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_split_norms_forward_only_traffic_are_named_and_the_course_planner_cannot_be_borrowed(graded_lesson):
    """Do norms divided by tp lose 12.1 and tp's forward collectives alone lose 12.2, each named; and does an answer that
    tries to import, read or find an open descriptor of the course's planner find none of them (the sealed planner
    reaches the clean re-grade alone), so that its fallback, twice the GPUs, loses 12.3 with that named?"""
    _lose(graded_lesson, "dee", "12.1/small", "12.1/large", "12.1/recompute", "12.2/small", "12.2/large",
          "12.3/fits", "12.3/fast")
    graded_lesson.check_feedback("dee", "holds them whole", "mirror in backward", "use all of them")


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 12, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
