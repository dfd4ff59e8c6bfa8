"""The Colab route: does a learner notebook install the course from its first cell and run?

Colab gives a notebook a Python with torch, ipykernel, ipywidgets and matplotlib, run as
root, and nothing of this course. The test builds exactly that in a fresh virtual
environment, marks it as Colab the way Colab's own kernel is marked (the module
``google.colab`` is imported at start-up: here a one-line stand-in, imported by a ``.pth``
file), and runs finished learner notebooks in it with nbclient, without ``make``. What the
cell clones (through ``COURSE_REPO``) is the learner distribution, built by ``python -m
autograder release`` and committed in a repository of its own as an instructor publishes
it, and the notebooks are the release's: the Colab route must work from the release alone.
Their first cell must clone it and install it with pip, and every later cell must run.

Installing the environment downloads nothing on the course's reference machine (torch
comes from the local wheel that ``TORCH_SPEC`` names elsewhere too); set
``COLAB_TORCH_SPEC`` to the pip arguments for torch on another machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from autograder.notebooks.colab import REPOSITORY
from autograder.release.checks import is_placeholder

ROOT = Path(__file__).resolve().parent.parent
# The packages Colab brings that the course relies on (torch is added below).
COLAB_PACKAGES = ["ipykernel", "ipywidgets", "matplotlib"]
KERNEL = "colab-like"
LESSONS = ["00-getting-started", "04-ring-all-reduce"]


def _run(cmd: list[str], **kwargs) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _installer(python: Path, torch_spec: list[str]) -> list[str]:
    """The command that installs packages into ``python``'s environment as pip would pick them, without bytecode.

    uv (the test extra installs it beside this Python) when it is there: 3 s where pip takes 16 s. uv does
    not read pip's settings, so the indexes and folders of wheels pip is told to use (``find-links``: a
    machine's local torch build) and its constraints are handed on, with pip's way of choosing among several
    indexes (the newest version any of them has); otherwise both take packages from PyPI. A ``torch_spec``
    with options of its own (``COLAB_TORCH_SPEC``: pip arguments, an index URL perhaps) goes to pip as given.
    """
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None or any(arg.startswith("-") for arg in torch_spec):
        return [str(python), "-m", "pip", "install", "-q", "--no-compile"]
    settings = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    flags = []
    for line in settings.splitlines():
        key, _, value = line.partition("=")
        option = {"find-links": "--find-links", "constraint": "--constraint", "index-url": "--index-url",
                  "extra-index-url": "--extra-index-url"}.get(key.rsplit(".", 1)[-1])
        for item in value.strip("'\"").split() if option else ():
            if item not in flags:  # pip lists a setting once per place it is set
                flags += [option, item]
    return [uv, "pip", "install", "--quiet", "--python", str(python), "--index-strategy", "unsafe-best-match", *flags]


def _torch_spec() -> list[str]:
    import torch

    return os.environ.get("COLAB_TORCH_SPEC", f"torch=={torch.__version__.split('+')[0]}").split()


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """A Colab-like Python with its own kernel, and a folder like Colab's /content."""
    base = tmp_path_factory.mktemp("colab")
    env_dir = base / "python"
    _run([sys.executable, "-m", "venv", str(env_dir)])
    python = env_dir / "bin" / "python"
    # What Colab brings, installed without compiling it to bytecode first (pip's default): 16 s instead of 35 s here
    # with pip, 3 s with uv, and the kernel compiles the modules it imports once. The course's own install, in the
    # notebook's first cell, is the learner's pip command as it is.
    torch_spec = _torch_spec()
    _run([*_installer(python, torch_spec), *torch_spec, *COLAB_PACKAGES])
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    (site / "google" / "colab").mkdir(parents=True)
    (site / "google" / "colab" / "__init__.py").write_text('"""Stand-in for Colab\'s own module: marks this Python as Colab."""\n')
    (site / "colab_marker.pth").write_text("import google.colab\n")
    _run([str(python), "-m", "ipykernel", "install", "--sys-prefix", "--name", KERNEL])

    # What the learners clone: the learner distribution, committed on `main` in a repository
    # of its own, as an instructor publishes it. Until REPOSITORY is set only a draft can be
    # built; the cell is pointed at this copy through COURSE_REPO either way.
    source = base / "published"
    draft = ["--allow-colab-placeholder"] if is_placeholder(REPOSITORY) else []
    _run([sys.executable, "-m", "autograder", "release", *draft, str(source)], cwd=ROOT,
         env={**os.environ, "PYTHONPATH": str(ROOT)})
    git = ["git", "-c", "user.name=course", "-c", "user.email=course@localhost"]
    _run([*git, "init", "-q", "-b", "main"], cwd=source)
    _run([*git, "add", "-A"], cwd=source)
    _run([*git, "commit", "-q", "-m", "published course"], cwd=source)

    content = base / "content"
    content.mkdir()
    return {"python": python, "share": env_dir / "share" / "jupyter", "repo": f"file://{source}", "content": content,
            "release": source}


def _finished(release: Path, lesson: str) -> nbformat.NotebookNode:
    """The released learner notebook of ``lesson`` with every answer cell filled in from solutions/."""
    learner = nbformat.read(release / "course" / lesson / f"{lesson}.ipynb", as_version=4)
    solved = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    answers = {c.metadata.nbgrader["grade_id"]: c.source for c in solved.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in learner.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    learner.cells.append(nbformat.v4.new_code_cell(
        "import helpers, torch, json\n"
        "print('COLAB-CHECK ' + json.dumps({'helpers': helpers.__file__, 'cwd': os.getcwd(), 'torch': torch.__version__}))"
    ))
    return learner


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_learner_notebook_runs_on_colab_from_its_first_cell(colab, lesson, monkeypatch):
    """Does a finished learner notebook, opened on Colab, install the course in its first cell and run to the end?"""
    monkeypatch.setenv("JUPYTER_PATH", str(colab["share"]))
    monkeypatch.setenv("COURSE_REPO", colab["repo"])
    monkeypatch.delenv("COURSE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(colab["content"]))  # nothing of the test machine's user settings
    nb = _finished(colab["release"], lesson)
    assert nb.cells[1].id == "colab-setup", "the learner notebook does not start with the Colab set-up cell"
    client = NotebookClient(nb, timeout=240, kernel_name=KERNEL, allow_errors=False,
                            resources={"metadata": {"path": str(colab["content"])}})
    client.execute()

    home = colab["content"] / "distributed-course"
    assert f"Colab: the course is installed in {home}" in _text(nb.cells[1]), _text(nb.cells[1])
    assert (home / "MANIFEST.txt").is_file() and not (home / "solutions").exists(), "the clone is not the release"
    check = json.loads(_text(nb.cells[-1]).split("COLAB-CHECK ", 1)[1])
    assert check["helpers"].startswith(str(home)), check
    assert check["cwd"] == str(home / "course" / lesson), check
    assert check["torch"] == _run([str(colab["python"]), "-c", "import torch; print(torch.__version__)"]).strip(), (
        "pip replaced the torch Colab brings"
    )
    if lesson == "04-ring-all-reduce":
        passed = sum("Self-check passed" in _text(c) for c in nb.cells)
        assert passed >= 4, f"only {passed} self-checks passed in the Colab run"
    installed = _run([str(colab["python"]), "-m", "pip", "list", "--format=json"])
    names = {p["name"].lower() for p in json.loads(installed)}
    assert "distributed-course-helpers" in names and "nbgrader" not in names and "jupyterlab" not in names, (
        "the Colab cell should install the helpers and their runtime needs only"
    )
