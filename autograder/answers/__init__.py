"""The instructor's answers, one module per lesson: ``autograder/answers/lessonNN.py``.

Learners write their own in the notebooks; tests, benchmarks and the checks' own tests use
these. This package never ships to learners, and the grading sandbox hides it from the
learner's code (:mod:`autograder.grading.sandbox`).
"""
