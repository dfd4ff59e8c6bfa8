"""Packaging and repository hygiene checks.

These tests need no torch, GPU or network: they read pyproject.toml,
environment.yml, the Makefile, .ci/run, .gitignore and the committed notebooks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- helpers


def _load_yaml(path: Path) -> dict:
    """Parse environment.yml with PyYAML, or a tiny fallback for its simple shape."""
    text = path.read_text(encoding="utf-8")
    try:
        import yaml
    except ImportError:
        return _parse_simple_env_yaml(text)
    return yaml.safe_load(text)


def _parse_simple_env_yaml(text: str) -> dict:
    """Enough YAML for environment.yml: top-level keys, '- item' lists, one nested '- pip:' list."""
    data: dict = {}
    key = None
    pip_list = None
    pip_indent = None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        if indent == 0:
            pip_list = None
            key, _, value = stripped.partition(":")
            data[key] = value.strip() or []
            continue
        assert stripped.startswith("- "), f"unsupported YAML line: {raw!r}"
        item = stripped[2:].strip()
        if pip_list is not None and indent > pip_indent:
            pip_list.append(item)
        elif item == "pip:":
            pip_list, pip_indent = [], indent
            data[key].append({"pip": pip_list})
        else:
            pip_list = None
            data[key].append(item)
    return data


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _req_map(specs: list[str]) -> dict[str, str]:
    """{canonical name: normalised specifier} -- fails on duplicate names."""
    out: dict[str, str] = {}
    for spec in specs:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name not in out, f"{req.name} listed twice"
        out[name] = ",".join(sorted(str(s) for s in req.specifier))
    return out


def _env_pip_list() -> list[str]:
    env = _load_yaml(ROOT / "environment.yml")
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml should have exactly one pip: section"
    return [str(item) for item in pip_sections[0]]


def _make_rule_recipe(makefile: str, target: str) -> list[str]:
    """Recipe lines (tab-indented) of `target:` in a Makefile."""
    lines = makefile.splitlines()
    rule = re.compile(rf"^{re.escape(target)}\s*:(?!=)")
    for i, line in enumerate(lines):
        if rule.match(line):
            recipe = []
            for nxt in lines[i + 1 :]:
                if nxt.startswith("\t"):
                    recipe.append(nxt.strip())
                elif nxt.strip() == "" or nxt.lstrip().startswith("#"):
                    continue
                else:
                    break
            return recipe
    raise AssertionError(f"no '{target}:' rule in Makefile")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _in_git_work_tree() -> bool:
    if shutil.which("git") is None:
        return False
    res = _git("rev-parse", "--is-inside-work-tree")
    return res.returncode == 0 and res.stdout.strip() == "true"


def _notebook_problems(nb: dict) -> list[str]:
    """Why a notebook is not clean: code cells with outputs or execution counts."""
    problems = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {i} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {i} has execution_count={cell['execution_count']}")
    return problems


# --------------------------------------------------------------------------- (a) dependencies


def test_environment_yml_matches_pyproject():
    """Does environment.yml's pip list name the same packages, with the same bounds,
    as pyproject's runtime deps plus the course and test extras?"""
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    expected = _req_map(project["dependencies"] + extras["course"] + extras["test"])

    pip_items = _env_pip_list()
    assert pip_items[-1] == "-e .", "environment.yml must end its pip list with '-e .'"
    actual = _req_map(pip_items[:-1])

    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    assert not missing and not extra, f"only in pyproject: {missing}; only in environment.yml: {extra}"
    differing = {n: (expected[n], actual[n]) for n in expected if expected[n] != actual[n]}
    assert differing == {}, f"bounds differ (pyproject, environment.yml): {differing}"


def test_fallback_yaml_parser_agrees_with_pyyaml():
    """If PyYAML were missing, would the fallback parser read environment.yml the same way?"""
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "environment.yml").read_text(encoding="utf-8")
    assert _parse_simple_env_yaml(text) == yaml.safe_load(text)


def test_environment_yml_python_and_channels():
    """Does the conda env ask for the same Python floor as pyproject, from conda-forge only?"""
    env = _load_yaml(ROOT / "environment.yml")
    requires_python = _pyproject()["project"]["requires-python"]
    conda_deps = [d for d in env["dependencies"] if isinstance(d, str)]
    assert f"python{requires_python}" in conda_deps
    assert "pip" in conda_deps
    assert env["channels"] == ["conda-forge"]


