"""The machinery under :func:`helpers.launch` and :class:`helpers.Cluster`; learners never call it.

What runs where:

- in the notebook's kernel: :mod:`.group` (a group of ranks: start, wait, stop) with
  :mod:`.rankio` (its pipes) and :mod:`.spec` (what a new group's ranks are told),
  :mod:`.report` (how a request ended, and the one place it becomes an exception),
  :mod:`.diagnose` and :mod:`.deadlock` (why ranks hang), :mod:`.cells` (the notebook
  cells' source lines, for tracebacks), and :mod:`.factory` (the handle on the rank factory);
- in the rank factory, a process that imported torch and forks ranks: :mod:`.factory_process`;
- in each rank: :mod:`.rank` (its request loop) and :mod:`.instrument` (the wrappers that
  note each torch.distributed call on the board, trace it and switch it off), with
  :mod:`.wrapper` (a torch.distributed function's wrapper), :mod:`.pgcalls` (ProcessGroup
  methods called directly), :mod:`.functional` (the functional collectives), :mod:`.apis`
  (whole APIs switched off), :mod:`.callargs`, :mod:`.work` and :mod:`.ddp_watch`;
- shared by all three: :mod:`.protocol` (every message, typed), :mod:`.board` (the shared
  memory where ranks note what they are doing), :mod:`.calls` (the torch.distributed calls
  by name) and :mod:`.wire` (framing and pickling);
- :mod:`.supervise`: the small process under :func:`helpers.run` and :func:`helpers.start`.

What a launch is asked to do arrives as one :class:`helpers.settings.LaunchSettings`.
"""
