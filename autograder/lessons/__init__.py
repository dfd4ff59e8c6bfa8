"""Every lesson's graded exercises as learners get them: declarations, self-checks and what both run.

- ``lessonNN.py``: lesson NN's ``EXERCISES`` (found by number by :mod:`autograder.kit.registry`),
  each with its parts, points, switched-off calls and visible self-check, and the judging
  functions the self-check shares with the hidden tests;
- the checkers those use, named for what they check: ``ringcheck`` (lesson 04's ring),
  ``gradcheck`` (05 and 06's gradient averaging), ``shardcheck`` (09), ``tpcheck`` with
  ``tpdata`` and ``pipecheck`` (10), ``cpcheck`` with ``cpdata`` (11), ``plancheck`` (12); for Exercise 7.2
  ``faults`` (the course's pieces and fault plans), ``faultjudge`` (the judgements its
  self-check shares) and ``faultpoints`` (the recorder copied into each process).

The hidden tests are in :mod:`autograder.hidden` and the instructor's answers in
:mod:`autograder.answers`; neither ships, and nothing here imports them.
"""
