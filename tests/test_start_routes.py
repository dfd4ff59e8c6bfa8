"""The README's `make lab` and the instructors' `make instructor` (docs/instructors.md), run as people run them.

`make lab` and `make instructor` are started as real processes (as whoever runs the tests:
root in CI and in most containers), and must serve JupyterLab; the instructor's server
must also serve nbgrader's formgrader with every lesson listed. Each server is started in
its own process group and stopped through it, so nothing outlives the test.
"""

from __future__ import annotations

import json
import os

import pytest

from _servers import ROOT, TOKEN, get, start, stop


def _ask_server(target: str, path: str) -> tuple[int, tuple[int, str], str]:
    """Start `make TARGET`, wait for JupyterLab, GET ``path``; return the lab's status, that answer, and make's output."""
    proc, port, status = start(target, seconds=90)
    try:
        # The first formgrader request creates the gradebook: give a busy machine time.
        answer = get(f"http://127.0.0.1:{port}{path}?token={TOKEN}", timeout=60)
    finally:
        output = stop(proc)
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


@pytest.mark.slow
def test_a_port_taken_before_the_lab_binds_it_is_replaced(monkeypatch):
    """When the free port chosen is taken before JupyterLab binds it, does the lab exit at once and come up on
    another port (instead of moving to a port nobody waits on)?"""
    import socket

    import _servers

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    real = _servers.free_port
    monkeypatch.setattr(_servers, "free_port", lambda: next(ports, None) or real())
    try:
        proc, port, status = _servers.start("lab", seconds=90)
        try:
            assert status == 200 and port != taken.getsockname()[1], (port, status)
        finally:
            stop(proc)
    finally:
        taken.close()
