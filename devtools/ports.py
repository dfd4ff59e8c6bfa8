"""A free loopback port for servers and baselines that tests and benchmarks start.

Light on purpose: importing :mod:`helpers` starts its rank factory (about a second of CPU
for ``import torch``), which a benchmark's baseline or a server test must not pay for. Code
that runs ranks uses the helpers' own finder (``helpers._runtime.spec.free_port``).

    >>> 0 < free_port() < 65536
    True
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
