"""What a torch.distributed call's arguments say: its peer, its tensor and bytes, its group.

The rank's wrappers (:mod:`helpers._runtime.instrument`) read a call through these, whatever
torch version names the parameters: the peer (``dst``/``src``, or ``group_dst``/``group_src``
given in the group's numbering), the tensor that says how many bytes move
(:attr:`~helpers._runtime.calls.CallInfo.tensor`, else the first parameter), and the
members of a group other than the default one.

    >>> import torch
    >>> nbytes(torch.zeros(4)), nbytes([torch.zeros(2), torch.zeros(3, dtype=torch.float64)]), nbytes("x")
    (16, 32, None)
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["PEER_PARAMS", "GROUP_PEER_PARAMS", "nbytes", "called_from_torch", "is_work", "members", "members_list",
           "global_rank", "process_group_classes"]

PEER_PARAMS = ("dst", "src")
GROUP_PEER_PARAMS = ("group_dst", "group_src")


def nbytes(value: Any) -> int | None:
    import torch

    if isinstance(value, torch.Tensor):
        try:
            return value.nbytes  # one call into C: this runs on every call a rank makes
        except RuntimeError:  # a sparse tensor: its dense size
            return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return sum(v.numel() * v.element_size() for v in value)
    return None


def called_from_torch(frames_up: int = 2) -> bool:
    """Whether the wrapped call was made by torch's own code: the module of the frame
    ``frames_up`` above this function's (by default two: past the wrapper that asks)."""
    caller = sys._getframe(frames_up).f_globals.get("__name__", "")
    return caller == "torch" or caller.startswith("torch.")


def is_work(value: Any) -> bool:
    return hasattr(value, "wait") and hasattr(value, "is_completed")


def members(group: Any) -> int | None:
    ranks = members_list(group)
    if ranks is None:
        return None
    mask = 0
    for r in ranks:
        if r < 64:
            mask |= 1 << r
    return mask


def members_list(group: Any) -> list[int] | None:
    if group is None:
        return None
    try:
        import torch.distributed as dist

        if group is dist.GroupMember.WORLD:
            return None
        return list(dist.get_process_group_ranks(group))
    except Exception:  # noqa: BLE001
        return None


def global_rank(group: Any, group_rank: int) -> int:
    try:
        import torch.distributed as dist

        return dist.get_global_rank(group, group_rank) if group is not None else group_rank
    except Exception:  # noqa: BLE001
        return group_rank


def process_group_classes() -> list[type]:
    import torch.distributed as dist

    classes = [dist.ProcessGroup]
    for name in ("ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupMPI", "Backend"):
        cls = getattr(dist, name, None) or getattr(dist.distributed_c10d, name, None)
        if isinstance(cls, type):
            classes.append(cls)
    return classes

