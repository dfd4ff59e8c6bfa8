"""Tools for the course's own tests and benchmarks; not shipped with the course.

``tests/`` and ``bench/`` import these from the repository root:

- :mod:`devtools.scratch`: throw-away copies of the course for trying the grading workflow;
- :mod:`devtools.kernel`: a real Jupyter kernel to run cells in;
- :mod:`devtools.load`: busy processes that keep the cores occupied (the soak, the output benchmark);
- :mod:`devtools.slowpoll`: the kernel's wait for its ranks, slowed on purpose;
- :mod:`devtools.soak`: test modules run again and again on a busy machine.

A free loopback port for a server or a baseline is ``helpers._runtime.spec.free_port``, the one
the ranks' rendezvous uses (importing :mod:`helpers` starts nothing).
"""
