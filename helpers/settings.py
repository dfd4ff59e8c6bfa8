"""The settings of a launch, in one object: what :func:`helpers.launch`, :class:`helpers.Cluster`
and the autograder's harness pass down to the ranks.

:class:`LaunchSettings` holds how many ranks to start and how (backend, simulated hosts,
timeout, process group, output, trace, calls switched off), with each setting's default,
its check and its help text (``LaunchSettings.help("timeout")``) in one place. It checks
itself when made, so a bad value raises before any rank starts, naming what to pass
instead; ``forbid`` is kept as a dict of call name -> the reason a learner reads.

    >>> s = LaunchSettings(4, nnodes=2, forbid=["all_reduce"])
    >>> s.world_size // s.nnodes, s.forbid, s.timeout > 0
    (2, {'all_reduce': 'this launch switched it off'}, True)
    >>> LaunchSettings(4, nnodes=3)
    Traceback (most recent call last):
    ...
    ValueError: nnodes=3 does not divide world_size=4: every simulated host must run the same number of ranks. Pass nnodes as one of [1, 2, 4].
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union

from ._runtime.calls import COLLECTIVES, COURSE_RING, DDP, POINT_TO_POINT
from .output import OutputRouter, OutputSpec

__all__ = ["LaunchSettings", "Forbid", "default_timeout", "validate_world", "forbid_reasons"]

_DEFAULT_FORBID_REASON = "this launch switched it off"

#: What ``forbid=`` takes: call names, or call names mapped to the reason a learner reads.
Forbid = Union[Sequence[str], Mapping[str, str]]


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class LaunchSettings:
    """How to start a group of ranks; see each field's help (:meth:`help`)."""

    world_size: int = field(metadata=_help("How many ranks (processes) to start, 1 to 64."))
    backend: str = field(default="auto", metadata=_help(
        '"auto" (nccl with one GPU per rank, CPU tensors through gloo; else gloo), "gloo", "nccl" or "mpi".'))
    nnodes: int = field(default=1, metadata=_help(
        "Simulate this many hosts of world_size // nnodes ranks each (LOCAL_RANK, GROUP_RANK differ from RANK)."))
    timeout: float | None = field(default=None, metadata=_help(
        "Seconds a request may run before every rank's stack is shown and the ranks are stopped; "
        "None: 60 s, or 10 s while nbgrader executes the notebook."))
    init: bool = field(default=True, metadata=_help(
        "Whether the default process group is ready when the function starts (else it calls init_process_group)."))
    output: OutputSpec = field(default="live", metadata=_help("Where the ranks' printed output goes (see helpers.output)."))
    max_lines: int = field(default=1000, metadata=_help("At most this many lines per rank are shown."))
    trace: bool = field(default=False, metadata=_help("Record every torch.distributed call on every rank."))
    forbid: Forbid = field(default=(), metadata=_help(
        "Calls to switch off on the ranks: names from helpers.COLLECTIVES, helpers.POINT_TO_POINT, helpers.DDP "
        "or helpers.COURSE_RING, as a list or as a dict of name -> the reason the learner reads."))

    def __post_init__(self) -> None:
        timeout = default_timeout() if self.timeout is None else self.timeout
        validate_world(self.world_size, self.nnodes, timeout)
        OutputRouter(self.output)  # checks the output argument now
        object.__setattr__(self, "timeout", float(timeout))
        object.__setattr__(self, "forbid", forbid_reasons(self.forbid))

    def replace(self, **changes: Any) -> "LaunchSettings":
        """These settings with some changed (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def help(cls, name: str) -> str:
        """The help text of the setting ``name``."""
        return next(f.metadata["help"] for f in dataclasses.fields(cls) if f.name == name)


def default_timeout() -> float:
    """60 s, or 10 s while nbgrader executes the notebook (autograde or validate)."""
    return 10.0 if os.environ.get("NBGRADER_EXECUTION") else 60.0


def validate_world(world_size: Any, nnodes: Any = 1, timeout: Any = 60.0) -> None:
    """Check the shape of a launch before anything starts; raise with what to pass instead."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            f"world_size must be a whole number of ranks, 1 or more; got {world_size!r}. "
            "For example launch(fn, 4) runs fn on 4 ranks."
        )
    if world_size > 64:
        raise ValueError(
            f"world_size={world_size} is more ranks than this notebook launcher runs on one "
            "machine (at most 64); use torchrun on a cluster for more."
        )
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes must be a whole number of simulated hosts, 1 or more; got {nnodes!r}.")
    if world_size % nnodes:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"nnodes={nnodes} does not divide world_size={world_size}: every simulated host must "
            f"run the same number of ranks. Pass nnodes as one of {divisors}."
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}.")


def forbid_reasons(forbid: Forbid) -> dict[str, str]:
    """``forbid=`` as a dict of call name -> reason; raises for names that cannot be switched off."""
    if isinstance(forbid, str):
        raise TypeError(f"forbid takes a list of call names, like forbid=['all_reduce']; got the string {forbid!r}.")
    reasons = dict(forbid) if isinstance(forbid, Mapping) else dict.fromkeys(forbid, _DEFAULT_FORBID_REASON)
    known = POINT_TO_POINT + COLLECTIVES + (DDP, COURSE_RING)
    for name, reason in reasons.items():
        if name not in known:
            raise ValueError(
                f"forbid names {name!r}, which is not a call the helpers can switch off. Use names from "
                "helpers.COLLECTIVES or helpers.POINT_TO_POINT, helpers.DDP for DistributedDataParallel, or helpers.COURSE_RING for the course's ring."
            )
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"forbid[{name!r}] must be a sentence saying why it is switched off; got {reason!r}.")
    return reasons
