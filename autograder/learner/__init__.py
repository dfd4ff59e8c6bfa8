"""The learner's own commands. Learners get them with the course.

- :mod:`~autograder.learner.selfcheck`: ``make check LESSON=05`` runs a lesson's visible
  self-checks on the saved notebook from the command line;
- :mod:`~autograder.learner.definitions`: how grading reads a notebook: only its imports,
  functions, classes and constants count; ``make check`` reads it the same way;
- :mod:`~autograder.learner.handin`: ``make handin STUDENT=your-name`` packs the notebooks into
  one archive for the instructor.
"""
