"""How a class is graded: ``make grade`` / ``python -m autograder grade FOLDER``.

- :mod:`~autograder.grading.grade`: collect the submissions, grade them side by side, merge
  each into the gradebook, write ``grades.csv`` and the run's record.
- :mod:`~autograder.grading.engine`: where they are graded (Dask workers: a ``LocalCluster``
  here, a running cluster, or SLURM jobs through :mod:`~autograder.grading.slurm`), and how
  many tries each gets; :mod:`~autograder.grading.cluster`: what every worker is given, and
  the check that a cluster's workers may grade; :mod:`~autograder.grading.progress`: the
  progress line.
- :mod:`~autograder.grading.task`: what a worker is given and gives back, files as bytes;
  :mod:`~autograder.grading.merge`: a graded submission into the course, in one process.
- :mod:`~autograder.grading.submission`: one submission, as five steps, each in the module that
  does it: the work folder (:mod:`~autograder.grading.workfolder`), nbgrader's autograde, watched
  (:mod:`~autograder.grading.autograde`), the clean re-grade (:mod:`~autograder.grading.regrade`),
  the verdicts (:mod:`~autograder.grading.verdicts`), the feedback page
  (:mod:`~autograder.grading.merge`).
- :mod:`~autograder.grading.sandbox`: the bubblewrap sandbox the learner's code runs in.
- :mod:`~autograder.grading.clean`: every graded part decided again in a fresh process that
  holds only the learner's definitions (read as :mod:`autograder.learner.definitions` reads them),
  with the hidden checks of :mod:`autograder.hidden`.
- :mod:`~autograder.grading.summary`: the class summary (CSV and HTML).
- :mod:`~autograder.grading.exchange`: ``make collect``, nbgrader's collect from the hub's
  exchange, then ``grade``; :mod:`~autograder.grading.inbound`: that collect never takes a
  submission still being written; :mod:`~autograder.grading.onegrader`: one collect or grade of a
  course at a time.

Modules here may use :mod:`autograder.kit`, :mod:`autograder.lessons`, :mod:`autograder.hidden`,
:mod:`autograder.learner` and :mod:`autograder.notebooks`; none of those imports anything from here.
"""

from ..notebooks.imports import defer_iri_grammar

# Each grading worker process (Dask spawns them) imports this package before it reads a notebook.
defer_iri_grammar()
