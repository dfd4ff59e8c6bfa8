"""Helpers for learning torch.distributed from notebook cells.

- :func:`launch` runs a function on N ranks and returns their results.
- Errors: :class:`RankFailedError`, :class:`LaunchTimeoutError`,
  :class:`BackendUnavailableError`, all subclasses of :class:`LaunchError`.
- :func:`machine_info` says what this machine offers (CPUs, GPUs, backends).
- :func:`shutdown` stops the background process that starts ranks (it restarts on demand).

Importing this package starts that background process right away, so that the first
launch does not wait for ``import torch``. Set ``HELPERS_PRESTART=0`` to start it lazily.
"""

from __future__ import annotations

import os

from ._factory import get_factory as _get_factory
from ._factory import shutdown_factory as shutdown
from .backend import machine_info
from .errors import BackendUnavailableError, LaunchError, LaunchTimeoutError, RankFailedError
from .launcher import LaunchResult, launch

__all__ = [
    "launch",
    "LaunchResult",
    "LaunchError",
    "RankFailedError",
    "LaunchTimeoutError",
    "BackendUnavailableError",
    "machine_info",
    "shutdown",
]

__version__ = "0.1.0"

if os.environ.get("HELPERS_PRESTART", "1") != "0":
    try:
        _get_factory(wait=False)
    except OSError:  # starting it later will raise a clear error if it really cannot start
        pass
