"""The learner distribution (`make release`): the course and its self-checks, and no answers.

Each test builds on one release made by ``python -m autograder release`` into a temporary
folder, and reads or runs it as learners get it: no mocks. The runs load the course from
the release alone (``PYTHONPATH`` at it, this checkout's editable install switched off), so
a self-check that still needed something left behind would fail here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import nbformat
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from nbclient import NotebookClient

from autograder.notebooks import colab
from autograder.release import ReleaseError, build
from autograder.release import main as release_main
from autograder.release.checks import is_placeholder
from autograder.release.rules import INSTRUCTOR_ONLY, SHIPPED
from devtools.scratch import solution_source

ROOT = Path(__file__).resolve().parent.parent
LESSON_MODULES = sorted(p.stem for p in (ROOT / "autograder" / "lessons").glob("lesson[0-9][0-9].py"))
MARKUP = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
# Lines of solution cells that ship anyway, and why that gives nothing away.
SHARED_LINES = {
    '"world_size": "WORLD_SIZE", "local_world_size": "LOCAL_WORLD_SIZE"}':
        "lesson01's self-check names the variable to read when a key is wrong; lesson 01's table teaches them",
    "F.cross_entropy(model(x), y).backward()": "the checks' own training step, shown in lesson 06 too",
    "opt = torch.optim.SGD(model.parameters(), lr=LR)": "the checks' own optimiser for lessons 05 and 07",
}
# Switches this checkout's editable install off in a child Python, so that only the release
# can provide `autograder` and `helpers` (its finder would serve modules the release lacks).
ISOLATE = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
           "if not getattr(f, '__module__', '').startswith('__editable__')]\n")


# Until an instructor sets REPOSITORY, only a draft can be built (tests below show both cases).
DRAFT = ["--allow-colab-placeholder"] if is_placeholder(colab.REPOSITORY) else []


def _release_env(release: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(release)}


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """The learner course, built by the command an instructor runs."""
    out = tmp_path_factory.mktemp("published") / "learner-course"
    done = subprocess.run([sys.executable, "-m", "autograder", "release", *DRAFT, str(out)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, f"release failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    assert f"Learner course written to {out}" in done.stdout, done.stdout
    return out


def _course_notebooks() -> list[Path]:
    """The learner notebooks, course/<lesson>/<lesson>.ipynb (not a browser test's scratch notebook beside them)."""
    return [p for p in sorted((ROOT / "course").glob("*/*.ipynb")) if p.stem == p.parent.name]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _shipped_sources(root: Path = ROOT) -> list[str]:
    """The Python files of autograder/ that learners get (``rules.SHIPPED``), as paths inside ``root``."""
    found = []
    for shipped in SHIPPED:
        place = root / "autograder" / shipped
        found += [place] if place.is_file() else [p for p in place.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(str(p.relative_to(root)) for p in found)


def _instructor_definitions(root: Path = ROOT) -> dict[str, str]:
    """Every top-level function and class of the instructor's answers and hidden checks, by its source text."""
    found = {}
    for package in ("answers", "hidden"):
        for path in sorted((root / "autograder" / package).rglob("*.py")):
            source = path.read_text()
            for node in ast.parse(source).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    found[ast.get_source_segment(source, node)] = f"{path.relative_to(root)}: {node.name}"
    return found


def instructor_code_in(folder: Path) -> list[str]:
    """Where a file under ``folder`` holds a function or class of the answers or hidden checks (by its text),
    or is one of their modules: ``"file: what"``; [] when none."""
    definitions = _instructor_definitions()
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if rel.parts[:2] in {("autograder", name) for name in INSTRUCTOR_ONLY}:
            found.append(f"{rel}: a module of autograder/{rel.parts[1]}")
            continue
        text = path.read_text(errors="replace")
        found += [f"{rel}: {where}" for source, where in definitions.items() if source in text]
    return found


# -- what is in it --------------------------------------------------------------------------


def test_release_holds_the_course_helpers_and_self_checks(release):
    """Does the release hold the learner notebooks as committed, all of helpers/, the shipped packages of
    autograder/ as they are in the checkout, and the learner's project files, and nothing else?"""
    files = _files(release)
    notebooks = sorted(str(p.relative_to(ROOT)) for p in _course_notebooks())
    helpers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "helpers").rglob("*.py"))
    autograder = _shipped_sources()
    project = [".gitignore", "MANIFEST.txt", "Makefile", "README.md", "environment.yml", "nbgrader_config.py",
               "pyproject.toml"]
    assert len(notebooks) >= 9 and "helpers/ring.py" in helpers and len(LESSON_MODULES) >= 9
    assert files == sorted(notebooks + helpers + autograder + project), (
        f"unexpected: {sorted(set(files) - set(notebooks + helpers + autograder + project))}; "
        f"missing: {sorted(set(notebooks + helpers + autograder + project) - set(files))}"
    )
    for name in notebooks + helpers + autograder:  # copied whole: nothing is rewritten on the way
        assert (release / name).read_bytes() == (ROOT / name).read_bytes(), f"{name} differs from the checkout's"


