"""The clean re-grade's reading of a notebook: does it keep every answer and nothing that runs?

``autograder.grading.clean`` decides every graded part from the learner's definitions alone. These
tests check what it keeps of a notebook's code (imports, functions, classes, constants),
what it leaves out (anything that could run the learner's code while it is defined, above
all lines that patch the course's grading), and that every solution notebook still defines
each exercise's function that way. They parse and define code only; no ranks start.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

import autograder.kit.exercise
from autograder.learner.definitions import define, exercise_code, exercise_code_from_cells
from autograder.kit.registry import exercises
from devtools.scratch import GRADER_PATCH, RING_ANSWERS
from autograder.hidden import grade

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "solutions").glob("*/*.ipynb"))


def _kept_source(cells: list[str]) -> tuple[str, list[str]]:
    import ast

    code, left_out = exercise_code_from_cells(cells)
    return "\n".join(ast.unparse(node) for cell in code for node in cell.nodes), left_out


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.parent.name)
def test_every_exercise_function_is_defined_from_the_solution_notebook(notebook):
    """Does the clean reading of each instructor notebook define every exercise's function, leaving nothing of its answers out?"""
    code, left_out = exercise_code(notebook)
    namespace, skipped = define(code)
    assert left_out == [] and skipped == [], left_out + skipped
    lesson = int(notebook.name[:2])
    for ex in exercises(lesson):
        assert callable(namespace.get(ex.function)), f"{notebook.name}: {ex.function} is not defined"
        assert namespace[ex.function].__module__ == "__main__"  # so the ranks receive it by value


def test_the_grader_patch_is_left_out_and_named():
    """Are the lines that replace the course's grading left out, named in what was left out, and is the grading untouched?"""
    grade = autograder.kit.exercise.Exercise.grade
    answer = RING_ANSWERS["built_in"] + GRADER_PATCH
    kept, left_out = _kept_source(["import torch.distributed as dist", answer])
    assert "def ring_allreduce" in kept and "import autograder.kit.exercise" in kept
    assert "Exercise.grade" not in kept
    assert any("autograder.kit.exercise.Exercise.grade = lambda" in line for line in left_out), left_out
    code, _ = exercise_code_from_cells(["import torch.distributed as dist", answer])
    namespace, _ = define(code)
    assert autograder.kit.exercise.Exercise.grade is grade
    assert callable(namespace["ring_allreduce"])


@pytest.mark.parametrize("cell, why", [
    ("def f(x=print('ran')):\n    pass", "calls or computes"),
    ("def f(x=(lambda: 0, open('/etc/hostname'))):\n    pass", "calls or computes"),
    ("def f(x: print('ran')):\n    pass", "calls or computes"),
    ("def mine(f):\n    return f\n@mine\ndef f():\n    pass", "decorator `mine`"),
    ("staticmethod = print\nclass A:\n    @staticmethod\n    def f():\n        pass", "decorator `staticmethod`"),
    ("class A:\n    def __init_subclass__(cls):\n        pass", "__init_subclass__"),
    ("class A:\n    __class_getitem__ = print", "class-making hook"),
    ("class A(metaclass=type):\n    pass", "metaclass"),
    ("class A:\n    x = print('ran')", "calls or computes"),
    ("import os\nos.environ['X'] = '1'", ""),
    ("import autograder.kit.harness\nsetattr(autograder.kit.harness, 'run_ranks', None)", ""),
    ("for i in range(3):\n    pass", ""),
    ("X = [print(i) for i in range(3)]", "calls or computes"),
])
def test_code_that_would_run_while_defined_is_left_out(cell, why):
    """Is each kind of statement that could run the learner's code at definition time left out, with the reason?"""
    kept, left_out = _kept_source([cell])
    assert "print(" not in kept and "setattr" not in kept and "environ" not in kept, kept
    assert left_out and why in left_out[-1], left_out


def test_definitions_and_constants_are_kept():
    """Are imports, functions with safe decorators and defaults, classes and constants all kept?"""
    cell = (
        "import torch\nimport torch.distributed as dist\nfrom functools import lru_cache\n"
        "CHUNK = 4\nSIZES = (1, 2.5, 'x', None)\nDTYPE = torch.float32\n"
        "@torch.no_grad()\ndef f(rank, world_size, t: torch.Tensor = None, op=dist.ReduceOp.SUM) -> int:\n    return rank\n"
        "@lru_cache(maxsize=None)\ndef g():\n    return CHUNK\n"
        "class Repaired:\n    '''doc'''\n    limit = 3\n    @staticmethod\n    def pass_right(rank, world_size, x):\n        return x\n"
        "h = lambda rank, world_size, k=2: rank * k\n"
    )
    code, left_out = exercise_code_from_cells([cell])
    assert left_out == []
    namespace, skipped = define(code)
    assert skipped == []
    assert namespace["g"]() == 4 and namespace["h"](3, 4) == 6 and namespace["Repaired"].pass_right(0, 1, 7) == 7
    assert "return rank" in inspect.getsource(namespace["f"])  # lesson 07's checks read the source


def test_a_constant_from_a_dropped_result_is_skipped_not_fatal():
    """Is a name bound to a result the clean run left out skipped, named, while the rest is still defined?"""
    nb = {"cells": [
        {"cell_type": "code", "metadata": {}, "source": "result = launch(f, 2)"},
        {"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "grade_id": "ex"}},
         "source": "# Exercise 9.1: demo\nlast = result\ndef answer(rank, world_size):\n    return 42"},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = Path(__import__("tempfile").mkdtemp()) / "09-demo.ipynb"
    path.write_text(json.dumps(nb))
    code, left_out = exercise_code(path)
    namespace, skipped = define(code)
    assert namespace["answer"](0, 1) == 42
    assert left_out == []  # the launch is in an instructor's cell: not reported to the learner
    assert skipped and 'your cell "Exercise 9.1: demo", line 2: skipped (NameError' in skipped[0], skipped


def test_a_rank_cannot_run_code_in_the_grading_process(tmp_path):
    """In the clean re-grade's process, does an object a rank returns that would run code when loaded fail the part instead of running?"""
    import subprocess
    import sys

    marker = tmp_path / "ran"
    code = f"""
import os
from helpers._runtime import wire as _wire
from autograder.hidden import grade
from autograder.kit.harness import GradingFailure
_wire.restrict()

class Sneaky:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))

def hello(rank, world_size):
    return Sneaky()

try:
    grade("0.1", hello, "hello")
except GradingFailure as failure:
    print("FAILED:", failure)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "FAILED: hello: a rank" in done.stdout and "does not load" in done.stdout, done.stdout + done.stderr
    assert not marker.exists()
