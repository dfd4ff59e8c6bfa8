"""The course's notebooks: ``course/`` built from ``solutions/``, and the shape of their graded cells.

- :mod:`~autograder.notebooks.generate`: ``make course`` / ``python -m autograder build`` and
  ``check``: nbgrader's ``generate_assignment`` for every lesson (and ``ROOT``, the course's folder).
- :mod:`~autograder.notebooks.preprocessors`: what nbgrader lacks (stubs that name their
  exercise, deleted cells put back, a watched kernel), configured in ``nbgrader_config.py``.
- :mod:`~autograder.notebooks.colab`: the Colab badge and set-up cell every learner notebook starts with.
- :mod:`~autograder.notebooks.cells`: one hidden test cell per graded part, and every way a
  notebook departs from its declared exercises.
"""
