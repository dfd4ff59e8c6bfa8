"""Instructor-side tools: nbgrader preprocessors, the grading harness and the lesson checks.

- :mod:`autograder.harness` runs a learner's function on fresh ranks, with built-in
  collectives disabled where the exercise is to build one, and turns every way it can
  go wrong into feedback a learner can act on.
- ``autograder.lessonNN`` holds the hidden-test checks of each lesson.
- :mod:`autograder.preprocessors` adds what nbgrader lacks (stubs that name their exercise).
- ``python -m autograder`` (see :mod:`autograder.__main__`) runs the instructor workflow.
"""
