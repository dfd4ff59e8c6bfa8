"""How a class is graded: ``make grade`` / ``python -m autograder grade FOLDER``.

- :mod:`~autograder.grading.grade`: collect the submissions, grade them side by side, merge
  each into the gradebook, write ``grades.csv`` and the run's record.
- :mod:`~autograder.grading.submission`: one submission, in a work folder of its own:
  nbgrader's autograde, the clean re-grade, the verdicts, the feedback page, the log.
- :mod:`~autograder.grading.sandbox`: the bubblewrap sandbox the learner's code runs in.
- :mod:`~autograder.grading.clean`: every graded part decided again in a fresh process that
  holds only the learner's definitions.
- :mod:`~autograder.grading.summary`: the class summary (CSV and HTML).

Modules here may use :mod:`autograder.lessons` and :mod:`autograder.course`; neither of
those imports anything from here.
"""
