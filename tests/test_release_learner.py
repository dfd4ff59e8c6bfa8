"""The learner's side of the release: the README's ways in, `make lab`, `make check`, `make handin`, Validate.

Everything runs in the learner distribution as ``python -m autograder release`` builds it (the
``release`` fixture of tests/test_release.py), or in a copy, through the release's own Makefile
and README. Two stand-ins keep it light, and neither changes what is tested:

- ``course_venv``: a folder that `make VENV=...` takes for a finished virtual environment, whose
  ``python`` is this checkout's with its editable install switched off, so the course comes
  from the folder make runs in (the release) and nothing else; `make lab` and `make check`
  then run there without installing torch and JupyterLab again (tests/test_colab.py does
  install the release with pip).
- ``bare_python``: a Python with nothing installed, no torch: what `make handin` must make do with.

A learner of lesson 00 hands in with `make handin` and is graded by `python -m autograder grade`
together with the other grading tests' learners (``LESSONS`` and :func:`hand_in`, read by
tests/conftest.py's ``graded_class``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers._runtime.spec import free_port
from devtools.scratch import layout, scores, solution_source, submission
from test_release import DRAFT, ISOLATE, ROOT, release  # noqa: F401 - release: the module's fixture

LESSON = "00-getting-started"
LESSONS = [LESSON]  # handed in for tests/conftest.py's graded_class, by hand_in() below
STUDENT = "handin-learner"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _make(folder: Path, *args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    # --no-print-directory: under `make test` (MAKELEVEL set) make would add "Entering directory" lines.
    return subprocess.run(["make", "--no-print-directory", *args], cwd=folder, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)


def _copy(release: Path, to: Path) -> Path:
    shutil.copytree(release, to, symlinks=True)
    return to


def _answer(folder: Path, lesson: str, grade_id: str, source: str) -> Path:
    """Write ``source`` into answer cell ``grade_id`` of ``folder``'s notebook of ``lesson``, as a learner saves it."""
    notebook = folder / "course" / lesson / f"{lesson}.ipynb"
    return submission(notebook, notebook, {grade_id: source})


