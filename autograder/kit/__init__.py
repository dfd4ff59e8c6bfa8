"""The exercise kit: what every graded exercise is built on. Learners get it.

- :mod:`~autograder.kit.exercise`: one :class:`~autograder.kit.exercise.Exercise` per graded
  exercise (its parts and points, the calls it switches off, its self-check) and the
  :class:`~autograder.kit.exercise.Attempt` a check receives;
- :mod:`~autograder.kit.registry`: finds ``"4.4"`` in ``autograder/lessons/lesson04.py``;
- :mod:`~autograder.kit.harness`: runs a learner's function on fresh ranks and tells a wrong
  answer (``GradingFailure``) from a broken check (``CheckError``);
- :mod:`~autograder.kit.pieces`: small pieces the checks share;
- :mod:`~autograder.kit.torchrun` with ``torchrun_programs`` and ``torchrun_feedback``: a
  learner's whole script under real torchrun agents.

Nothing here imports the instructor's packages (answers, hidden checks, grading, release,
site); ``tests/test_structure.py`` holds every shipped package to that.
"""
