"""Which cells a graded run leaves out (autograder/grading/unused.py): only those that give the graded cells nothing.

`make grade` runs a learner's notebook in a kernel for the feedback page only; every part is
decided in a fresh process. A cell is left out when no kept cell after it reads a name it binds.
These tests read notebooks built here, without a kernel; the graded class (tests/test_grading_e2e.py)
checks that every lesson's notebooks still run without an error once their cells are left out.
"""

from __future__ import annotations

import nbformat
import pytest

from autograder.grading.unused import cells_to_leave_out

ANSWER = {"solution": True, "grade": False, "locked": False, "grade_id": "ex1", "schema_version": 3}
TEST = {"solution": False, "grade": True, "locked": True, "grade_id": "test-ex1", "points": 1, "schema_version": 3}


def notebook(*cells: str | tuple[str, dict]) -> nbformat.NotebookNode:
    """Code cells; a (source, nbgrader metadata) pair is a marked cell."""
    made = []
    for cell in cells:
        source, meta = cell if isinstance(cell, tuple) else (cell, None)
        made.append(nbformat.v4.new_code_cell(source))
        if meta:
            made[-1].metadata["nbgrader"] = meta
    return nbformat.v4.new_notebook(cells=made)


def test_a_demonstration_is_left_out_and_what_the_answer_reads_is_kept():
    """Are a launch and a plot left out, and the imports, a constant and a helper the answer reads kept, the
    answer and its test cell always?"""
    nb = notebook(
        "import torch\nimport matplotlib.pyplot as plt\nfrom helpers import run",  # 0: the answer reads torch
        "result = run(print, world_size=4)\nresult.trace.plot_timeline()",      # 1: a demonstration
        "fig, ax = plt.subplots()\nax.plot([1, 2])\nplt.show()",                # 2: a picture
        "SIZE = 8\ndef ones():\n    return torch.ones(SIZE)",                   # 3: read by the answer
        ("def answer(x):\n    rank = 0\n    return ones() * x + rank", ANSWER),  # 4
        "answer(2)",                                                             # 5: tries the answer
        ("grade('1', answer, 'correct')", TEST),                                 # 6
    )
    assert cells_to_leave_out(nb) == {1, 2, 5}


def test_a_name_local_to_the_answer_does_not_keep_a_cell_that_binds_it_globally():
    """Does `rank` inside the answer (its own local) leave a loop over `rank` out, while a global it reads keeps
    the cell that sets it?"""
    nb = notebook(
        "for rank in range(4):\n    print(rank)",
        "LR = 0.1",
        ("def answer(rank):\n    world = 4\n    return rank * LR / world", ANSWER),
    )
    assert cells_to_leave_out(nb) == {0}


@pytest.mark.parametrize("change", [
    "sys.path.insert(0, '/somewhere')",
    "model.weight.data[0] = 1.0",
    "model.eval()",
    "settings['timeout'] = 5",
])
def test_a_change_made_through_a_name_the_answer_reads_keeps_the_cell(change):
    """Is a cell that changes an object the answer uses (through a method, an attribute or an item) kept?"""
    nb = notebook("import sys\nmodel = object()\nsettings = {}", change,
                  ("def answer():\n    return sys.path, model, settings", ANSWER))
    assert cells_to_leave_out(nb) == set()


def test_a_magic_is_read_as_ipython_runs_it():
    """Is a %%distributed cell left out unless a kept cell reads the trace it leaves (dist_trace), and a
    %matplotlib line with imports kept when the answer reads them?"""
    distributed = "%%distributed 4\nimport torch.distributed as dist\nprint(dist.get_rank())"
    nb = notebook("%matplotlib inline\nimport torch", distributed, ("def answer():\n    return torch.zeros(1)", ANSWER))
    assert cells_to_leave_out(nb) == {1}
    nb = notebook("%matplotlib inline\nimport torch", distributed,
                  ("def answer():\n    return dist_trace, torch", ANSWER))
    assert cells_to_leave_out(nb) == set()


@pytest.mark.parametrize("unknown", ["from math import *", "this is not Python ("])
def test_a_cell_whose_names_cannot_be_known_keeps_every_cell_before_it(unknown):
    """Does a star import or a cell that is not Python keep itself and everything above it (what it needs is
    unknown), while a demonstration below it is still left out?"""
    nb = notebook("x = 1", "print('a demonstration')", unknown, "print('another')",
                  ("def answer():\n    return 1", ANSWER))
    assert cells_to_leave_out(nb) == {3}


def test_markdown_and_empty_cells_are_never_counted():
    nb = notebook("", ("def answer():\n    return 1", ANSWER))
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# A heading"))
    assert cells_to_leave_out(nb) == set()