def _bare_python(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    assert subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0, "torch is there"
    return python


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    return _bare_python(tmp_path_factory.mktemp("bare") / "python")


@pytest.fixture(scope="module")
def course_venv(tmp_path_factory) -> Path:
    """What `make VENV=...` takes for a finished venv (see the module docstring); its stamp is renewed per use."""
    venv = tmp_path_factory.mktemp("learner") / "venv"
    (venv / "bin").mkdir(parents=True)
    launcher = venv / "launch.py"
    launcher.write_text(ISOLATE + "import os, runpy\nsys.path.insert(0, os.getcwd())\n"
                        "if sys.argv[1:2] != ['-m']:\n    raise SystemExit(f'launch.py runs modules only: {sys.argv}')\n"
                        "sys.argv = sys.argv[2:]\nrunpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="$(pwd)" exec {shlex.quote(sys.executable)} {shlex.quote(str(launcher))} "$@"\n')
    python.chmod(0o755)
    (venv / "bin" / "jupyter").symlink_to(Path(sys.executable).parent / "jupyter")
    return venv


def _venv(venv: Path) -> str:
    """``VENV=...`` for make, with the stamp newer than any pyproject.toml made so far (nothing to install)."""
    (venv / ".installed").touch()
    return f"VENV={venv}"


# -- the Makefile and Validate -------------------------------------------------------------------


def test_learner_makefile_builds_the_venv_and_starts_the_lab(release):
    """Does the learner Makefile's `lab` install the `course` extra and start JupyterLab on course/,
    with --allow-root exactly when run as root; does `check` run the self-check command in the venv,
    and `handin` the hand-in command with plain Python, no venv? (make -n: printed, not run.)"""
    done = _make(release, "-n", "lab")
    assert done.returncode == 0, done.stderr
    assert "-m pip install -q -e '.[course]'" in done.stdout, done.stdout
    lab = [line for line in done.stdout.splitlines() if "jupyter lab course/" in line]
    assert len(lab) == 1, done.stdout
    assert ("--allow-root" in lab[0]) == (os.geteuid() == 0), lab[0]
    assert _make(release, "-n", "clean-venv").stdout.strip() == "rm -rf .venv"
    check = _make(release, "-n", "check", "LESSON=05").stdout.splitlines()
    assert ".venv/bin/python -m autograder.learner.selfcheck 05" in check, check
    handin = _make(release, "-n", "handin", "STUDENT=ada").stdout.strip()
    assert handin == "python3 -m autograder.learner.handin --out handin", handin
    assert "handin/" in (release / ".gitignore").read_text().splitlines()


def test_validate_allows_each_cell_as_long_as_grading_does(release, tmp_path):
    """Does the Validate button, run from the release (its server's folder, as `make lab` starts it),
    give nbgrader's Execute the same per-cell limits as grading reads from nbgrader_config.py, which
    differ from nbgrader's defaults (30 s a cell), and the hook that makes a failed self-check fail Validate?"""
    from nbgrader.preprocessors import Execute
    from traitlets.config.loader import PyFileConfigLoader

    names = ("timeout", "interrupt_on_timeout", "raise_on_iopub_timeout")
    probe = (
        "import json\n"
        "from nbgrader.server_extensions.validate_assignment.handlers import ValidateAssignmentHandler\n"
        "from nbgrader.validator import Validator\n"
        "from nbgrader.preprocessors import Execute\n"
        "config = ValidateAssignmentHandler.load_config(None)  # the button's own reading of the settings\n"
        "execute = Execute(parent=Validator(config=config))\n"
        f"print(json.dumps({{n: getattr(execute, n) for n in {names!r}}}))\n"
        "hook = execute.on_cell_error\n"
        "print(json.dumps(hook and f'{hook.__module__}.{hook.__name__}'))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=release, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path), "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    validate = json.loads(done.stdout.strip().splitlines()[-2])
    # ... and makes a failed self-check fail Validate (tests/test_hub.py sees it in the browser).
    assert json.loads(done.stdout.strip().splitlines()[-1]) == "autograder.learner.validate.self_checks_count"
    grading = Execute(config=PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config())
    assert validate == {n: getattr(grading, n) for n in names}
    assert validate != {n: getattr(Execute(), n) for n in names}, "grading uses nbgrader's defaults: test nothing"
    assert f"It allows each cell {validate['timeout']} s, as grading does" in (release / "README.md").read_text()


# -- the README's ways in ---------------------------------------------------------------------------


def _route(readme: str, heading: str) -> list[str]:
    """The commands of the README's code block after ``**heading**``."""
    block = re.search(rf"\*\*{re.escape(heading)}\*\*.*?```bash\n(.*?)```", readme, re.S)
    assert block, f"the README has no code block under **{heading}**"
    return block[1].strip().splitlines()


def _serves_the_course(folder: Path, venv: Path, home: Path) -> list[str]:
    """Run `make lab` in ``folder`` until JupyterLab answers; stop it; return the entries of its root folder."""
    port, token = free_port(), "learner-test"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / "config")}
    log = home / "lab.log"
    with open(log, "w") as out:
        lab = subprocess.Popen(["make", "--no-print-directory", "lab", _venv(venv),
                                f"LAB_ARGS=--no-browser --port={port} --IdentityProvider.token={token}"],
                               cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    names = None
    try:
        deadline = time.monotonic() + 300  # a guard against a hang, not a measure: JupyterLab starts in seconds
        while names is None and lab.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=10) as reply:
                    names = [entry["name"] for entry in json.load(reply)["content"]]
            except OSError:
                time.sleep(0.5)
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, signal.SIGTERM)  # the process group this test started: make and JupyterLab
            try:
                lab.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(lab.pid, signal.SIGKILL)
                lab.wait()
    said = log.read_text()
    assert names is not None, f"`make lab` in {folder} did not serve the course:\n{said[-3000:]}"
    assert ("Running as root: starting JupyterLab with --allow-root." in said) == (os.geteuid() == 0), said[-3000:]
    return names


