"""The README's commands, run the way a learner or an instructor runs them.

`make lab` and `make instructor` are started as real processes (as whoever runs the tests:
root in CI and in most containers), and must serve JupyterLab; the instructor's server
must also serve nbgrader's formgrader with every lesson listed. Each server is started in
its own process group and stopped through it, so nothing outlives the test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "course-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, ""


def _serve(target: str, port: int) -> subprocess.Popen:
    args = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={TOKEN}"
    return subprocess.Popen(
        ["make", "--no-print-directory", target, f"LAB_ARGS={args}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> str:
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


def _wait_for(url: str, proc: subprocess.Popen, seconds: float = 90) -> tuple[int, str]:
    deadline = time.monotonic() + seconds
    status, body = 0, ""
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            status, body = _get(url)
            if status == 200:
                return status, body
        except OSError:
            pass
        time.sleep(0.5)
    return status, body


def _ask_server(target: str, path: str) -> tuple[int, tuple[int, str], str]:
    """Start `make TARGET`, wait for JupyterLab, GET ``path``; return the lab's status, that answer, and make's output."""
    port = _free_port()
    proc = _serve(target, port)
    try:
        status, _ = _wait_for(f"http://127.0.0.1:{port}/lab?token={TOKEN}", proc)
        answer = _get(f"http://127.0.0.1:{port}{path}?token={TOKEN}")
    finally:
        output = _stop(proc)
    assert status == 200, f"JupyterLab did not answer; make {target} printed:\n{output[-3000:]}"
    return status, answer, output


@pytest.mark.slow
def test_make_lab_serves_the_course():
    """Does `make lab` start JupyterLab on course/ (with --allow-root when run as root) and serve a lesson?"""
    _, listing, output = _ask_server("lab", "/api/contents")
    names = {item["name"] for item in json.loads(listing[1])["content"]}
    assert "00-getting-started" in names and "04-ring-all-reduce" in names, names
    if os.geteuid() == 0:
        assert "Running as root: starting JupyterLab with --allow-root." in output


@pytest.mark.slow
def test_make_instructor_serves_the_formgrader_with_every_lesson():
    """Does `make instructor` start JupyterLab at the root with nbgrader's formgrader listing every lesson?"""
    lessons = sorted(p.name for p in (ROOT / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())
    gradebook = ROOT / "autograder" / "gradebook.db"
    had_gradebook = gradebook.exists()
    try:
        _, formgrader, output = _ask_server("instructor", "/formgrader/api/assignments")
    finally:
        if not had_gradebook:  # the formgrader made one (git-ignored): leave the checkout as it was
            gradebook.unlink(missing_ok=True)
    assert formgrader[0] == 200, f"the formgrader API answered {formgrader[0]}; output:\n{output[-3000:]}"
    listed = sorted(a["name"] for a in json.loads(formgrader[1]))
    assert listed == lessons, listed
