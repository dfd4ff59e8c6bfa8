"""Busy processes that keep the cores occupied, so that a test or a benchmark meets a busy machine.

``make soak`` (:mod:`devtools.soak`) runs its test modules beside them, and ``make bench-output``
(``bench/output_bench.py``) its ``%%distributed`` cells: a kernel that competes for the CPU, as on a
busy laptop, meets the races an idle machine hides. Each process is a plain Python loop in a session
of its own, ended by its process group id.

    >>> procs = start_load(1)          # doctest: +SKIP
    >>> stop_load(procs)               # doctest: +SKIP
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

__all__ = ["start_load", "stop_load"]

BUSY_LOOP = "while True:\n    pass\n"


def start_load(k: int) -> list[subprocess.Popen]:
    """``k`` busy processes, each in a session of its own (ended by :func:`stop_load`)."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True) for _ in range(k)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    """End the processes :func:`start_load` started, and reap them."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
