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

from helpers._runtime.spec import free_port

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "course-test-token"


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    """GET ``url``: its HTTP status and body (empty for an error status)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, ""


#: Ports tried by :func:`start` before giving up: a free port can be taken before the server binds it.
PORT_TRIES = 4
#: What JupyterLab prints when its port was taken (it is told not to move to another one, and exits).
PORT_TAKEN = "is already in use"


def serve(target: str, port: int, env: Mapping[str, str] | None = None, log: IO[str] | None = None) -> subprocess.Popen:
    """Start ``make TARGET`` on ``port`` (loopback only, token ``TOKEN``, no browser) in a new process group.

    ``env`` adds variables to this process's environment for the server. Its output goes to
    a pipe that :func:`stop` reads, or to the open file ``log`` for a server that runs long
    (a full pipe would stall it). The server exits rather than move to another port when
    ``port`` is taken (``port_retries=0``): a test that waits on ``port`` would never find it.
    """
    args = (f"--no-browser --port={port} --ServerApp.port_retries=0 --ServerApp.ip=127.0.0.1 "
            f"--IdentityProvider.token={TOKEN}")
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


def start(target: str, env: Mapping[str, str] | None = None, log_path: Path | None = None,
          seconds: float = 120) -> tuple[subprocess.Popen, int, int]:
    """Start ``make TARGET`` on a free port and wait for JupyterLab: ``(process, port, last HTTP status)``.

    The port is free when it is chosen, but kernels, browsers and other servers open ports all
    the time, and one may take it before JupyterLab binds it; then the server exits saying so,
    and it is started again on another free port (:data:`PORT_TRIES` in all). Output goes to
    ``log_path`` (written afresh for each try) or to a pipe that :func:`stop` reads.
    """
    for attempt in range(1, PORT_TRIES + 1):
        port = free_port()
        log = open(log_path, "w") if log_path is not None else None
        try:
            proc = serve(target, port, env=env, log=log)
        finally:
            if log is not None:
                log.close()  # the server has its own copy of the descriptor
        status, _ = wait_for(f"http://127.0.0.1:{port}/lab?token={TOKEN}", proc, seconds)
        if status == 200 or proc.poll() is None or attempt == PORT_TRIES:
            return proc, port, status
        said = log_path.read_text(errors="replace") if log_path is not None else (proc.stdout.read() or "")
        if PORT_TAKEN not in said:
            if proc.stdout is not None:  # what it printed, kept for the caller's report
                proc.stdout = __import__("io").StringIO(said)
            return proc, port, status
    raise AssertionError("unreachable")
