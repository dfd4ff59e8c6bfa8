"""The course in a real browser: `make lab` and `make instructor` driven through JupyterLab's UI.

Playwright (the pip package) drives Debian's ``chromium`` at /usr/bin/chromium; no browser
is downloaded. One `make lab`, started the way a learner starts it, serves the whole module,
and one headless browser visits it. The tests run the learner notebooks' set-up cells,
look at the per-rank tab view of ``%%distributed``, a hang report, the stop button, nbgrader's
Validate button, and the formgrader of `make instructor`.

Screenshots go to ``$BROWSER_SCREENSHOTS`` (default: browser-screenshots/ in the repository).
Without chromium the module is skipped, saying why; with ``COURSE_REQUIRE_BROWSER=1`` (set by
.ci/run after it installed chromium) a missing browser fails the module instead.

The lab gets its own, temporary JupyterLab settings and workspaces folders (so the tester's own
are left alone): autosave is off, so the learner notebooks are never written to, and the news
prompt is off. Scratch notebooks live in a temporary folder inside course/ (the only place the
lab serves), removed at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from _servers import ROOT, TOKEN, group_alive, start, stop
from conftest import SECONDS, descendants_of, describe_pids, is_gone, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.browser]

COURSE = ROOT / "course"
# Where a lesson's set-up ends: the first code cell that imports the helpers package.
IMPORTS_HELPERS = re.compile(r"^\s*(from\s+helpers\b|import\s+helpers\b|%load_ext\s+helpers\b)", re.M)
STDERR_MIME = "application/vnd.jupyter.stderr"
# JupyterLab settings for the test's lab: never save a notebook by itself, never ask about news.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
}


def lessons(folder: Path) -> list[str]:
    """Every lesson of ``folder`` (course/ or solutions/): a subfolder holding <name>/<name>.ipynb."""
    return sorted(p.name for p in folder.iterdir() if (p / f"{p.name}.ipynb").is_file())


def setup_cells(notebook: Path) -> int:
    """How many cells make up a notebook's set-up: up to and including the first code cell that imports helpers."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and IMPORTS_HELPERS.search("".join(cell["source"])):
            return i + 1
    raise AssertionError(f"{notebook.relative_to(ROOT)} has no code cell that imports helpers")


def code_notebook(*sources: str) -> dict:
    """A notebook (nbformat 4) whose code cells are ``sources``."""
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
        "cells": [{"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
                  for s in sources],
    }


# --------------------------------------------------------------------------- the lab and the browser