def test_manifest_and_archive_list_every_file(release):
    """Does MANIFEST.txt name exactly the release's files, and the .tar.gz hold exactly those?"""
    files = _files(release)
    assert (release / "MANIFEST.txt").read_text().splitlines() == files
    assert not [f for f in files if re.search(r"__pycache__|\.ipynb_checkpoints|\.py[cod]$", f)]
    with tarfile.open(release.parent / "learner-course.tar.gz") as tar:
        members = sorted(m.name for m in tar.getmembers() if m.isfile())
        assert members == [f"learner-course/{f}" for f in files]
        kit = tar.extractfile("learner-course/autograder/kit/exercise.py").read()
    assert kit == (release / "autograder" / "kit" / "exercise.py").read_bytes()


def test_learner_project_files_follow_the_main_ones(release):
    """Do the learner's pyproject.toml and environment.yml ask for the main runtime dependencies and
    the `course` extra (JupyterLab, nbgrader for Validate), and nothing of the test extras?"""
    main = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    learner = tomllib.loads((release / "pyproject.toml").read_text())
    assert learner["project"]["dependencies"] == main["dependencies"]
    assert learner["project"]["optional-dependencies"] == {"course": main["optional-dependencies"]["course"]}
    assert learner["tool"]["setuptools"]["packages"]["find"]["include"] == ["helpers*", "autograder*"]
    pip = [line.strip()[2:] for line in (release / "environment.yml").read_text().splitlines()
           if line.startswith("      - ")]
    assert pip == [*main["dependencies"], *main["optional-dependencies"]["course"], "-e ."]
    readme = (release / "README.md").read_text()
    for route in ("make lab", "conda env create -f environment.yml", "Open in Colab", "Validate"):
        assert route in readme, f"the learner README does not mention {route!r}"


# -- what is not in it ----------------------------------------------------------------------