@pytest.mark.slow
def test_the_readmes_git_and_archive_routes_open_the_course(release, course_venv, tmp_path):
    """Do the README's three commands work as written, `git clone` (from the release committed as an
    instructor publishes it) and `tar -xzf` of the archive built beside it, each with `cd` and
    `make lab` serving the lessons, also as root?"""
    readme = (release / "README.md").read_text()
    published = _copy(release, tmp_path / "published")
    git = ["git", "-c", "user.name=course", "-c", "user.email=course@localhost"]
    for step in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "published"]):
        subprocess.run([*git, *step], cwd=published, check=True)
    shutil.copy2(release.parent / f"{release.name}.tar.gz", tmp_path)
    lessons = sorted(p.name for p in (release / "course").iterdir() if p.is_dir())
    for heading in ("With git", "From the archive"):
        commands = _route(readme, heading)
        assert commands[-1] == "make lab" and len(commands) == 3 and commands[1].startswith("cd "), commands
        script = "\n".join(commands[:-1]).replace("<the address your instructor gave you>", f"file://{published}")
        done = subprocess.run(["bash", "-euc", script + "\npwd"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"{script}\n{done.stderr}"
        folder = Path(done.stdout.strip().splitlines()[-1])
        assert (folder / "MANIFEST.txt").read_text() == (release / "MANIFEST.txt").read_text()
        names = _serves_the_course(folder, course_venv, tmp_path / f"home-{heading.split()[-1]}")
        assert set(lessons) <= set(names), names


# -- make check -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_make_check_reports_unfinished_exercises_as_not_done_yet(release, course_venv):
    """On the notebooks as released (every answer still a stub), does `make check` go through every
    lesson, call each exercise not done yet, crash nowhere, and exit non-zero?"""
    done = _make(release, "check", _venv(course_venv), timeout=900)
    lessons = sorted(p.name[:2] for p in (release / "course").iterdir() if p.is_dir() and p.name[:2].isdigit())
    assert done.returncode != 0, done.stdout[-3000:]
    for number in lessons:
        summary = rf"^Lesson {number}: \d+ self-checks?: 0 passed, 0 failed, \d+ not done yet\.$"
        assert re.search(summary, done.stdout, re.M), f"lesson {number}:\n{done.stdout[-3000:]}"
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"All lessons: 0 passed, 0 failed, \d+ not done yet\.", last), last
    assert int(last.split(", ")[2].split()[0]) >= len(lessons)
    assert "Traceback" not in done.stdout + done.stderr and "GradingFailure" not in done.stdout, done.stderr[-3000:]


def _notebook_error(folder: Path, lesson: str) -> list[str]:
    """The lines the notebook shows for its first failing self-check, run top to bottom in a kernel from ``folder``."""
    notebook = folder / "course" / lesson / f"{lesson}.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(ISOLATE))
    client = NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(notebook.parent)}})
    client.execute(env={**os.environ, "PYTHONPATH": str(folder)})
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error" and o.ename == "GradingFailure"]
    assert errors, "no self-check of the notebook failed"
    return [ANSI.sub("", line) for line in "\n".join(errors[0]["traceback"]).splitlines()]


@pytest.mark.slow
def test_make_check_shows_what_the_notebook_shows(release, course_venv, tmp_path):
    """With a wrong answer to Exercise 0.1, does `make check LESSON=00` print the lines the notebook
    shows for its self-check and exit non-zero; with the right one, pass, exit 0, and list the
    statement of the answer cell that grading leaves out?"""
    folder = _copy(release, tmp_path / "course")
    _answer(folder, LESSON, "ex0_1-hello", 'def hello(rank, world_size):\n    return f"rank {rank} of {world_size + 1}"')
    shown = _notebook_error(folder, LESSON)
    assert shown[0].startswith('GradingFailure: Exercise 0.1, part "self-check": '), shown
    done = _make(folder, "check", "LESSON=00", _venv(course_venv))
    assert done.returncode != 0 and "Lesson 00: 1 self-check: 0 passed, 1 failed, 0 not done yet." in done.stdout
    assert all(line in done.stdout.splitlines() for line in shown), f"{shown}\n---\n{done.stdout}"
    _answer(folder, LESSON, "ex0_1-hello", solution_source(LESSON, "ex0_1-hello") + "\nprint(hello(0, 1))\n")
    done = _make(folder, "check", "LESSON=0", _venv(course_venv))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "\nSelf-check passed: on 3 ranks, hello returned 'rank 0 of 3'" in done.stdout, done.stdout
    assert 'your cell "Exercise 0.1: say hello", line ' in done.stdout and ": print(hello(0, 1))" in done.stdout


@pytest.mark.slow
def test_make_check_lesson_05_runs_what_is_done_and_skips_what_is_not(release, course_venv, tmp_path):
    """With Exercise 5.1 answered and 5.2 still the stub, does `make check LESSON=05` pass 5.1's self-check,
    call 5.2 not done yet (without running it) and exit non-zero?"""
    folder = _copy(release, tmp_path / "course")
    _answer(folder, "05-data-parallel-sgd", "ex5_1-average-gradients",
            solution_source("05-data-parallel-sgd", "ex5_1-average-gradients"))
    done = _make(folder, "check", "LESSON=05", _venv(course_venv))
    assert done.returncode != 0, done.stdout[-3000:]
    first, second = done.stdout.split("\nExercise 5.2: ")
    assert "\nSelf-check passed: " in first.split("\nExercise 5.1: ")[1], done.stdout
    assert "not done yet: `train` still raises the exercise's NotImplementedError" in second, done.stdout
    assert "Lesson 05: 2 self-checks: 1 passed, 0 failed, 1 not done yet." in done.stdout


