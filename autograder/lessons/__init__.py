"""What is graded: each lesson's exercises, declared once, and the kit and harness they are built on.

- :mod:`~autograder.lessons.kit`: one :class:`~autograder.lessons.kit.Exercise` per graded
  exercise (its parts and points, the calls it switches off, its self-check), the registry
  that finds ``"4.4"`` in ``lesson04.py``, and the small pieces checks share.
- :mod:`~autograder.lessons.harness`: runs a learner's function on fresh ranks and tells a
  wrong answer (``GradingFailure``) from a broken check (``CheckError``).
- ``lessonNN.py``: lesson NN's ``EXERCISES``, found by number; nothing else registers them.
- :mod:`~autograder.lessons.reference`: the instructor's answers, used by tests and
  benchmarks; it never ships to learners and is hidden inside the grading sandbox.

Learners get this package too (``make release``), with every hidden check replaced.
"""
