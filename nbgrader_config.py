"""nbgrader configuration for this course (read by every `nbgrader` command run from here).

- solutions/<lesson>/<lesson>.ipynb  instructor notebooks: the source of truth
- course/<lesson>/<lesson>.ipynb     learner notebooks, made by `make course`
- autograder/                        grading work folders (git-ignored) and the gradebook

The course id and the work folders are set here so that the standard nbgrader commands
(`nbgrader generate_assignment`, `nbgrader autograde`, `nbgrader generate_feedback`,
`nbgrader export`, the formgrader) all work from the repository root.
"""

import os

from autograder.notebooks.preprocessors import CODE_STUB, SANITIZE

HERE = os.path.dirname(os.path.abspath(__file__))

c = get_config()  # noqa: F821 - provided by nbgrader's config loader

c.CourseDirectory.course_id = "distributed-pytorch"
c.CourseDirectory.root = HERE
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"
c.CourseDirectory.submitted_directory = os.path.join("autograder", "submitted")
c.CourseDirectory.autograded_directory = os.path.join("autograder", "autograded")
c.CourseDirectory.feedback_directory = os.path.join("autograder", "feedback")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(HERE, "autograder", "gradebook.db")
# nbgrader's exchange (release, fetch, submit, collect, feedback): nbgrader's default folder,
# or the one the course's JupyterHub uses (hub/serve.py sets COURSE_EXCHANGE for the instructor).
if os.environ.get("COURSE_EXCHANGE"):
    c.Exchange.root = os.environ["COURSE_EXCHANGE"]
# ... or over HTTP, ngshare as a service of the hub (`make hub EXCHANGE=ngshare`; hub/ngshare_service.py).
if os.environ.get("COURSE_NGSHARE_URL"):
    from autograder.learner.ngshare import use_ngshare

    use_ngshare(c, os.environ["COURSE_NGSHARE_URL"])
else:  # the shared folder: collect (make collect, the formgrader's Collect) skips submissions still being written
    c.ExchangeFactory.collect = "autograder.grading.inbound.WholeCollect"
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "README.md"]

# Learner notebooks keep the lessons' pictures out of git: generate_assignment must not
# execute anything, and releases carry no outputs.
c.ClearOutput.enabled = True

# Grading: every cell gets up to 90 s (the multi-rank checks end long before, on their
# own timeouts), changed read-only and test cells are restored from the gradebook.
c.Execute.timeout = 90
c.Execute.interrupt_on_timeout = True
c.Execute.raise_on_iopub_timeout = False
c.OverwriteCells.enabled = True
c.CheckCellMetadata.enabled = True

# Exercise stubs: what a learner sees in place of the solution (the text is defined once,
# in autograder/notebooks/preprocessors.py, which then makes each stub name its exercise).
c.ClearSolutions.code_stub = {"python": CODE_STUB}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# A learner who deletes a graded or read-only cell gets it back, where it was, and graded
# (autograder/notebooks/preprocessors.py); OverwriteCells then restores edited read-only cells.
c.Autograde.sanitize_preprocessors = list(SANITIZE)

# A flood of output from a learner's cell is cut, not stored in the feedback.
c.LimitOutput.max_lines = 200
c.LimitOutput.max_traceback = 60

# Feedback shows each graded part's verdict, never the hidden test's source (nbgrader issues 917
# and 1363): the hidden region of every test cell is cleared before the page is written, by
# `make grade` and by the formgrader's Generate Feedback alike. The graded notebook keeps it.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# Stubs name their exercise, and every learner notebook starts with the Colab badge and
# set-up cell (see autograder/notebooks/preprocessors.py and autograder/notebooks/colab.py).
c.GenerateAssignment.preprocessors = [
    "autograder.notebooks.preprocessors.AddColabCells",
    "nbgrader.preprocessors.IncludeHeaderFooter",
    "nbgrader.preprocessors.InstantiateTests",
    "nbgrader.preprocessors.LockCells",
    "nbgrader.preprocessors.ClearSolutions",
    "autograder.notebooks.preprocessors.NameExerciseStubs",
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.CheckCellMetadata",
    "nbgrader.preprocessors.ComputeChecksums",
    "nbgrader.preprocessors.SaveCells",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbgrader.preprocessors.ClearMarkScheme",
    "nbgrader.preprocessors.ComputeChecksums",
    "nbgrader.preprocessors.CheckCellMetadata",
]
