"""Starting `make lab` and `make instructor` the way a learner or an instructor does, and stopping them.

Each server runs as ``make --no-print-directory TARGET LAB_ARGS=...`` in its own process
group (make, jupyter and everything they start that stays in the group), so that stopping
the group leaves nothing behind. Used by tests/test_start_routes.py and tests/test_browser.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Mapping

from devtools.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "course-test-token"


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    """GET ``url``: its HTTP status and body (empty for an error status)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, ""


def serve(target: str, port: int, env: Mapping[str, str] | None = None, log: IO[str] | None = None) -> subprocess.Popen:
    """Start ``make TARGET`` on ``port`` (loopback only, token ``TOKEN``, no browser) in a new process group.

    ``env`` adds variables to this process's environment for the server. Its output goes to
    a pipe that :func:`stop` reads, or to the open file ``log`` for a server that runs long
    (a full pipe would stall it).
    """
    args = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={TOKEN}"
    return subprocess.Popen(
        ["make", "--no-print-directory", target, f"LAB_ARGS={args}"],
        cwd=ROOT, stdout=subprocess.PIPE if log is None else log, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env=None if env is None else {**os.environ, **env},
    )


def stop(proc: subprocess.Popen) -> str:
    """End the server's whole process group (make, jupyter and its children); return its output."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return proc.stdout.read() if proc.stdout else ""


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` still exists (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, but is not ours to signal
        return True
    return True


def wait_for(url: str, proc: subprocess.Popen, seconds: float = 90) -> tuple[int, str]:
    """Poll ``url`` until it answers 200, the server exits, or ``seconds`` pass; the last answer."""
    deadline = time.monotonic() + seconds
    status, body = 0, ""
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            status, body = get(url)
            if status == 200:
                return status, body
        except OSError:
            pass
        time.sleep(0.5)
    return status, body
