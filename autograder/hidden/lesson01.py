"""Lesson 01's hidden tests: the check of every graded part of Exercises 1.1, 1.2.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson01`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.

Example::

    >>> from autograder.hidden import grade
    >>> import os
    >>> def rank_report(rank, world_size):
    ...     names = {"rank": "RANK", "local_rank": "LOCAL_RANK", "group_rank": "GROUP_RANK",
    ...              "world_size": "WORLD_SIZE", "local_world_size": "LOCAL_WORLD_SIZE"}
    ...     return {key: int(os.environ[var]) for key, var in names.items()}
    >>> grade("1.1", rank_report, "several_hosts")
"""

from __future__ import annotations

from autograder.lessons.lesson01 import _report, _share

__all__ = ["CHECKS"]


LAYOUTS = {  # part -> (world size, simulated hosts)
    "one_host": [(1, 1), (4, 1)],
    "several_hosts": [(4, 2), (6, 3), (4, 4)],
}


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "1.1": {"one_host": lambda attempt: _report(attempt, LAYOUTS["one_host"]), "several_hosts": lambda attempt: _report(attempt, LAYOUTS["several_hosts"])},
    "1.2": {"share_run_id": lambda attempt: _share(attempt, [(2, "tcp", 0.0), (4, "tcp", 0.3), (3, "file", 0.2)], timeout=12.0)},
}