class Lab:
    """A running `make lab` (or `make instructor`): its address, process and REST API."""

    def __init__(self, target: str, workdir: Path) -> None:
        self.target = target
        settings = workdir / f"{target}-settings"
        for name, values in LAB_SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(values))
        self.log_path = workdir / f"make-{target}.log"
        self.proc, self.port, status = start(target, log_path=self.log_path, seconds=120, env={
            "JUPYTERLAB_SETTINGS_DIR": str(settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(workdir / f"{target}-workspaces"),
        })
        self.url = f"http://127.0.0.1:{self.port}"
        self.pgid = self.proc.pid  # start_new_session: make leads its own process group
        if status != 200:
            self.stop()
            raise AssertionError(f"`make {target}` did not serve JupyterLab:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> bool:
        """Stop the server's process group; whether all of it ended within 20 s (else it is killed)."""
        if self.proc.poll() is None or group_alive(self.pgid):
            stop(self.proc)  # returns once make has exited; jupyter may still be shutting down
        ended = wait_until(lambda: not group_alive(self.pgid), 20, interval=0.2)
        if not ended:
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return ended

    def api(self, method: str, path: str, body: dict | None = None) -> dict | list | None:
        """Call the Jupyter server's REST API (``/api/...``) with the token."""
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        return json.loads(text) if text else None

    def put_notebook(self, path: str, notebook: dict) -> None:
        """Create (or replace) a notebook through the contents API."""
        self.api("PUT", f"/api/contents/{urllib.parse.quote(path)}", {"type": "notebook", "content": notebook})

    def sessions(self, prefix: str = "") -> list[dict]:
        """The server's notebook sessions (each with its kernel) whose path starts with ``prefix``."""
        return [s for s in self.api("GET", "/api/sessions") if s["path"].startswith(prefix)]

    def end_sessions(self, prefix: str) -> None:
        """Shut down the kernels of the notebooks under ``prefix`` that are still running."""
        for session in self.sessions(prefix):
            self.api("DELETE", f"/api/sessions/{session['id']}")

    def page(self, page) -> "LabPage":
        """Load JupyterLab (an empty workspace) in ``page``."""
        page.goto(f"{self.url}/lab?reset&token={TOKEN}")
        page.locator("#jp-main-dock-panel").wait_for(timeout=120 * SECONDS)
        return LabPage(page)


class LabPage:
    """JupyterLab in a browser page, driven as a user does: menus, toolbar buttons, clicks."""

    def __init__(self, page) -> None:
        self.page = page
        self.panel = page.locator(".jp-NotebookPanel:visible")

    def menu(self, top: str, item: str) -> None:
        """Click a menu bar entry, then the item whose label starts with ``item``."""
        self.page.get_by_role("menuitem", name=top, exact=True).click()
        self.page.get_by_role("menuitem", name=re.compile("^" + re.escape(item))).click()

    def open(self, path: str) -> "LabPage":
        """File > Open from Path...: open the notebook at ``path`` and wait for its kernel to be idle."""
        from playwright.sync_api import expect

        self.menu("File", "Open from Path")
        field = self.page.locator(".jp-Dialog input")
        field.fill(path)
        field.press("Enter")
        tab = self.page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")
        expect(tab).to_have_attribute("title", re.compile(re.escape(f"Path: {path}")), timeout=60 * SECONDS)
        self.wait_idle(timeout=120)
        return self

    def close_and_shut_down(self) -> None:
        """File > Close and Shut Down Notebook, confirmed: the tab closes and its kernel ends."""
        from playwright.sync_api import expect

        self.menu("File", "Close and Shut Down Notebook")
        self.page.locator(".jp-Dialog").get_by_role("button", name="Ok").click()
        expect(self.page.locator(".jp-NotebookPanel")).to_have_count(0, timeout=60 * SECONDS)

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until the status bar says the notebook's kernel is idle."""
        from playwright.sync_api import expect

        status = self.page.locator(".jp-StatusBar-TextItem[title^='Change kernel']")
        expect(status).to_have_text(re.compile(r"\| Idle$"), timeout=timeout * SECONDS)

    def cell(self, index: int):
        return self.panel.locator(f".jp-Cell[data-windowed-list-index='{index}']")

    def button(self, name: str):
        """A notebook toolbar button by its item name: run, interrupt, restart, ..."""
        return self.panel.locator(f".jp-NotebookPanel-toolbar [data-jp-item-name='{name}'] jp-button")

    def run_cells(self, count: int) -> None:
        """Select the first cell and press the toolbar's run button ``count`` times (each runs a cell and moves on)."""
        self.cell(0).click()
        for _ in range(count):
            self.button("run").click()

    def wait_done(self, index: int, timeout: float = 120) -> None:
        """Wait until code cell ``index`` shows an execution count ([3]:, not [*]: or [ ]:)."""
        from playwright.sync_api import expect

        prompt = self.cell(index).locator(".jp-InputArea-prompt")
        expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=timeout * SECONDS)

    def output(self, index: int):
        """The output area of cell ``index``."""
        return self.cell(index).locator(".jp-Cell-outputArea")

    def stderr_text(self, index: int) -> str:
        """Everything the cell shows as error output (tracebacks and stderr), joined."""
        found = self.output(index).locator(f".jp-OutputArea-output[data-mime-type='{STDERR_MIME}']")
        return "\n".join(found.all_inner_texts())

    def screenshot(self, path: Path) -> None:
        self.page.screenshot(path=str(path))


@pytest.fixture(scope="module")
def workdir():
    path = Path(tempfile.mkdtemp(prefix="course-browser-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def lab(browser, workdir):
    """`make lab`, started as a learner starts it, in its own process group; stopped after the module."""
    server = Lab("lab", workdir)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def scratch(lab):
    """A temporary folder inside course/ for the tests' own notebooks: its path relative to the lab's root."""
    folder = COURSE / f"browser-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder.name
    if lab.proc.poll() is None:
        lab.end_sessions(folder.name + "/")
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def page(browser):
    """A fresh browser page (its own context: no shared cookies or storage), closed after the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(60 * SECONDS)
    page = context.new_page()
    yield page
    context.close()


# --------------------------------------------------------------------------- the tests


def in_the_browser(names: list[str]) -> list[str]:
    """The learner notebooks whose set-up cells the browser runs: the first lesson, the last, and every lesson that
    no learner of the graded class hands in (today lesson 01, which has no graded exercise).

    Each of the others already runs top to bottom, set-up cells first, in a kernel of its own from its released copy
    (the graded class, tests/conftest.py); its set-up cells are the solution's (test_course_is_in_sync_with_solutions)
    and run again in tests/test_notebooks.py; and what JupyterLab needs of every file (a valid notebook it opens
    without rewriting it, a kernel it has) is checked for all by test_every_learner_notebook_is_one_jupyterlab_opens.
    What the browser adds is the lab's route (its server, kernels, working folder), the same for every lesson.

    >>> in_the_browser(["00-getting-started", "01-processes-and-ranks", "02-point-to-point", "12-planning-a-run"])
    ['00-getting-started', '01-processes-and-ranks', '12-planning-a-run']
    """
    from conftest import graded_lessons

    graded = graded_lessons()
    return [name for i, name in enumerate(names) if i in (0, len(names) - 1) or name not in graded]


def test_every_learner_notebook_runs_its_set_up_cells(lab, page, shots):
    """Do the learner notebooks :func:`in_the_browser` names (the first, the last, and those no graded learner hands in)
    open in JupyterLab and run their set-up cells (up to the helpers import) without an error, leaving the file as it was?"""
    names = in_the_browser(lessons(COURSE))
    assert len(names) >= 2, f"the browser would open only {names}"
    before = {name: (COURSE / name / f"{name}.ipynb").read_bytes() for name in names}
    had_checkpoints = {name for name in names if (COURSE / name / ".ipynb_checkpoints").exists()}
    problems = []
    jlab = lab.page(page)
    try:
        for name in names:
            path = f"{name}/{name}.ipynb"
            count = setup_cells(COURSE / path)
            code = [i for i, c in enumerate(json.loads(before[name])["cells"][:count]) if c["cell_type"] == "code"]
            try:
                jlab.open(path)
                jlab.run_cells(count)
                for index in code:
                    jlab.wait_done(index)
                jlab.wait_idle()
                for index in code:
                    if errors := jlab.stderr_text(index):
                        problems.append(f"{path}, cell {index}: {errors[:2000]}")
                jlab.screenshot(shots / f"lesson-{name}.png")
            finally:
                if jlab.panel.count():
                    jlab.close_and_shut_down()
                lab.end_sessions(path)  # in case closing did not
    finally:
        for name in names:
            if name not in had_checkpoints:  # JupyterLab checkpoints each notebook it opens
                shutil.rmtree(COURSE / name / ".ipynb_checkpoints", ignore_errors=True)
    assert not problems, "set-up cells showed errors:\n" + "\n\n".join(problems)
    changed = [n for n in names if (COURSE / n / f"{n}.ipynb").read_bytes() != before[n]]
    for name in changed:  # put them back before failing
        (COURSE / name / f"{name}.ipynb").write_bytes(before[name])
    assert not changed, f"the browser test changed learner notebooks: {changed}"


def test_distributed_cell_shows_a_tab_per_rank(lab, page, scratch, shots):
    """Does a %%distributed cell that prints show a tab per rank, and does clicking a rank's tab show that rank's own text?"""
    from playwright.sync_api import expect

    path = f"{scratch}/tabs.ipynb"
    lab.put_notebook(path, code_notebook(
        # The kernel's wait for its ranks slowed (devtools.slowpoll), and each rank printing a moment
        # after it started: the rank's line and its reply land while the kernel is on its way to read.
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\nimport devtools.slowpoll\ndevtools.slowpoll.install(0.2)\n"
        "%load_ext helpers\n%dist_start -n 2",
        "%%distributed\nimport time; time.sleep(0.05)\nprint(f'hello from rank {rank} of {world_size}')",
    ))
    jlab = lab.page(page).open(path)
    try:
        jlab.run_cells(2)
        jlab.wait_done(1)
        tabs = jlab.output(1).get_by_role("tab")
        expect(tabs).to_have_text(["all ranks", "rank 0", "rank 1"], timeout=60 * SECONDS)
        shown = jlab.output(1).locator(".widget-tab-contents > .widget-output:visible")
        expect(shown).to_contain_text("[rank 1] hello from rank 1 of 2")
        expect(shown).to_contain_text("[rank 0] hello from rank 0 of 2")
        jlab.screenshot(shots / "tabs-all-ranks.png")
        for rank in (1, 0):
            tabs.filter(has_text=f"rank {rank}").click()
            expect(shown).to_have_text(f"hello from rank {rank} of 2")
            jlab.screenshot(shots / f"tabs-rank-{rank}.png")
        assert not jlab.stderr_text(0) and not jlab.stderr_text(1)
    finally:
        jlab.close_and_shut_down()


HANG_AND_STOP = (
    "import os, time\nfrom helpers import launch",
    # Every rank receives first: nobody ever sends.
    "def ring(rank, world_size):\n"
    "    import torch, torch.distributed as dist\n"
    "    t = torch.zeros(1)\n"
    "    dist.recv(t, src=(rank - 1) % world_size)\n"
    "    dist.send(t, dst=(rank + 1) % world_size)\n"
    "\n"
    "launch(ring, 2, timeout=5)",
    # Would run for a minute: the stop button must end it, and its ranks.
    "def nap(rank, world_size):\n"
    "    import os, time\n"
    "    print('pid', os.getpid(), flush=True)\n"
    "    time.sleep(60)\n"
    "\n"
    "launch(nap, 2, timeout=120)",
)


def test_hanging_cell_shows_the_diagnosis_and_the_stop_button_ends_every_rank(lab, page, scratch, shots):
    """Does a hanging cell show the diagnosis, and does the stop button end every rank?"""
    from playwright.sync_api import expect

    path = f"{scratch}/hang.ipynb"
    lab.put_notebook(path, code_notebook(*HANG_AND_STOP))
    jlab = lab.page(page).open(path)
    try:
        jlab.run_cells(2)
        jlab.wait_done(1)
        report = jlab.stderr_text(1)
        for words in ("DeadlockError", "The ranks deadlocked: found after", "rank 0 waits in recv(src=1)",
                      "rank 1 waits in recv(src=0)", "every rank is receiving before anyone sends"):
            assert words in report, f"the hang report lacks {words!r}:\n{report}"
        jlab.cell(1).scroll_into_view_if_needed()
        jlab.screenshot(shots / "hang-diagnosis.png")

        jlab.button("run").click()  # the third cell is selected now
        output = jlab.output(2)
        expect(output).to_contain_text(re.compile(r"\[rank 0\] pid \d+"), timeout=120 * SECONDS)
        expect(output).to_contain_text(re.compile(r"\[rank 1\] pid \d+"), timeout=60 * SECONDS)
        pids = [int(p) for p in re.findall(r"\[rank \d\] pid (\d+)", output.inner_text())]
        assert len(pids) == 2 and all(not is_gone(p) for p in pids), pids
        started = time.monotonic()
        jlab.button("interrupt").click()
        jlab.wait_done(2, timeout=60)
        assert time.monotonic() - started < 30, "the stop button took more than 30 s to end the cell"
        expect(output).to_contain_text("Interrupted: stopped ranks 0, 1.")
        shown = jlab.stderr_text(2)  # one line, not a traceback through the helpers' waiting loops
        assert "KeyboardInterrupt: the launch was interrupted; stopped ranks 0, 1." in shown and "_runtime" not in shown, shown
        left = [p for p in pids if not wait_until(lambda p=p: is_gone(p), 10)]
        assert not left, f"rank processes still running after the stop button: {describe_pids(left)}"
        jlab.wait_idle()  # the kernel itself lives on
        jlab.cell(2).scroll_into_view_if_needed()
        jlab.screenshot(shots / "stop-button.png")
    finally:
        jlab.close_and_shut_down()


def test_validate_button_passes_a_finished_notebook(lab, page, scratch, shots):
    """Does nbgrader's Validate button in the notebook toolbar report success on a finished notebook (lesson 0's solution)?"""
    from playwright.sync_api import expect

    lesson = "00-getting-started"
    folder = COURSE / scratch / "validate"
    folder.mkdir()
    shutil.copy(ROOT / "solutions" / lesson / f"{lesson}.ipynb", folder)
    jlab = lab.page(page).open(f"{scratch}/validate/{lesson}.ipynb")
    try:
        # nbgrader's button (its toolbar item is oddly named "runAll"), found by its label.
        jlab.panel.locator(".jp-NotebookPanel-toolbar jp-button", has_text="Validate").click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_be_visible(timeout=240 * SECONDS)
        expect(dialog).to_contain_text("Success! Your notebook passes all the tests.")
        jlab.screenshot(shots / "validate.png")
        dialog.get_by_role("button").last.click()
    finally:
        jlab.close_and_shut_down()


def test_make_instructor_serves_the_formgrader_listing_every_lesson(browser, page, workdir, shots):
    """Does `make instructor` serve nbgrader's formgrader, listing every lesson of solutions/ as an assignment?"""
    from playwright.sync_api import expect

    expected = lessons(ROOT / "solutions")
    gradebook = ROOT / "autograder" / "gradebook.db"
    had_gradebook = gradebook.exists()
    instructor = Lab("instructor", workdir)
    try:
        page.goto(f"{instructor.url}/formgrader?token={TOKEN}")
        table = page.get_by_role("grid")  # the "Manage Assignments" table
        for lesson in expected:
            expect(table.get_by_role("link", name=lesson, exact=True)).to_be_visible(timeout=120 * SECONDS)
        page.screenshot(path=str(shots / "formgrader.png"), full_page=True)
    finally:
        ended = instructor.stop()
        if not had_gradebook:  # the formgrader made one (git-ignored): leave the checkout as it was
            gradebook.unlink(missing_ok=True)
    assert ended, "`make instructor`'s process group was still there 20 s after it was stopped"


def test_lab_stops_with_nothing_left(lab):
    """When the module's `make lab` is stopped, is its process group gone, with every process it started (kernels, ranks)?"""
    started = descendants_of(lab.proc.pid)
    assert lab.proc.poll() is None, f"`make lab` ended early:\n{lab.output()[-3000:]}"
    assert lab.stop(), "`make lab`'s process group was still there 20 s after it was stopped"
    left = [p for p in started if not wait_until(lambda p=p: is_gone(p), 15)]
    assert not left, f"processes `make lab` started outlived it: {describe_pids(left)}"
