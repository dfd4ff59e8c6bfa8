"""The hub's port race closed (hub/spawner.py): a server whose port was taken starts again elsewhere.

Real processes and real sockets: the "server" is a small Python program that binds the port it
is given, as jupyterhub-singleuser does, and exits like it when the port is taken. The whole
hub round trip (tests/test_hub.py) starts every server through the same spawner.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jupyterhub", reason="JupyterHub is not installed: run `make venv` (it is in the hub extra)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))

from spawner import PortsTaken, listening_ports, start_listening  # noqa: E402

#: Binds 127.0.0.1:PORT and listens, then sleeps; exits 1 when the port is taken (jupyter_server's port_retries=0).
SERVER = r"""
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
time.sleep(float(sys.argv[2]))  # the server's start-up (imports) before it binds: the race's window
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as exc:
    print(f"the port {sys.argv[1]} is not available: {exc}", file=sys.stderr)
    sys.exit(1)
s.listen()
time.sleep(60)
"""


def _taken() -> socket.socket:
    """A socket listening on a port the kernel chose: a port another process took."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_server_whose_port_was_taken_is_started_again_on_another_port():
    """Does a server that loses its port to another listener get started on a fresh port, its own socket found
    there, and does the port it returns belong to it, not to the process that took the first one?"""
    squatter = _taken()
    first = squatter.getsockname()[1]
    ports = iter([first])
    choose = lambda: next(ports, 0) or _free()  # noqa: E731 - the first pick is the taken port, then free ones
    started: list[subprocess.Popen] = []
    said: list[str] = []

    async def start(port: int) -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "-c", SERVER, str(port), "0.3"], stderr=subprocess.PIPE))
        return started[-1]

    try:
        port = asyncio.run(start_listening(start, attempts=3, choose=choose, log=said.append, timeout=30))
        assert port != first and len(started) == 2, (port, first, said)
        assert started[0].wait(10) == 1 and b"not available" in started[0].stderr.read()
        assert listening_ports([started[1].pid]) == {port}
        assert first not in listening_ports([started[1].pid])
        assert said and f"port {first} exited with status 1 before it listened" in said[0], said
    finally:
        squatter.close()
        for proc in started:
            proc.kill()
            proc.wait(10)


def test_a_server_that_never_listens_fails_after_its_attempts_naming_the_ports():
    """When every port is taken (or the server always dies at start), does the spawn stop after its attempts,
    naming each port tried, instead of starting servers without end?"""
    squatters = [_taken() for _ in range(2)]
    ports = iter(s.getsockname()[1] for s in squatters)
    started: list[subprocess.Popen] = []

    async def start(port: int) -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "-c", SERVER, str(port), "0"], stderr=subprocess.DEVNULL))
        return started[-1]

    try:
        with pytest.raises(PortsTaken) as failed:
            asyncio.run(start_listening(start, attempts=2, choose=lambda: next(ports), log=lambda _: None, timeout=30))
        assert all(str(s.getsockname()[1]) in str(failed.value) for s in squatters), failed.value
        assert len(started) == 2 and all(proc.poll() == 1 for proc in started)
    finally:
        for s in squatters:
            s.close()


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
