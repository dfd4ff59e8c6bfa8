"""The learner's project files, written from the main ones: pyproject.toml, environment.yml,
Makefile, README.md and .gitignore."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .rules import ReleaseError

__all__ = ["load_toml", "learner_pyproject", "learner_environment", "learner_makefile", "README", "GITIGNORE"]


def load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ReleaseError("reading pyproject.toml needs Python 3.11 or newer (tomllib), or the package "
                               "`tomli` on Python 3.10: `pip install tomli`, then run the release again.") from None
    with open(path, "rb") as f:
        return tomllib.load(f)


def _toml_list(items: list[str]) -> str:
    return "[\n" + "".join(f"    {json.dumps(i)},\n" for i in items) + "]"


def learner_pyproject(main: dict) -> str:
    """The learner's pyproject.toml: the main one's dependencies, its ``course`` extra, both packages.

    ``course`` (JupyterLab, the notebook server and nbgrader) is what ``make lab`` installs;
    nbgrader is in it because the notebook toolbar's Validate button, which lesson 00 tells
    learners to press before handing in, is nbgrader's. The test and dev extras stay behind.
    """
    project = main["project"]
    try:
        extra = project["optional-dependencies"]["course"]
    except KeyError:
        raise ReleaseError("pyproject.toml has no [project.optional-dependencies] course = [...] list; the learner "
                           "release installs it for `make lab` (JupyterLab, nbgrader).") from None
    build = main["build-system"]
    return (
        "# The learner course's package: the helpers and the exercises' self-checks.\n"
        "# Written by `python -m autograder release` from the course's main pyproject.toml.\n"
        f"[build-system]\nrequires = {json.dumps(build['requires'])}\n"
        f"build-backend = {json.dumps(build['build-backend'])}\n\n"
        f"[project]\nname = {json.dumps(project['name'])}\nversion = {json.dumps(project['version'])}\n"
        f"description = {json.dumps(project['description'])}\nreadme = \"README.md\"\n"
        f"requires-python = {json.dumps(project['requires-python'])}\n"
        f"dependencies = {_toml_list(project['dependencies'])}\n\n"
        "[project.optional-dependencies]\n"
        "# What `make lab` installs: JupyterLab, and nbgrader for its Validate button.\n"
        f"course = {_toml_list(extra)}\n\n"
        '[tool.setuptools.packages.find]\nwhere = ["."]\ninclude = ["helpers*", "autograder*"]\n'
    )


def learner_environment(main: dict, env_name: str) -> str:
    """The learner's environment.yml: conda's Python and pip, then the same pip packages as pyproject."""
    project = main["project"]
    floor = project["requires-python"].replace(" ", "")
    pip = "".join(f"      - {p}\n" for p in [*project["dependencies"], *project["optional-dependencies"]["course"]])
    return (
        "# Conda route: run from this folder\n"
        f"#   conda env create -f environment.yml && conda activate {env_name} && jupyter lab --allow-root course/\n"
        "# The pip list is pyproject.toml's dependencies and its `course` extra; the last line installs\n"
        "# this folder's packages in editable mode. Written by `python -m autograder release`.\n"
        f"name: {env_name}\nchannels:\n  - conda-forge\ndependencies:\n  - python{floor}\n  - pip\n  - pip:\n"
        f"{pip}      - -e .\n"
    )


# The main Makefile's paragraphs the learner's one is made of, by how their first line starts.
_MAKE_PARAGRAPHS = ("PYTHON ", "VENV_PY :=", "venv:", "$(VENV_PY):", "$(STAMP):", "ALLOW_ROOT :=", "lab:",
                    "clean-venv:")
_MAKE_HEADER = """\
# The learner course. `make lab` opens it in JupyterLab, building the virtual environment
# in $(VENV) on first use; `make clean-venv` removes it. Overridable: PYTHON, VENV,
# TORCH_SPEC, LAB_ARGS, PIP_FLAGS (see README.md).
# Written by `python -m autograder release` from the course's main Makefile.
"""


def learner_makefile(main: str) -> str:
    """The learner's Makefile: the main Makefile's ``venv``, ``lab`` and ``clean-venv`` rules, copied.

    The paragraphs are taken as they are (the Python check, the torch install, the root
    handling of ``lab``), so the two cannot drift apart; the venv installs the ``course``
    extra instead of ``dev``.
    """
    paragraphs = re.split(r"\n[ \t]*\n", main)
    chosen = []
    for head in _MAKE_PARAGRAPHS:
        found = [p for p in paragraphs
                 if next((line for line in p.splitlines() if not line.startswith("#")), "").startswith(head)]
        if len(found) != 1:
            raise ReleaseError(f"the main Makefile has {len(found)} paragraphs starting with {head!r} (expected "
                               "one); autograder/release/project.py copies the learner's rules from it. Update "
                               "_MAKE_PARAGRAPHS there.")
        chosen.append(found[0].strip("\n"))
    lines = [line for line in chosen[0].splitlines() if not line.startswith("PYTEST_ARGS")]
    chosen[0] = "\n".join(lines)
    stamp = chosen[4]
    if stamp.count("'.[dev]'") != 1:
        raise ReleaseError("the main Makefile's $(STAMP) rule should install -e '.[dev]' once; the learner's installs "
                           "'.[course]' in its place. Update learner_makefile in autograder/release/project.py.")
    body = [line for line in stamp.replace("'.[dev]'", "'.[course]'").splitlines() if not line.startswith("#")]
    chosen[4] = "# Install torch (unless the venv has one) and this course with its `course` extra.\n" + "\n".join(body)
    chosen.insert(2, ".PHONY: venv lab clean-venv")
    return _MAKE_HEADER + "\n" + "\n\n".join(chosen) + "\n"


README = """\
# Distributed training with PyTorch, in notebooks

