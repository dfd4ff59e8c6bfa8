"""Choosing the communication backend, and what this machine offers.

``backend="auto"`` picks nccl when CUDA is available with at least one GPU per rank, and
gloo (CPU) otherwise. When it picks nccl, the group is made with ``"cpu:gloo,cuda:nccl"``:
CUDA tensors go through nccl and CPU tensors through gloo, so the lessons' CPU code runs
unchanged on a machine full of GPUs (nccl alone has no CPU path, and would refuse them).
An explicit ``backend="nccl"`` gives nccl alone, as ``init_process_group("nccl")`` does on
a cluster. An explicit choice that cannot work here fails before any rank starts, with a
message that names the fix.

Example::

    >>> from helpers.backend import machine_info, resolve_backend
    >>> info = machine_info()                 # probed once, in a throwaway rank
    >>> resolve_backend("auto", 4, info).name   # on a CPU-only machine
    'gloo'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import BackendUnavailableError

__all__ = ["BACKENDS", "Choice", "resolve_backend", "machine_info"]

BACKENDS = ("auto", "gloo", "nccl", "mpi")


@dataclass(frozen=True)
class Choice:
    """The backend a group will use, and the GPU of each rank (None on the CPU)."""

    name: str
    devices: tuple[int, ...] | None
    reason: str
    cpu_gloo: bool = False  # CPU tensors go through gloo in the same group (backend="auto" on GPUs)

    @property
    def init_backend(self) -> str:
        """The string each rank gives ``init_process_group``.

        >>> Choice("nccl", (0, 1), "", cpu_gloo=True).init_backend
        'cpu:gloo,cuda:nccl'
        >>> Choice("gloo", None, "").init_backend
        'gloo'
        """
        return "cpu:gloo,cuda:nccl" if self.cpu_gloo else self.name

    def describe(self, world_size: int) -> str:
        """One line for the launch banner.

        >>> Choice("nccl", (0, 1), "", cpu_gloo=True).describe(2)
        'nccl (GPUs 0-1; CPU tensors through gloo)'
        """
        where = "CPU" if self.devices is None else f"GPUs 0-{world_size - 1}" if world_size > 1 else "GPU 0"
        notes = [where] + (["CPU tensors through gloo"] if self.cpu_gloo else []) + ([self.reason] if self.reason else [])
        return f"{self.name} ({'; '.join(notes)})"


def machine_info() -> dict[str, Any]:
    """torch version, CPU count, CUDA GPUs and available backends, as the ranks see them."""
    from ._runtime.factory import get_factory

    return dict(get_factory().info)


def resolve_backend(backend: str, world_size: int, info: dict[str, Any]) -> Choice:
    """Turn the user's ``backend`` argument into a concrete choice, or explain why not."""
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not a backend this course knows; pass one of "
            f"{', '.join(map(repr, BACKENDS))} ('auto' picks nccl with enough GPUs, else gloo)"
        )
    backend = backend.lower()
    gpus = int(info.get("cuda_count") or 0)
    if backend == "auto":
        if info.get("nccl") and gpus >= world_size:
            return Choice("nccl", tuple(range(world_size)), "", cpu_gloo=bool(info.get("gloo", True)))
        if gpus and gpus < world_size:
            return Choice("gloo", None, f"{gpus} GPU{'s' if gpus != 1 else ''} for {world_size} ranks is too few for nccl")
        return Choice("gloo", None, "")
    if backend == "nccl":
        if not info.get("nccl"):
            raise BackendUnavailableError(
                f"backend='nccl' is not available in this PyTorch build (torch {info.get('torch')}, "
                f"CUDA {info.get('cuda_build') or 'none'}). Use backend='gloo', which runs on the CPU, "
                "or install a CUDA build of PyTorch on a machine with NVIDIA GPUs."
            )
        if gpus < world_size:
            raise BackendUnavailableError(
                f"backend='nccl' needs one GPU per rank: you asked for {world_size} ranks but this "
                f"machine has {gpus} CUDA GPU{'s' if gpus != 1 else ''}. Pass world_size={gpus} "
                "or fewer, or use backend='gloo' (CPU), or backend='auto' to pick for you."
                if gpus
                else "backend='nccl' needs one GPU per rank, and this machine has no CUDA GPU. "
                "Use backend='gloo' (CPU) or backend='auto'."
            )
        return Choice("nccl", tuple(range(world_size)), "")
    if backend == "mpi" and not info.get("mpi"):
        raise BackendUnavailableError(
            "backend='mpi' is not built into this PyTorch (it needs PyTorch compiled from source "
            "against an MPI library). Use backend='gloo' instead."
        )
    if backend == "gloo" and not info.get("gloo"):
        raise BackendUnavailableError("backend='gloo' is not available in this PyTorch build.")
    return Choice(backend, None, "")