def test_no_solution_text_reaches_the_release(release):
    """Is no file of solutions/, no module of the answers or the hidden checks, no nbgrader markup and no line of a
    solution (longer than 30 characters, not shown in the learner notebooks) anywhere in the release?"""
    texts = {name: (release / name).read_text(errors="replace") for name in _files(release)}
    instructor_only = {p.read_bytes() for p in (ROOT / "solutions").rglob("*") if p.is_file()}
    instructor_only |= {p.read_bytes() for package in ("answers", "hidden")
                        for p in (ROOT / "autograder" / package).rglob("*.py")}
    assert not [n for n in texts if (release / n).read_bytes() in instructor_only]
    assert not [(n, m) for n, t in texts.items() for m in MARKUP if m in t]
    shown = {line.strip() for p in _course_notebooks()
             for c in json.loads(p.read_text())["cells"] for line in "".join(c["source"]).splitlines()}
    answers = set()
    for path in (ROOT / "solutions").glob("*/*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
                answers |= {line.strip() for line in "".join(cell["source"]).splitlines()
                            if len(line.strip()) > 30 and not any(m in line for m in MARKUP)}
    secret = answers - shown
    assert len(secret) > 50, f"only {len(secret)} solution lines to look for: is solutions/ read right?"
    assert set(SHARED_LINES) <= secret, "a line of SHARED_LINES is no longer in a solution: remove it there"
    leaked = sorted((line, n) for line in secret - set(SHARED_LINES) for n, t in texts.items() if line in t)
    assert not leaked, f"solution lines in the release: {leaked}"


def test_no_answer_or_hidden_check_reaches_the_release(release):
    """Does no file of the release hold a function or class of the instructor's answers or hidden checks, and does
    every lesson ship its declarations and self-checks with no check in any part?"""
    assert len(_instructor_definitions()) > 40, "too few answers and hidden checks to look for: is autograder/ read right?"
    assert instructor_code_in(release) == []
    for module in LESSON_MODULES:
        tree = ast.parse((release / "autograder" / "lessons" / f"{module}.py").read_text())
        parts = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Part"]
        assert parts and all(len(p.args) == 3 and not p.keywords or {k.arg for k in p.keywords} <= {"forbid", "forbid_reason"}
                             for p in parts), f"{module}: a Part with a check ships"


def test_a_hidden_check_planted_in_a_shipped_package_is_found(tmp_path):
    """If someone pastes a hidden check into a shipped lesson module, or copies an answers module into a shipped
    package, does the search that guards the release find both, naming the file and where the code comes from?"""
    out = tmp_path / "release"
    (out / "autograder" / "lessons").mkdir(parents=True)
    hidden = (ROOT / "autograder" / "hidden" / "lesson04.py").read_text()
    planted = hidden[hidden.index("def _no_hang"):]
    planted = planted[:planted.index("\n\n\n")]
    (out / "autograder" / "lessons" / "lesson04.py").write_text(
        (ROOT / "autograder" / "lessons" / "lesson04.py").read_text() + "\n\n" + planted + "\n")
    shutil.copy2(ROOT / "autograder" / "answers" / "lesson09.py", out / "autograder" / "lessons" / "zero.py")
    found = instructor_code_in(out)
    assert "autograder/lessons/lesson04.py: autograder/hidden/lesson04.py: _no_hang" in found, found
    assert "autograder/lessons/zero.py: autograder/answers/lesson09.py: ShardedOptimizer" in found, found


# -- the build's own guards -------------------------------------------------------------------


def test_release_will_not_replace_a_folder_that_is_not_a_release(tmp_path):
    """Does building into a folder of other files stop, say why, and leave the files alone?"""
    keep = tmp_path / "notes" / "keep.txt"
    keep.parent.mkdir()
    keep.write_text("mine")
    with pytest.raises(ReleaseError, match="no MANIFEST.txt"):
        build(keep.parent)
    assert keep.read_text() == "mine"


def test_a_rebuild_keeps_the_published_checkout(tmp_path):
    """Does building again into an earlier release keep its .git (the published repository's
    checkout), replace the files, and leave .git out of MANIFEST.txt?"""
    out = build(tmp_path / "learner-course", allow_colab_placeholder=bool(DRAFT))
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "course" / "stale.txt").write_text("from an earlier release")
    build(out, allow_colab_placeholder=bool(DRAFT))
    assert (out / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert not (out / "course" / "stale.txt").exists()
    assert not [n for n in (out / "MANIFEST.txt").read_text().splitlines() if n.startswith(".git/")]


def _checkout(tmp_path: Path, repository: str = colab.REPOSITORY) -> Path:
    """A copy of what the release reads from this checkout, a git repository, with the notebooks'
    Colab cells pointing at ``repository`` (as `make course` would write them)."""
    copy = tmp_path / "checkout"
    for folder in ("course", "helpers", "autograder"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "Makefile", "environment.yml", "nbgrader_config.py"):
        shutil.copy2(ROOT / name, copy / name)
    here, there = (r.removeprefix("https://github.com/") for r in (colab.REPOSITORY, repository))
    for notebook in (copy / "course").glob("*/*.ipynb"):
        text = notebook.read_text()
        assert f"github/{here}/blob/" in text and f'"https://github.com/{here}.git' in text.replace('\\"', '"')
        notebook.write_text(text.replace(here, there))
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    return copy


def test_a_shipped_module_that_imports_a_left_out_one_fails_the_build(tmp_path):
    """When a self-check imports the instructor's answers, does the build stop and name the file and line?"""
    copy = _checkout(tmp_path)
    lesson = copy / "autograder" / "lessons" / "lesson00.py"
    text = lesson.read_text()
    assert "def _self_check(attempt: Attempt) -> str:\n" in text
    uses_reference = "def _self_check(attempt: Attempt) -> str:\n    from ..answers.lesson04 import chunk_bounds\n"
    lesson.write_text(text.replace("def _self_check(attempt: Attempt) -> str:\n", uses_reference))
    with pytest.raises(ReleaseError, match=r"autograder/lessons/lesson00\.py line \d+ imports autograder\.answers\.lesson04"):
        build(tmp_path / "out", root=copy, allow_colab_placeholder=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkout"], "the failed build left files behind"


def test_release_refuses_while_colab_points_at_the_placeholder(tmp_path, monkeypatch, capsys):
    """While REPOSITORY is the placeholder, does `python -m autograder release` (what `make release`
    runs) stop, name REPOSITORY, the next step and the draft flag, and write nothing?"""
    monkeypatch.setattr(colab, "REPOSITORY", colab.PLACEHOLDER)
    out = tmp_path / "learner-course"
    assert release_main([str(out)]) == 1
    said = capsys.readouterr().err
    for words in ("REPOSITORY in autograder/notebooks/colab.py is still the placeholder", colab.PLACEHOLDER,
                  "make course", "--allow-colab-placeholder"):
        assert words in said, said
    assert not list(tmp_path.iterdir()), "the refused release left files behind"


def test_a_draft_release_says_at_the_top_of_its_readme_that_colab_does_not_work(tmp_path):
    """With --allow-colab-placeholder (build(..., allow_colab_placeholder=True)), does the release build
    and its README open with a warning that names the placeholder and what the instructor must do?"""
    out = build(tmp_path / "learner-course", _checkout(tmp_path, colab.PLACEHOLDER), repository=colab.PLACEHOLDER,
                allow_colab_placeholder=True)
    readme = (out / "README.md").read_text()
    intro = readme.split("## Getting started")[0]
    assert "Draft: the *Open in Colab* badges do not work" in intro and colab.PLACEHOLDER in intro, intro
    assert "set `REPOSITORY` in `autograder/notebooks/colab.py`" in intro and "make course" in intro, intro
    assert "<the address your instructor gave you>" in readme, "a draft must not offer the placeholder to clone"


def test_a_published_release_names_its_repository_and_a_stale_course_is_refused(tmp_path):
    """With REPOSITORY set and course/ regenerated, does the README give `git clone ADDRESS` and no
    warning? With REPOSITORY set but course/ still at the placeholder, does the build stop and ask
    for `make course`?"""
    published = "https://github.com/someone/pt-course"
    out = build(tmp_path / "learner-course", _checkout(tmp_path, published), repository=published)
    readme = (out / "README.md").read_text()
    assert f"git clone {published}.git distributed-course\ncd distributed-course\nmake lab" in readme, readme
    assert "Draft" not in readme and colab.PLACEHOLDER not in readme
    stale = tmp_path / "stale"
    stale.mkdir()
    with pytest.raises(ReleaseError, match=r"course/00-getting-started/00-getting-started\.ipynb points learners on "
                                           r"Colab at github\.com/distributed-course/distributed-course.*make course"):
        build(stale / "out", _checkout(stale, colab.PLACEHOLDER), repository=published)
    assert sorted(p.name for p in stale.iterdir()) == ["checkout"], "the refused build left files behind"


# -- running it ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_self_check_runs_and_hidden_tests_say_they_are_not_there(release):
    """From the release alone: are the exercises declared as the instructor's (parts, points, rules),
    does Exercise 4.4's self-check pass the instructor's ring, and does grade() say the hidden test is
    not there?"""
    from autograder.kit.registry import exercises

    probe = ISOLATE + f"""
import importlib.util, json
import autograder, helpers
from autograder import exercise, exercises
from autograder.kit.exercise import HiddenTestUnavailable
importable = []
for name in ("autograder.answers", "autograder.hidden", "autograder.grading"):
    try:
        importlib.import_module(name)
        importable.append(name)
    except ModuleNotFoundError:
        pass
spec = importlib.util.spec_from_file_location("instructor_reference", {str(ROOT / "autograder" / "answers" / "lesson04.py")!r})
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
exercise("4.4").self_check(ref.ring_allreduce)
try:
    exercise("4.4").grade(ref.ring_allreduce, "correct")
    graded = "no error"
except HiddenTestUnavailable as err:
    graded = str(err)
declared = [[e.number, e.function, e.title, [[p.name, p.points, p.says] for p in e.parts],
             list(e.forbid), e.forbid_reason, e.visible_check.__name__] for e in exercises()]
print("PROBE " + json.dumps({{"files": [autograder.__file__, helpers.__file__], "graded": graded,
                             "importable": importable, "declared": declared}}))
"""
    done = subprocess.run([sys.executable, "-c", probe], cwd=release, env=_release_env(release),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Self-check passed" in done.stdout, done.stdout
    got = json.loads(done.stdout.split("PROBE ", 1)[1])
    assert all(f.startswith(str(release)) for f in got["files"]), got["files"]
    assert got["importable"] == [], f"the release lets learners import {got['importable']}"
    assert 'Exercise 4.4, part "correct": this copy of the course has no hidden tests.' in got["graded"], got["graded"]
    assert 'exercise("4.4").self_check(ring_allreduce)' in got["graded"], got["graded"]
    want = [[e.number, e.function, e.title, [[p.name, p.points, p.says] for p in e.parts],
             list(e.forbid), e.forbid_reason, e.visible_check.__name__] for e in exercises()]
    assert got["declared"] == want


@pytest.mark.slow
def test_learner_notebook_runs_from_the_release(release):
    """Does lesson 00, answered, run top to bottom from the release folder, with its self-check
    passing and every course module loaded from the release, none from this checkout?"""
    lesson = "00-getting-started"
    folder = release / "course" / lesson
    nb = nbformat.read(folder / f"{lesson}.ipynb", as_version=4)
    answered = 0
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            cell.source = solution_source(lesson, meta["grade_id"])
            answered += 1
    assert answered == 1
    nb.cells.insert(0, nbformat.v4.new_code_cell(ISOLATE))
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json, sys\n"
        "files = {name: getattr(m, '__file__', None) or '' for name, m in list(sys.modules.items())}\n"
        "print('LOADED ' + json.dumps(sorted(f for name, f in files.items() if name.split('.')[0] in "
        f"('autograder', 'helpers') or (f.startswith({str(ROOT)!r}) and not f.startswith(sys.prefix)))))"
    ))
    client = NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(folder)}})
    client.execute(env=_release_env(release))
    out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Self-check passed" in out, out[-2000:]
    loaded = json.loads(out.split("LOADED ", 1)[1].splitlines()[0])
    assert any(f.endswith("autograder/lessons/lesson00.py") for f in loaded), loaded
    assert all(f.startswith(str(release)) for f in loaded), f"loaded from outside the release: {loaded}"