This course teaches `torch.distributed` by running it. Each lesson is a Jupyter notebook in
`course/`: you start several processes (ranks) from a cell, watch what they send each other,
and build the pieces yourself, from a ring all-reduce to a small DistributedDataParallel,
before launching jobs with `torchrun`. An ordinary CPU is enough; with GPUs the same cells
use NCCL.

## Getting started

Choose one of three ways.

**On your own Linux machine** (Python {python}, `make` and `git`):

```bash
git clone <the address your instructor gave you> distributed-course
cd distributed-course
make lab
```

The first `make lab` builds a virtual environment in `.venv/` (a few minutes: it installs
PyTorch), then opens JupyterLab; later runs start at once. To choose the PyTorch build, say
one for your CUDA version, give its pip arguments the first time, for example
`make lab TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"`.
`make clean-venv` deletes the environment so you can start again. Running as root (in a
container, say) is fine: `make lab` then tells JupyterLab it may.

**With conda**, from this folder:

```bash
conda env create -f environment.yml
conda activate {env_name}
jupyter lab --allow-root course/   # --allow-root: also as root (a container, say)
```

**On Google Colab**: open a lesson with the *Open in Colab* badge at its top and run its
first code cell before anything else. It downloads this course into the Colab runtime and
installs it; on your own machine that cell does nothing.

## Working through the lessons

Go in order, from `00-getting-started`. An exercise is a cell that starts with a comment
like `# Exercise 4.4: ...`; write your code in place of its `raise NotImplementedError`.
The cell after it runs a self-check on fresh ranks and prints `Self-check passed` or what
went wrong. More tests, hidden from you, run when your instructor grades your notebook.

## Handing in

1. Run *Kernel > Restart Kernel and Run All Cells* and check that every self-check passes.
2. In JupyterLab, press **Validate** in the notebook's toolbar: it runs the notebook afresh
   and lists anything that fails.
3. Hand in the notebook file, `course/<lesson>/<lesson>.ipynb`, the way your instructor
   asks. On Colab, use *File > Download > Download .ipynb*.

## What is in this folder

- `course/`: the lessons.
- `helpers/`: the package the notebooks use to start ranks, trace them and show the results.
- `autograder/`: the exercises' self-checks.
- `MANIFEST.txt`: every file of the course.
"""

GITIGNORE = """\
.venv/
__pycache__/
*.py[cod]
*.egg-info/
.ipynb_checkpoints/
"""
