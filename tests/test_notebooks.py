"""The lesson notebooks: do they run, and is the learner version what it should be?"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted(p.name for p in (ROOT / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_there_are_lessons():
    """Is there at least one lesson, so the checks below check something?"""
    assert LESSONS, "solutions/ holds no lesson notebooks"


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_notebook_runs_top_to_bottom(lesson, tmp_path):
    """Does the instructor notebook, solutions included, run without an error on this machine?"""
    path = ROOT / "solutions" / lesson / f"{lesson}.ipynb"
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        allow_errors=False,
    )
    started = time.monotonic()
    client.execute()
    elapsed = time.monotonic() - started
    print(f"{lesson}: ran in {elapsed:.1f} s")
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            assert output.get("name") != "stderr" or not output.get("text", "").strip() or "Warning" in output.get("text", ""), (
                f"{lesson}: a cell wrote to stderr: {output.get('text', '')[:300]}"
            )


@pytest.mark.parametrize("lesson", LESSONS)
def test_learner_notebook_has_no_solutions_or_hidden_tests(lesson):
    """Does course/ hold the learner version: no solution, no hidden test, stubs that name the exercise?"""
    path = ROOT / "course" / lesson / f"{lesson}.ipynb"
    assert path.is_file(), f"{path} is missing: run `make course`"
    nb = json.loads(path.read_text())
    text = "\n".join(_source(c) for c in nb["cells"])
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text, f"{lesson}: the learner notebook still contains {marker!r}"
    solution_cells = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    for cell in solution_cells:
        if cell["cell_type"] == "code":
            src = _source(cell)
            assert re.search(r'raise NotImplementedError\("Exercise [\w.]+: ', src), (
                f"{lesson}: an exercise stub does not name its exercise:\n{src}"
            )


def test_course_is_in_sync_with_solutions():
    """Is every course/ notebook exactly what `make course` builds from solutions/ now?"""
    from autograder.course import stale_lessons

    assert stale_lessons() == [], "course/ is out of date: run `make course` and commit course/"
