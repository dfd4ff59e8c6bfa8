"""What a group of ranks is told when it starts: its launch spec, and a fresh rendezvous port.

:func:`group_spec` builds the :class:`~helpers._runtime.protocol.GroupSpec` that the rank
factory hands every rank of a new group (environment, threads per rank, the notebook's
source lines for tracebacks, the rendezvous store); :data:`PG_TIMEOUT_MARGIN` is how much
longer than a request the process group itself may wait.

    >>> spec = group_spec(2, 1, "gloo", init=False, pg_timeout=40.0, extra_env={}, forbid={}, cpus=4)
    >>> spec.env["WORLD_SIZE"], spec.threads, spec.store_path
    ('2', 2, None)
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile

from .cells import kernel_sources
from .protocol import GroupSpec

__all__ = ["group_spec", "free_port", "PG_TIMEOUT_MARGIN"]

#: The process group's own timeout is the request timeout plus this: ours must fire
#: first, so that a hang is diagnosed rather than ended by a gloo error.
PG_TIMEOUT_MARGIN = 30.0

def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (for code that binds its own store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def group_spec(world: int, nnodes: int, backend: str, *, init: bool, pg_timeout: float, extra_env: dict[str, str],
               forbid: dict[str, str], cpus: int | None) -> GroupSpec:
    """What every rank of a new group is told: its environment, threads, sources and rendezvous.

    With ``init``, the rendezvous store is a file in a new folder of the group's own
    (``spec.store_dir``): whoever closes the group removes it, and the factory does if they cannot.
    """
    local_world = world // nnodes
    env = dict(os.environ)
    env.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local_world),
            "GROUP_WORLD_SIZE": str(nnodes),
            "ROLE_WORLD_SIZE": str(world),
            "MPLBACKEND": "Agg",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host
    env.update(extra_env)
    cpus = cpus or os.cpu_count() or 1
    store_path = store_dir = None
    if init:  # the rendezvous store: a file in a folder of this group's own
        store_dir = tempfile.mkdtemp(prefix="helpers-rdzv-")
        store_path = os.path.join(store_dir, "store")
    return GroupSpec(
        world_size=world,
        backend=backend,
        init=init,
        pg_timeout=pg_timeout,
        env=env,
        cwd=os.getcwd(),
        sys_path=list(sys.path),
        threads=max(1, cpus // local_world) if nnodes == 1 else max(1, cpus // world),
        sources=kernel_sources(),
        store_path=store_path,
        store_dir=store_dir,  # the factory removes it if we cannot
        forbid=forbid,
    )