def test_dev_extra_covers_course_test_and_grading():
    """Does the `dev` extra (what `make venv`, so `make test`, `make grade`, `make hub` and `make site`, installs)
    pull in the course, test, grading, hub and site extras, with Dask's grading engine and JupyterHub only in the
    instructor's extras?"""
    project = _pyproject()["project"]
    (dev,) = project["optional-dependencies"]["dev"]
    req = Requirement(dev)
    assert canonicalize_name(req.name) == canonicalize_name(project["name"])
    assert req.extras == {"course", "test", "grading", "hub", "site"}
    grading = _req_map(project["optional-dependencies"]["grading"])
    assert set(grading) == {"distributed", "dask-jobqueue"} and all(bound.startswith(">=") for bound in grading.values())
    learner = _req_map(project["dependencies"] + project["optional-dependencies"]["course"])
    assert not set(grading) & set(learner), "the grading engine is the instructor's, not a learner's"
    hub = _req_map(project["optional-dependencies"]["hub"])
    assert set(hub) == {"jupyterhub", "jupyterhub-idle-culler"} and not set(hub) & set(learner), \
        "JupyterHub (and its idle culler) is the instructor's, not a learner's"


# --------------------------------------------------------------------------- (b) make test / CI


def test_make_test_runs_pytest():
    """Does `make test` run pytest in the venv, passing PYTEST_ARGS through?"""
    recipe = _make_rule_recipe((ROOT / "Makefile").read_text(encoding="utf-8"), "test")
    assert any(
        re.search(r"-m pytest\b", line) and "$(PYTEST_ARGS)" in line for line in recipe
    ), recipe


def test_ci_runs_make_test_without_masking_failures():
    """Does .ci/run call `make test` under `set -euo pipefail`, without swallowing its exit code?"""
    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
    lines = [ln.strip() for ln in ci.read_text(encoding="utf-8").splitlines()]
    code = [ln for ln in lines if ln and not ln.startswith("#")]
    assert "set -euo pipefail" in code
    make_test = [ln for ln in code if re.match(r"make\s+test\b", ln)]
    assert make_test, ".ci/run never calls `make test`"
    for ln in make_test:
        assert "||" not in ln and not ln.endswith("&"), f"failure of {ln!r} would be masked"
    assert not any(re.search(r"\|\|\s*(true|:)\s*$", ln) for ln in code), "a `|| true` hides failures"


# --------------------------------------------------------------------------- (c) .gitignore

IGNORED = [
    ".venv/bin/python",
    "autograder/gradebook.db",
    "autograder/submitted/alice/ps1/ps1.ipynb",
    "autograder/autograded/alice/ps1/ps1.ipynb",
    "autograder/feedback/alice/ps1/ps1.html",
    "autograder/grades.csv",
    ".nbgrader.log",
    "autograder/grading-run.json",
    "browser-screenshots/tabs-rank-0.png",
]
NOT_IGNORED = [
    "autograder/lessons/lesson04.py",
    "course/01_ranks.ipynb",
    "solutions/01_ranks.ipynb",
]


def test_gitignore_covers_venv_and_nbgrader_work_folders():
    """Does .gitignore keep the venv and nbgrader's per-student folders out of git,
    while keeping the nbgrader source, course and solutions notebooks in?"""
    if not _in_git_work_tree():
        text = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
        for pattern in [".venv/", "/autograder/gradebook.db", "/autograder/submitted/",
                        "/autograder/autograded/", "/autograder/feedback/", "/.nbgrader.log"]:
            assert pattern in text, pattern
        return
    for path in IGNORED:
        res = _git("check-ignore", "-q", "--no-index", path)
        assert res.returncode == 0, f"{path} is not ignored ({res.stderr.strip()})"
    for path in NOT_IGNORED:
        res = _git("check-ignore", "-q", "--no-index", path)
        assert res.returncode == 1, f"{path} should not be ignored ({res.stderr.strip()})"


# --------------------------------------------------------------------------- (d) clean notebooks


def test_notebook_checker_flags_outputs_and_counts():
    """Would the clean-notebook check catch a notebook saved with outputs?"""
    dirty = {"cells": [
        {"cell_type": "markdown", "source": "hi"},
        {"cell_type": "code", "execution_count": 3, "outputs": [{"output_type": "stream"}], "source": ""},
    ]}
    clean = {"cells": [{"cell_type": "code", "execution_count": None, "outputs": [], "source": ""}]}
    assert _notebook_problems(dirty) == ["cell 1 has outputs", "cell 1 has execution_count=3"]
    assert _notebook_problems(clean) == []


def test_committed_notebooks_have_no_outputs():
    """Is every notebook git tracks under course/ and solutions/ free of outputs and execution counts?"""
    if not _in_git_work_tree():
        pytest.skip("git (or a git work tree) is not available")
    res = _git("ls-files", "-z", "--", "course/*.ipynb", "solutions/*.ipynb")
    assert res.returncode == 0, res.stderr
    notebooks = [p for p in res.stdout.split("\0") if p]
    dirty = {}
    for rel in notebooks:
        with open(ROOT / rel, encoding="utf-8") as f:
            problems = _notebook_problems(json.load(f))
        if problems:
            dirty[rel] = problems
    assert dirty == {}, f"clear outputs before committing (e.g. `jupyter nbconvert --clear-output --inplace`): {dirty}"
