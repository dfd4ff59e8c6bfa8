"""Shared helpers for the launcher tests: finding rank processes, and driving a Jupyter kernel.

Rank processes are found only as children of the rank factory (``/proc/<pid>/task/*/children``),
never by name, and the tests only ever signal process ids they obtained that way or started
themselves.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

# The shared checks of the grading and benchmark tests (tests/_grading.py, tests/_bench.py)
# report their failures as pytest does a test's.
pytest.register_assert_rewrite("_grading", "_bench")

ROOT = Path(__file__).resolve().parents[1]
# devtools/ (course copies, free ports) is imported from the repository root, not installed.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# --------------------------------------------------------------------------- parallel runs

#: The modules that take longest, first: under pytest-xdist (`make test` runs the suite on
#: TEST_JOBS workers) they start at once, and the short modules fill the gaps around them.
#: test_site builds the website, which runs the lessons tests/test_notebooks.py has not run yet
#: (from the last back, while that module goes from the first): started early, the two share the
#: notebooks; started last, it ran alone on one core for a minute at the end of the run.
LONG_FIRST = ("graded-class", "test_notebooks", "test_site", "test_browser", "test_hub", "test_grading_dask",
              "test_grading_parallel", "test_grading_failures", "test_colab")


def worker_group(module: str) -> str:
    """What runs whole on one pytest-xdist worker: a test module (its module fixtures, a
    kernel, a lab, a release, are made once), except that the grading end-to-end modules
    and tests/test_release_learner.py share one worker, which grades all their learners together
    (``graded_class``), the two modules that start `make instructor` in the checkout share another,
    and the two that start `make hub` a third."""
    if module.startswith("test_grading_e2e") or module == "test_release_learner":
        # Every module that hands learners in to graded_class (a session fixture: each worker that asks for it
        # grades the whole class once more) goes to the one worker that grades them.
        return "graded-class"
    # Both start `make instructor`, whose formgrader makes (and the tests then remove) the checkout's gradebook.
    if module == "test_start_routes":
        return "test_browser"
    # Both run `make hub`, which builds the checkout's .venv-hub when it is missing (and EXCHANGE=ngshare installs
    # into it): two at once would build or change it under each other.
    return "test_hub" if module == "test_hub_ngshare" else module


def pytest_collection_modifyitems(config, items):
    """The modules in :data:`LONG_FIRST` first; the others keep their order."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(worker_group(item.path.stem), len(LONG_FIRST)))


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # without pytest-xdist the suite runs in one process
    pass
else:
    class _GroupScheduling(LoadScopeScheduling):
        """Hands each worker whole :func:`worker_group` units, in the order collected."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return worker_group(Path(module).stem)

    @pytest.hookimpl(optionalhook=True)  # `-p no:xdist` leaves the hook unknown: then it is not called
    def pytest_xdist_make_scheduler(config, log):
        config.option.loadscopereorder = False  # keep LONG_FIRST's order
        return _GroupScheduling(config, log)


# --------------------------------------------------------------------------- one id per test run

_RUN_ID = f"pid{os.getpid()}-{time.time_ns()}"


def suite_run_id() -> str:
    """The same id in every process of this test run (pytest-xdist gives its workers one), new for each run.

    The notebook runs of `tests/test_notebooks.py` and `tests/test_site.py` carry it in the
    executed-notebook cache (autograder/site/execute.py): a notebook that one of them ran in
    this run is not run again by the other, while one left from an earlier run is.
    """
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or _RUN_ID


# --------------------------------------------------------------------------- processes


def proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` from ``/proc/<pid>/stat`` (R, S, D, Z, ...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses: the state follows the last ')'.
    return stat.rsplit(")", 1)[1].split()[0]


def is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs: missing, or a zombie (dead, waiting to be reaped)."""
    return proc_state(pid) in (None, "Z", "X", "x")


def children_of(pid: int) -> list[int]:
    """Live (not zombie) direct children of ``pid``."""
    kids: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(k) for k in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return sorted(k for k in kids if not is_gone(k))


def descendants_of(pid: int) -> list[int]:
    """Live children, grandchildren, ... of ``pid``."""
    out: list[int] = []
    todo = children_of(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children_of(child))
    return sorted(out)


def factory_pid() -> int:
    from helpers._runtime.factory import get_factory

    return get_factory().pid


def rank_children() -> list[int]:
    """Live processes under this test process's rank factory (ranks and anything they started)."""
    return descendants_of(factory_pid())


def describe_pids(pids: list[int]) -> str:
    parts = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            cmd = "?"
        parts.append(f"{pid} [{proc_state(pid)}] {cmd}")
    return "; ".join(parts)


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


@pytest.fixture(scope="session")
def factory():
    """This test process's rank factory, started and warm (torch imported)."""
    from helpers._runtime.factory import get_factory

    return get_factory()


@pytest.fixture
def no_leftover_ranks(factory):
    """After the test, no process may remain under the rank factory."""
    from helpers._runtime.factory import get_factory

    yield
    fac = get_factory()  # the factory may have been restarted by the test
    left = descendants_of(fac.pid)
    if left:
        # Say whether they linger or leak, then clean up so the next test starts clean.
        lingering = wait_until(lambda: not descendants_of(fac.pid), 3.0)
        detail = describe_pids(left)
        from helpers import shutdown

        shutdown()
        pytest.fail(
            f"rank processes left under the factory (pid {fac.pid}) after the test: {detail}"
            + (" (they exited within 3 s)" if lingering else " (still running 3 s later)")
        )


