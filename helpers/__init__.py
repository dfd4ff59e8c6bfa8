"""Helpers for learning torch.distributed from notebook cells.

- :func:`launch` runs a function on N ranks and returns their results.
- :class:`Cluster` keeps ranks alive between cells; ``%load_ext helpers`` adds the
  ``%%distributed`` magic on top of it (see :mod:`helpers.magics`).
- Errors: :class:`RankFailedError`, :class:`LaunchTimeoutError` (and its
  :class:`DeadlockError`, raised about a second after ranks deadlock in point-to-point
  calls instead of at the timeout), :class:`BackendUnavailableError`, all subclasses of
  :class:`LaunchError`; inside a rank, :class:`ForbiddenCallError` when code calls
  something a launch switched off.
- The call names ``launch(..., forbid=...)`` takes: :data:`COLLECTIVES` (every
  collective), :data:`DATA_COLLECTIVES` (all but the barriers), :data:`POINT_TO_POINT`,
  and names that switch off a whole API (:data:`APIS`): :data:`DDP` for
  DistributedDataParallel, :data:`ZERO` for ZeroRedundancyOptimizer, :data:`FSDP` (FSDP2's
  ``fully_shard`` and FSDP1), :data:`DTENSOR` (DeviceMesh, DTensor, ``parallelize_module``),
  :data:`PIPELINING` (``torch.distributed.pipelining``), and :data:`COURSE_RING` for the
  course's own ring (lesson 8's pipelined ring, switched off where an exercise asks for a ring).
- :func:`run` and :func:`start` run a command (``torchrun``, a script) from a cell with
  live labelled output; nothing it starts outlives it (see :mod:`helpers.commands`).
- :func:`export_script` writes a notebook function as a script ``torchrun`` can run.
- :func:`machine_info` says what this machine offers (CPUs, GPUs, backends).
- :func:`shutdown` stops the background process that starts ranks (it restarts on demand).

Importing this package starts no process. The background process that starts ranks (the
rank factory, which imports torch once) starts with the first launch, ``Cluster`` or
``%%distributed`` cell, or ahead of it where a notebook will want it: in a notebook kernel
(any IPython shell), once the cell that imported helpers has run, and at ``%load_ext
helpers``. So a notebook's first launch does not wait for ``import torch``, and a script,
a grading worker or a test that imports helpers starts nothing it does not use.
"""

from __future__ import annotations

import sys

from ._runtime import factory as _factory
from ._runtime.factory import shutdown_factory as shutdown
from .backend import machine_info
from .commands import CommandFailedError, CommandTimeoutError, Job, run, start
from . import errors as _errors
from .cluster import Cluster
from .errors import (
    BackendUnavailableError,
    ClusterError,
    DeadlockError,
    ForbiddenCallError,
    Interrupted,
    LaunchError,
    LaunchTimeoutError,
    RankFailedError,
)
from .export import ExportError, export_script
from .launcher import LaunchResult, launch
from ._runtime.calls import (APIS, COLLECTIVES, COURSE_RING, DATA_COLLECTIVES, DDP, DTENSOR, FSDP, PIPELINING,
                             POINT_TO_POINT, ZERO)

__all__ = [
    "launch",
    "LaunchResult",
    *_errors.__all__,  # every exception the helpers raise (ClusterError among them)
    "COLLECTIVES",
    "DATA_COLLECTIVES",
    "POINT_TO_POINT",
    "DDP",
    "COURSE_RING",
    "ZERO",
    "FSDP",
    "DTENSOR",
    "PIPELINING",
    "APIS",
    "Cluster",
    "load_ipython_extension",
    "unload_ipython_extension",
    "machine_info",
    "shutdown",
    "run",
    "start",
    "Job",
    "CommandFailedError",
    "CommandTimeoutError",
    "export_script",
    "ExportError",
]

__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """``%load_ext helpers`` registers ``%dist_start``, ``%%distributed`` and friends, and starts the rank factory
    in the background (the ranks of the first ``%%distributed`` cell are forked from it)."""
    from .magics import load_ipython_extension as load

    load(ipython)
    _factory.start_ahead()


def unload_ipython_extension(ipython):
    from .magics import unload_ipython_extension as unload

    unload(ipython)


def _start_ahead_in_a_notebook() -> None:
    """In a notebook kernel, the cell that imports helpers is the lesson's set-up: have the kernel start the rank
    factory once that cell has run, so that the first launch finds torch imported. Anywhere else, nothing."""
    ipython = sys.modules.get("IPython")  # never imported here: a process without it is no notebook kernel
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        _factory.start_after_cell(shell)


_start_ahead_in_a_notebook()
