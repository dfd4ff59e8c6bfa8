"""What is graded: each lesson's exercises, declared once, and the kit and harness they are built on.

- :mod:`~autograder.lessons.kit`: one :class:`~autograder.lessons.kit.Exercise` per graded
  exercise (its parts and points, the calls it switches off, its self-check), the registry
  that finds ``"4.4"`` in ``lesson04.py``, and the small pieces checks share.
- :mod:`~autograder.lessons.harness`: runs a learner's function on fresh ranks and tells a
  wrong answer (``GradingFailure``) from a broken check (``CheckError``).
- ``lessonNN.py``: lesson NN's ``EXERCISES``, found by number; nothing else registers them.
- :mod:`~autograder.lessons.reference` (and ``reference_attention``, ``reference_faults``): the
  instructor's answers, used by tests and benchmarks; they never ship to learners and are hidden
  inside the grading sandbox.
- Lesson 07's scripts under real torchrun agents: :mod:`~autograder.lessons.torchrun` (with its
  programs, feedback and :mod:`~autograder.lessons.agentpool`); Exercise 7.2's faults by audience:
  what its self-check needs ships (``faults``, ``faultjudge``, ``faultpoints``), its hidden parts
  (``faultparts``) do not.

Learners get this package too (``make release``), with every hidden check replaced.
"""
