"""The grading sandbox (autograder.grading.sandbox): what learners' code can and cannot reach while graded.

Each test runs a real Python inside a real bubblewrap sandbox, as ``make grade`` does for
every learner notebook's kernel and for the clean re-grade, and asks it to try what a
submission should not be able to do. Without bubblewrap these tests are skipped, unless
``COURSE_REQUIRE_SANDBOX=1`` (set by ``.ci/run`` once it has installed it) makes that a
failure. The last test needs no sandbox: it checks that ``make grade`` refuses to run
without one, and says how to get it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autograder.grading.sandbox import PACKAGE_DIRS, Sandbox, problem

ROOT = Path(__file__).resolve().parent.parent

needs_sandbox = pytest.mark.skipif(
    problem() is not None and not os.environ.get("COURSE_REQUIRE_SANDBOX"),
    reason=f"bubblewrap cannot run here ({problem()}); .ci/run installs it and sets COURSE_REQUIRE_SANDBOX=1",
)


def _probe(box: Sandbox, code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in ``box``; it prints one JSON object, returned here."""
    done = subprocess.run(box.wrap([sys.executable, "-c", textwrap.dedent(code)]), capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_sandbox
def test_only_its_own_folder_and_tmp_are_writable(tmp_path):
    """Can sandboxed code write its own folder and a private /tmp, and nothing else: not the course, the venv, the home folder?"""
    own, course = tmp_path / "own", tmp_path / "course"
    own.mkdir(), course.mkdir()
    (course / "gradebook.db").write_text("grades")
    targets = {"own": own / "x", "tmp": "/tmp/x", "course": course / "pwned", "package": PACKAGE_DIRS[1] / "pwned",
               "venv": Path(sys.prefix) / "pwned", "home": Path.home() / "pwned", "beside_gradebook": course / "x.db"}
    got = _probe(Sandbox(writable=[own], hidden=[course]), f"""
        import json
        out = {{}}
        for name, path in {json.dumps({k: str(v) for k, v in targets.items()})}.items():
            try:
                open(path, "w").write("x"); out[name] = "written"
            except OSError as exc:
                out[name] = type(exc).__name__
        print(json.dumps(out))
    """)
    assert got["own"] == got["tmp"] == "written", got
    for name in ("course", "package", "venv", "home", "beside_gradebook"):
        assert got[name] != "written", got
    assert (own / "x").read_text() == "x"
    assert [p.name for p in course.iterdir()] == ["gradebook.db"]
    assert not (PACKAGE_DIRS[1] / "pwned").exists() and not (Path.home() / "pwned").exists()


@needs_sandbox
def test_answers_gradebook_and_home_are_out_of_sight(tmp_path):
    """Are the course folder (solutions, gradebook, other submissions), the instructor's answers and the home folder invisible, while the packages (the hidden checks among them) still import?"""
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    (course / "solutions" / "answer.ipynb").write_text("{}")
    (tmp_path / "own").mkdir()
    got = _probe(Sandbox(writable=[tmp_path / "own"], hidden=[course]), f"""
        import json, os
        import helpers, autograder.kit.exercise
        out = {{"course": os.listdir({str(course)!r}), "home": os.listdir({str(Path.home())!r}),
               "repo": sorted(os.listdir({str(PACKAGE_DIRS[1].parent)!r}))}}
        for name in ("answers", "answers.lesson04", "answers.lesson11", "answers.lesson12"):
            try:
                __import__("autograder." + name)
                out[name] = "imported"
            except ImportError:
                out[name] = "missing"
        try:
            open({str(PACKAGE_DIRS[1] / "answers" / "lesson04.py")!r}).read()
            out["reference_file"] = "read"
        except OSError:
            out["reference_file"] = "unreadable"
        import autograder.hidden.lesson04
        out["hidden"] = "imported"
        print(json.dumps(out))
    """)
    assert got["course"] == [], got
    assert got["answers"] == got["answers.lesson04"] == got["answers.lesson11"] == got["answers.lesson12"] == "missing", got
    assert got["reference_file"] == "unreadable" and got["hidden"] == "imported", got  # the hidden checks run there
    assert "solutions" not in got["repo"] and "tests" not in got["repo"], got  # only the two packages are shown
    assert not any(name.startswith(".") and name not in (".venv", ".pyenv") for name in got["home"]), got


@needs_sandbox
def test_files_that_come_and_go_in_the_autograder_folder_cannot_stop_a_sandbox(tmp_path):
    """While a class is graded from the repository, the merge writes autograder/gradebook.db and its sqlite
    journal, which appears and vanishes. If such a file vanishes between the sandbox's command line being made
    and bubblewrap starting, does the sandbox still start, and does it see neither that file nor one made later,
    only the package's modules?"""
    package = PACKAGE_DIRS[1]
    journal = package / f"gradebook.db-journal-test-{os.getpid()}"
    work = package / f"submitted-test-{os.getpid()}"
    later = package / f"later-test-{os.getpid()}.db"
    box = Sandbox(writable=[tmp_path])
    try:
        journal.write_text("journal")
        work.mkdir()
        argv = box.wrap([sys.executable, "-c", textwrap.dedent(f"""
            import json, os
            print(json.dumps([sorted(os.listdir({str(package)!r})), sorted(os.listdir({str(package / "kit")!r}))]))
        """)])
        journal.unlink()  # the race, on purpose: gone before bubblewrap binds anything
        work.rmdir()
        later.write_text("grades")  # and made after the command line was
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    finally:
        for path in (journal, later):
            path.unlink(missing_ok=True)
        if work.exists():
            work.rmdir()
    assert done.returncode == 0, done.stdout + done.stderr
    seen, kit = json.loads(done.stdout.strip().splitlines()[-1])
    packages = sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    assert packages == ["answers", "grading", "hidden", "kit", "learner", "lessons", "notebooks", "release", "site"]
    assert all(name.endswith(".py") or name in ("__pycache__", *packages) for name in seen), seen
    assert "answers" not in seen and "hidden" in seen, seen  # the answers stay out; the hidden checks run there
    assert "exercise.py" in kit, kit


@needs_sandbox
def test_network_is_loopback_only_and_gloo_ranks_still_run(tmp_path):
    """Does sandboxed code have only a loopback interface, fail to reach anything else, and still run ranks over gloo?"""
    got = _probe(Sandbox(writable=[tmp_path]), """
        import json, socket
        out = {"interfaces": [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]}
        s = socket.socket(); s.settimeout(2)
        try:
            s.connect(("192.0.2.1", 80)); out["outside"] = "connected"
        except OSError as exc:
            out["outside"] = type(exc).__name__
        from helpers import launch
        out["ranks"] = launch(lambda rank, world_size: rank * 10, 2, output="quiet", timeout=60)
        print(json.dumps(out))
    """)
    assert got["interfaces"] == ["lo"], got
    assert got["outside"] != "connected" and got["ranks"] == [0, 10], got


@needs_sandbox
def test_secrets_in_the_environment_stay_outside(tmp_path):
    """Does an instructor's secret in the environment stay out of the sandbox, while the grading marker gets in?"""
    got = _probe(Sandbox(writable=[tmp_path], env={"NBGRADER_EXECUTION": "autograde"}),
                 "import json, os; print(json.dumps(dict(os.environ)))", env={"COURSE_TEST_API_TOKEN": "s3cret"})
    assert "COURSE_TEST_API_TOKEN" not in got and got.get("NBGRADER_EXECUTION") == "autograde", sorted(got)
    assert got["HOME"] == "/tmp", got


@needs_sandbox
def test_memory_is_capped_per_process_and_cannot_be_raised(tmp_path, monkeypatch):
    """With a 2 GiB cap, does a 3 GiB allocation fail in place (Python and torch, each with its own error) while
    small tensors work, can sandboxed code not lift the cap, and do the ranks it starts inherit it?"""
    monkeypatch.setenv("COURSE_SANDBOX_MEMORY", "2G")
    got = _probe(Sandbox(writable=[tmp_path]), """
        import json, resource
        import torch
        out = {"limit": resource.getrlimit(resource.RLIMIT_DATA)}
        try:
            bytearray(3 << 30); out["bytes"] = "allocated"
        except MemoryError:
            out["bytes"] = "MemoryError"
        try:
            torch.ones(3 << 28); out["torch"] = "allocated"
        except RuntimeError as exc:
            out["torch"] = str(exc)
        out["small"] = float(torch.ones(1 << 24).sum())
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            out["lifted"] = True
        except (ValueError, OSError):
            out["lifted"] = False
        from helpers import launch
        out["ranks"] = launch(lambda rank, world_size: __import__("resource").getrlimit(
            __import__("resource").RLIMIT_DATA)[0], 2, output="quiet", timeout=60)
        print(json.dumps(out))
    """)
    assert got["limit"] == [2 << 30, 2 << 30] and got["ranks"] == [2 << 30, 2 << 30], got
    assert got["bytes"] == "MemoryError" and "can't allocate memory" in got["torch"], got
    assert got["small"] == float(1 << 24) and got["lifted"] is False, got


@needs_sandbox
def test_memory_cap_can_be_switched_off_and_a_bad_value_is_named(tmp_path, monkeypatch):
    """Does COURSE_SANDBOX_MEMORY=0 leave the process uncapped, and does a value that is not an amount fail
    before anything starts, naming the variable, the value and how to write it?"""
    import resource

    from autograder.grading.sandbox import memory_cap

    monkeypatch.setenv("COURSE_SANDBOX_MEMORY", "0")
    got = _probe(Sandbox(writable=[tmp_path]),
                 "import json, resource; print(json.dumps(resource.getrlimit(resource.RLIMIT_DATA)))")
    assert got == list(resource.getrlimit(resource.RLIMIT_DATA)), got
    monkeypatch.setenv("COURSE_SANDBOX_MEMORY", "lots")
    with pytest.raises(ValueError, match=r"COURSE_SANDBOX_MEMORY='lots' is not an amount of memory.*4G, 512M"):
        memory_cap()


def test_grading_refuses_without_a_sandbox_and_says_how_to_get_one(tmp_path):
    """Does `python -m autograder grade` stop before grading when bubblewrap is missing, naming the package and the opt-out?"""
    (tmp_path / "submissions").mkdir()
    env = {**os.environ, "COURSE_BWRAP": str(tmp_path / "no-such-bwrap")}
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "submissions")], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Cannot sandbox learners' code" in done.stderr and "apt-get install bubblewrap" in done.stderr, done.stderr
    assert "--no-sandbox" in done.stderr and "NO_SANDBOX=1" in done.stderr, done.stderr
    assert not (ROOT / "autograder" / "submitted" / "x").exists()
