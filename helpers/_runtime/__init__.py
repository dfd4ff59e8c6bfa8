"""The machinery under :func:`helpers.launch` and :class:`helpers.Cluster`; learners never call it.

What runs where:

- in the notebook's kernel: :mod:`.group` (a group of ranks: pipes, waiting, stopping),
  :mod:`.report` (how a request ended, and the one place it becomes an exception),
  :mod:`.diagnose` and :mod:`.deadlock` (why ranks hang);
- in the rank factory, a process that imported torch and forks ranks: :mod:`.factory`;
- in each rank: :mod:`.rank` (its request loop) and :mod:`.instrument` (what it notes on
  the board, traces and forbids);
- shared by all three: :mod:`.protocol` (every message and record, typed) and :mod:`.wire`
  (their framing and pickling);
- :mod:`.supervise`: the small process under :func:`helpers.run` and :func:`helpers.start`.
"""