# -- make handin ----------------------------------------------------------------------------------------


def test_handin_reads_changes_with_nbgraders_checksum(release):
    """Does the hand-in's own checksum (standard library only) equal nbgrader's for every answer cell, as
    released and once changed, so "changed since released" means what nbgrader means?"""
    from nbgrader.utils import compute_checksum

    from autograder.learner.handin import _checksum

    cells = [c for p in sorted((release / "course").glob("*/*.ipynb")) for c in nbformat.read(p, as_version=4).cells
             if c.metadata.get("nbgrader", {}).get("solution")]
    assert len(cells) >= 10
    for cell in cells:
        assert _checksum(cell) == compute_checksum(cell) == cell.metadata.nbgrader.checksum
        cell.source += "\n# changed"
        assert _checksum(cell) == compute_checksum(cell) != cell.metadata.nbgrader.checksum


def test_handin_asks_for_a_usable_name(release, bare_python, tmp_path):
    """Without a name and no terminal to ask in, and with a name that cannot be a folder, does `make handin`
    stop, say what to type, and write nothing?"""
    folder = _copy(release, tmp_path / "course")
    done = _make(folder, "handin", f"PYTHON={bare_python}", env={k: v for k, v in os.environ.items() if k != "STUDENT"})
    assert done.returncode != 0 and "run `make handin STUDENT=your-name`" in done.stderr, done.stderr
    done = _make(folder, "handin", f"PYTHON={bare_python}", "STUDENT=Zoë O'Brien")
    assert done.returncode != 0 and "for example STUDENT=zoe-o-brien." in done.stderr, done.stderr
    assert not (folder / "handin").exists()


def hand_in(root: Path, submissions: Path) -> None:
    """For tests/conftest.py's graded_class: a learner answers lesson 00 in a release, runs `make handin` with a
    Python that has no torch, and the instructor unpacks the archive into ``submissions`` as the README says."""
    work = Path(tempfile.mkdtemp(prefix="handin-", dir=submissions.parent))
    from autograder.release import build

    folder = build(work / "learner-course", allow_colab_placeholder=bool(DRAFT))
    subprocess.run(["git", "init", "-q"], cwd=folder, check=True)  # a learner's clone: the archive stays out of git
    _answer(folder, LESSON, "ex0_1-hello", solution_source(LESSON, "ex0_1-hello"))
    python = f"PYTHON={_bare_python(work / 'bare')}"
    done = _make(folder, "handin", python, f"STUDENT={STUDENT}", "LESSON=02")
    assert done.returncode == 0 and "Note: no answer cell of 02-point-to-point has changed" in done.stdout, done
    done = _make(folder, "handin", python, f"STUDENT={STUDENT}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Wrote handin/{STUDENT}.zip: 1 notebook of {STUDENT}: {LESSON}." in done.stdout, done.stdout
    archive = folder / "handin" / f"{STUDENT}.zip"
    with zipfile.ZipFile(archive) as zf:
        assert zf.namelist() == [f"{STUDENT}/{LESSON}/{LESSON}.ipynb"]
        assert zf.read(zf.namelist()[0]) == (folder / "course" / LESSON / f"{LESSON}.ipynb").read_bytes()
    ignored = subprocess.run(["git", "check-ignore", "-q", str(archive)], cwd=folder)
    assert ignored.returncode == 0, "the hand-in archive is not git-ignored in the learner's clone"
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(archive), f"{submissions}/"], check=True)


@pytest.mark.slow
def test_a_handed_in_archive_is_graded_as_it_unpacks(graded_class):
    """Did the notebook `make handin` packed, unpacked into the class's submissions folder, get full marks
    from `python -m autograder grade`?"""
    root, _ = graded_class
    cells, points = layout(LESSON)
    assert scores(root, LESSON, cells, STUDENT) == points


# -- the modules' examples ------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["autograder.learner.selfcheck", "autograder.learner.handin",
                                    "autograder.release.readme", "autograder.release.project"])
def test_docstring_examples_run(module):
    """Do the runnable examples in the learner commands' and the release's docstrings give what they show?"""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module} shows no runnable example"
    assert result.failed == 0, f"{result.failed} docstring examples of {module} failed"
