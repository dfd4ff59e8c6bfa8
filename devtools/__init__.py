"""Tools for the course's own tests and benchmarks; not shipped with the course.

``tests/`` and ``bench/`` import these from the repository root:

- :mod:`devtools.scratch`: throw-away copies of the course for trying the grading workflow;
- :mod:`devtools.ports`: a free loopback port, without importing :mod:`helpers` (which
  starts the rank factory on import, and would disturb a benchmark's baseline).
"""
