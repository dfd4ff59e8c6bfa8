"""The learner's project files, written from the main ones: pyproject.toml, environment.yml,
Makefile, nbgrader_config.py and .gitignore (README.md: :mod:`autograder.release.readme`)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from ..paths import ROOT
from .rules import ReleaseError

__all__ = ["load_toml", "learner_pyproject", "learner_environment", "learner_makefile", "grading_limits",
           "learner_nbgrader_config", "GITIGNORE", "HANDIN_FOLDER"]


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


#: The sections of nbgrader's settings that change what Validate reports: how it runs a notebook.
VALIDATE_SECTIONS = ("Validator", "Execute")


def grading_limits(root: Path) -> dict[str, dict[str, Any]]:
    """The settings of :data:`VALIDATE_SECTIONS` in ``root/nbgrader_config.py``, read as grading reads them.

    >>> grading_limits(ROOT)["Execute"]["timeout"]
    90
    """
    from traitlets.config.loader import ConfigFileNotFound, PyFileConfigLoader

    try:
        config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    except ConfigFileNotFound:
        raise ReleaseError(f"{root / 'nbgrader_config.py'} is missing; the release copies its per-cell limits "
                           "(Execute.timeout and the like) so that Validate says what grading will say.") from None
    limits = {section: dict(config[section]) for section in VALIDATE_SECTIONS if config[section]}
    for section, values in limits.items():
        for name, value in values.items():
            try:
                ok = ast.literal_eval(repr(value)) == value
            except (ValueError, SyntaxError):
                ok = False
            if not ok:
                raise ReleaseError(f"nbgrader_config.py sets {section}.{name} = {value!r}, which the learner's "
                                   "nbgrader_config.py cannot write as a plain value; set it to a number, string, "
                                   "bool, list or dict.")
    return limits


def learner_nbgrader_config(limits: dict[str, dict[str, Any]]) -> str:
    """The learner's nbgrader_config.py: only ``limits`` (see :func:`grading_limits`), nothing of the instructor's."""
    lines = [f"c.{section}.{name} = {value!r}" for section, values in limits.items()
             for name, value in sorted(values.items())]
    return (
        '"""nbgrader settings for this course\'s Validate button: the same limits as grading.\n\n'
        "Validate (the button in a notebook's toolbar, or `nbgrader validate NOTEBOOK`) reads this\n"
        "file from the folder JupyterLab was started in: this one, with `make lab`. Written by\n"
        "`python -m autograder release` from the instructor's nbgrader_config.py, so Validate lets\n"
        "each cell run as long as grading does, and a self-check that fails makes Validate fail\n"
        "(autograder/learner/validate.py).\n"
        '"""\n\n'
        "c = get_config()  # noqa: F821 - provided by nbgrader's config loader\n\n"
        + "".join(f"{line}\n" for line in lines)
        + "\ntry:\n    from autograder.learner.validate import self_checks_count\n"
        "except ImportError:  # the course's packages are not importable here: Validate runs without the self-checks\n"
        "    pass\nelse:\n    c.Execute.on_cell_error = self_checks_count\n"
    )


#: Where ``make handin`` writes the learner's archive (kept out of their git).
HANDIN_FOLDER = "handin"
# The main Makefile's paragraphs the learner's one is made of, by how their first line starts.
_MAKE_PARAGRAPHS = ("PYTHON ", "VENV_PY :=", "venv:", "$(VENV_PY):", "$(STAMP):", "ALLOW_ROOT :=", "lab:",
                    "clean-venv:")
_MAKE_HEADER = """\
# The learner course. `make lab` opens it in JupyterLab, building the virtual environment
# in $(VENV) on first use; `make clean-venv` removes it; `make check LESSON=05` runs a
# lesson's self-checks from the command line; `make handin STUDENT=your-name` packs your
# notebooks for your instructor. Overridable: PYTHON, VENV, TORCH_SPEC, LAB_ARGS, PIP_FLAGS
# (see README.md). Written by `python -m autograder release`: venv, lab and clean-venv from
# the course's main Makefile, check and handin for learners only.
"""
# The learner's own rules, after those copied from the main Makefile. STUDENT and LESSON
# given on make's command line reach the hand-in command through the environment.
_LEARNER_RULES = f"""\
# Run a lesson's self-checks on its notebook as last saved, without JupyterLab:
# `make check LESSON=05`, or `make check` for every lesson. Exit status 0 only when all pass.
LESSON ?=
check: venv
	$(VENV_PY) -m autograder.learner.selfcheck $(LESSON)

# Pack your notebooks into {HANDIN_FOLDER}/STUDENT.zip, as <student>/<lesson>/<lesson>.ipynb (the
# layout your instructor's `make grade` reads): `make handin STUDENT=your-name [LESSON=05]`.
# Runs with $(PYTHON) alone: no virtual environment, no torch.
handin:
	@$(PYTHON) -m autograder.learner.handin --out {HANDIN_FOLDER}
"""


def learner_makefile(main: str) -> str:
    """The learner's Makefile: the main Makefile's ``venv``, ``lab`` and ``clean-venv`` rules, copied,
    and the learner's own ``check`` (:mod:`autograder.learner.selfcheck`) and ``handin``
    (:mod:`autograder.learner.handin`).

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
    chosen.insert(2, ".PHONY: venv lab clean-venv check handin")
    return _MAKE_HEADER + "\n" + "\n\n".join(chosen) + "\n\n" + _LEARNER_RULES


GITIGNORE = f"""\
.venv/
{HANDIN_FOLDER}/
__pycache__/
*.py[cod]
*.egg-info/
.ipynb_checkpoints/
"""