# --------------------------------------------------------------------------- kernel

from devtools.kernel import Kernel, start_kernel  # noqa: E402 - after ROOT is on sys.path


@pytest.fixture
def make_kernel():
    """Start kernels on demand; every one is shut down after the test."""
    kernels: list[Kernel] = []

    def start() -> Kernel:
        kernels.append(start_kernel())
        return kernels[-1]

    yield start
    for kernel in kernels:
        kernel.close()


# --------------------------------------------------------------------------- a browser

#: Debian's chromium, which Playwright drives (no browser is downloaded), and how it is started.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]
SECONDS = 1000  # Playwright counts in milliseconds


def why_no_chromium() -> str:
    """Why chromium is not there, and how to get it on this machine."""
    if shutil.which("apt-get") and os.geteuid() == 0:
        how = "run `apt-get update && apt-get install -y chromium` (.ci/run does it)"
        return f"chromium is not installed at {CHROMIUM}: {how}"
    return (f"chromium is not installed at {CHROMIUM} and this user cannot install it: "
            "run `sudo apt-get install chromium`")


def no_browser(reason: str):
    """Skip the test for ``reason``; fail it instead under ``COURSE_REQUIRE_BROWSER=1`` (CI, once it installed one)."""
    if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"COURSE_REQUIRE_BROWSER=1, but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for the module, driven by Playwright; Playwright's expectations wait up to 30 s (another
    test run may share the cores: wait, but boundedly)."""
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        no_browser("the playwright package is not installed: run `make venv` (it is in the test extra)")
    if not os.path.exists(CHROMIUM):
        no_browser(why_no_chromium())
    expect.set_options(timeout=30 * SECONDS)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def shots(request):
    """The folder for screenshots: $BROWSER_SCREENSHOTS or browser-screenshots/ in the repository."""
    folder = Path(os.environ.get("BROWSER_SCREENSHOTS") or ROOT / "browser-screenshots").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    # Say where they are even when the tests pass (pytest captures a fixture's output).
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\nbrowser screenshots: {folder}")
    else:
        print(f"browser screenshots: {folder}")


# --------------------------------------------------------------------------- one graded class


def graded_lessons() -> set[str]:
    """Every lesson that some learner of :func:`graded_class` hands in when the whole suite runs: the ``LESSONS``
    and ``HANDED_IN`` of every test module that hands in (whichever modules this session collected)."""
    import importlib

    found = set()
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if re.search(r"^HANDED_IN\s*=|^def hand_in\(", text, re.MULTILINE):
            module = importlib.import_module(path.stem)
            found |= set(getattr(module, "LESSONS", ())) | set(getattr(module, "HANDED_IN", {}))
    return found


@pytest.fixture(scope="session")
def graded_class(request, tmp_path_factory):
    """One `python -m autograder grade` run for every learner that this session's grading tests hand in.

    Each test module that reads its grades from this run says what its learners hand in:
    either ``HANDED_IN`` (lesson -> learner -> the exercise cells they filled in, written
    by :func:`devtools.scratch.hand_in`), or, for hand-ins that need more (deleted or edited
    cells), ``LESSONS`` (the lessons it hands in) and ``hand_in(root, submissions)`` (writes
    its learners' notebooks). The modules collected in this session are asked, their
    learners graded together in one throw-away copy of the course, and the run's root
    folder and printed output returned: one grading run instead of one per module, graded
    the way an instructor grades a class (two at a time). Running a single module grades
    only its own learners.
    """
    from devtools.scratch import course_copy, hand_in, run_instructor_command

    modules = sorted({item.module for item in request.session.items
                      if hasattr(item.module, "hand_in") or hasattr(item.module, "HANDED_IN")},
                     key=lambda module: module.__name__)
    lessons = {lesson for m in modules for lesson in getattr(m, "LESSONS", ())}
    lessons |= {lesson for m in modules for lesson in getattr(m, "HANDED_IN", {})}
    tmp = tmp_path_factory.mktemp("graded-class")
    root = course_copy(tmp / "course", lessons=sorted(lessons))
    for module in modules:
        if hasattr(module, "hand_in"):
            module.hand_in(root, tmp / "submissions")
        for lesson, answers in getattr(module, "HANDED_IN", {}).items():
            hand_in(root, tmp / "submissions", lesson, answers)
    done = run_instructor_command(root, "grade", str(tmp / "submissions"), "--jobs", "2")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    return root, done.stdout


@pytest.fixture(scope="module")
def graded_lesson(request, graded_class):
    """The test module's one lesson of :func:`graded_class` (its ``HANDED_IN``), as a :class:`_grading.GradedLesson`."""
    from _grading import GradedLesson
    from devtools.scratch import layout

    ((lesson, answers),) = request.module.HANDED_IN.items()
    return GradedLesson(graded_class[0], lesson, tuple(answers), *layout(lesson))
