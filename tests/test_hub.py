"""The course on a JupyterHub (`make hub`): nbgrader's exchange end to end, driven in Chromium.

One `make hub` (JupyterHub from the venv, configurable-http-proxy from npm, PAM logins,
LocalProcessSpawner) runs for the module, with three real Unix users made for it in a
temporary home folder: an instructor and two learners. A throw-away copy of the course
(lesson 04, owned by the instructor) is the instructor's course folder.

What goes through the browser (Playwright driving Debian's chromium, as in test_browser.py):
every login; the instructor's Release and Release Feedback buttons in the formgrader, and its
Manage Students page; each learner's Assignments tab (Fetch, Submit, Fetch Feedback), opening
the lesson, running the cells that launch ranks, the notebook's Validate button, and reading
the feedback page. What does not: the answer text itself is written into the learner's
fetched notebook file by that Unix user before the notebook is opened (typing a whole ring
all-reduce into the editor is slow and tests nothing of the hub), and the instructor's
`python -m autograder collect` (what `make collect` runs) is run as the instructor's Unix
user, as it would be from a terminal of their server.

What a learner meets, checked on the way: no "official Jupyter news" prompt in anyone's JupyterLab;
Validate fails a deadlocking ring with its self-check's own message; feedback pages without the
hidden tests' source, each part's verdict kept; the formgrader's Autograde button grading one
submission through the course's grading; Manage Students naming each learner from their account
(the passwd full name, else the login name). A third learner logs in, leaves, and their server is
stopped by the idle culler (the hub runs with a short ``HUB_IDLE_TIMEOUT``) with their files kept.

Bad input checked here: a learner who submits twice (the later submission is graded, both
stay in the exchange and in the learner's own cache), a learner who deleted a test cell
(grading puts it back and grades it), and the third learner's home deleted before her first
login (the hub makes it, hers); and the running hub holds `make hub`'s one-hub-per-course lock.
The rest of the hub route's bad input is tests/test_hub_bad_input.py's, without a hub. The isolation between people is asserted by trying,
as each Unix user, to read what is not theirs.

Skipped, saying why, when not root, or without npm, chromium, bubblewrap or useradd; with
``COURSE_REQUIRE_BROWSER=1`` (CI) those skips fail instead. Everything the module made is
removed at the end, failure or not: the hub's process group, every process of the users it
made, the users, their group and the temporary folder. Screenshots go where the other
browser tests put theirs (``$BROWSER_SCREENSHOTS``, default browser-screenshots/), named hub-*.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from _servers import ROOT, get, group_alive
from conftest import descendants_of, wait_until
from conftest import CHROMIUM, SECONDS, no_browser, why_no_chromium
from test_browser import LabPage

pytestmark = [pytest.mark.slow, pytest.mark.browser]

LESSON = "04-ring-all-reduce"
COURSE_ID = "distributed-pytorch"
EXERCISES = ("ex4_1-ring-chunks", "ex4_2-ring-reduce-scatter", "ex4_3-ring-all-gather", "ex4_4-ring-allreduce")
#: The cells a learner runs in the browser, found by their grade_id or their first line: the imports,
#: `chunk_bounds` and the answers to 4.1-4.4 (4.4's ring calls 4.2's and 4.3's functions), 4.4's
#: self-check, and "Try it on three ranks" (a launch whose per-rank results the cell prints).
IMPORTS, CHUNK_BOUNDS = "from helpers import launch", "def chunk_bounds("
SELF_CHECK, TRY_IT = "self-check-ex4_4", "out = launch(lambda rank, world_size: ring_allreduce("
DELETED_TEST = "test-ex4_4-no-hang"
#: Exercise 4.4's graded parts and their points: each has a verdict line in the feedback.
PARTS_44 = {"correct": 4, "point_to_point": 2, "bandwidth": 3, "no_hang": 1}
#: What `make hub` (its own port), JupyterHub (its API port) or the proxy print when a port chosen free
#: was taken before it was bound: the hub is then started again on other ports.
PORT_TAKEN = ("is taken", "Address already in use", "EADDRINUSE")
#: The idle culler's limit for this hub: servers with a JupyterLab page open are never idle (the page polls them
#: through the proxy, whose record the hub reads every sixth of the limit), and the learner who left just after
#: the release (about 130 s before the round trip ends, more on a busy machine) is culled before it ends.
IDLE_TIMEOUT = 90
#: ann's full name in her account (passwd's GECOS field); ben's account has none.
FULL_NAME = "Ann Lovelace"
NEWS = "official Jupyter news"
ANNOUNCEMENTS = "@jupyterlab/apputils-extension:announcements"

# Rewrites a fetched notebook as its owner: answers by grade_id, some cells deleted. Run with the
# hub's Python as that Unix user, so the file stays theirs and nothing of root's touches it.
WRITE_ANSWERS = r"""
import json, sys
path, answers, drop = sys.argv[1], json.loads(sys.argv[2]), set(json.loads(sys.argv[3]))
nb = json.load(open(path))
cells = []
for cell in nb["cells"]:
    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    if gid in drop:
        continue
    if gid in answers:
        cell["source"] = answers[gid]
    cells.append(cell)
nb["cells"] = cells
with open(path, "w") as f:
    json.dump(nb, f, indent=1)
"""

# Tries to read each path given as that Unix user: prints a JSON map path -> "read" or the error's name.
TRY_READ = r"""
import json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        out[path] = "read"
    except OSError as exc:
        out[path] = type(exc).__name__
print(json.dumps(out))
"""


# --------------------------------------------------------------------------- what the test needs


def _missing() -> str | None:
    """Why this machine cannot run the hub test, or None."""
    if os.geteuid() != 0:
        return "the hub test makes Unix users and runs JupyterHub as root: run the suite as root (CI does)"
    for tool, how in (("npm", "apt-get install npm"), ("useradd", "apt-get install passwd"),
                      ("runuser", "apt-get install util-linux"), ("bwrap", "apt-get install bubblewrap")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: `{how}`"
    if not os.path.exists(CHROMIUM):
        return why_no_chromium()
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed: run `make venv` (it is in the test extra)"
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        return "JupyterHub is not installed in the venv: run `make venv` (it is in the hub extra)"
    return None


def hub_python() -> Path:
    """The Python every user's server runs: the venv `make hub` picks (the Makefile's HUB_VENV rule)."""
    mine = ROOT / ".venv" / "bin" / "python"
    if run_as("nobody", str(mine), "-c", "pass").returncode == 0:
        return mine
    return ROOT / ".venv-hub" / "bin" / "python"


def run_as(user: str, *command: str, env: dict[str, str] | None = None, cwd: Path | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    """``command`` as Unix user ``user`` (runuser), with only ``env`` in its environment when given."""
    prefix = ["runuser", "-u", user, "--"]
    if env is not None:
        prefix += ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
    return subprocess.run([*prefix, *command], capture_output=True, text=True, cwd=cwd, timeout=timeout)


class Users:
    """Unix users and a group made for the test, in a home root of its own; removed by :meth:`remove`."""

    def __init__(self, home_root: Path) -> None:
        self.home_root = home_root
        self.tag = uuid.uuid4().hex[:6]
        self.group = f"hub{self.tag}g"
        self.made: list[str] = []
        self.passwords: dict[str, str] = {}
        self.group_made = False

    def add_group(self) -> None:
        subprocess.run(["groupadd", self.group], check=True)
        self.group_made = True

    def add(self, role: str, learner: bool, full_name: str = "") -> str:
        name = f"hub{self.tag}{role}"
        args = ["useradd", "-m", "-b", str(self.home_root), "-K", "HOME_MODE=0700", "-s", "/bin/bash",
                *(["-c", full_name] if full_name else [])]
        subprocess.run([*args, *(["-G", self.group] if learner else []), name], check=True, capture_output=True)
        self.made.append(name)
        self.passwords[name] = f"pw-{uuid.uuid4().hex[:12]}"
        subprocess.run(["chpasswd"], input=f"{name}:{self.passwords[name]}\n", text=True, check=True)
        return name

    def home(self, name: str) -> Path:
        return self.home_root / name

    def uids(self) -> set[int]:
        import pwd

        found = set()
        for name in self.made:
            try:
                found.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                pass
        return found

    def processes(self, only: str | None = None) -> list[int]:
        """Every process running as one of these users (all of them started by this test's hub), or as ``only``."""
        uids, pids = ({_uid(only)} if only else self.uids()), []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            found = re.search(r"^Uid:\s+(\d+)", status, re.M)
            if found and int(found.group(1)) in uids:
                pids.append(int(entry))
        return pids

    def end_processes(self) -> None:
        """SIGTERM to every process of these users (their servers, kernels, ranks), SIGKILL after 10 s."""
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            for pid in self.processes():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if wait_until(lambda: not self.processes(), grace, interval=0.2):
                return

    def remove(self) -> list[str]:
        """End these users' processes, then remove the users and the group; what could not be removed."""
        self.end_processes()
        problems = []
        for name in self.made:
            done = subprocess.run(["userdel", "-r", name], capture_output=True, text=True)
            if done.returncode not in (0, 6):  # 6: no such user
                problems.append(f"userdel {name}: {done.stderr.strip()}")
        if self.group_made:
            subprocess.run(["groupdel", self.group], capture_output=True)
        return problems


class Hub:
    """`make hub` in its own process group, on a free loopback port, for the module."""

    def __init__(self, users: Users, instructor: str, course: Path, work: Path) -> None:
        from helpers._runtime.spec import free_port

        self.exchange, self.state, self.log_path = work / "exchange", work / "state", work / "make-hub.log"
        for attempt in range(4):
            self.port = free_port()
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(
                    ["make", "--no-print-directory", "hub", f"HUB_PORT={self.port}", f"HUB_INSTRUCTOR={instructor}",
                     f"HUB_GROUP={users.group}", f"HUB_COURSE={course}", f"HUB_EXCHANGE={self.exchange}",
                     f"HUB_STATE={self.state}", f"HUB_IDLE_TIMEOUT={IDLE_TIMEOUT}"],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.url = f"http://127.0.0.1:{self.port}"
            if self._wait_up(300):  # the first `make hub` on a machine may build its venv (about a minute)
                return
            self.stop()
            if not any(words in self.output() for words in PORT_TAKEN) or attempt == 3:
                break
        raise AssertionError(f"`make hub` did not serve the hub's login page:\n{self.output()[-4000:]}")

    def _wait_up(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if get(f"{self.url}/hub/login")[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.5)
        return False

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, users: Users | None = None) -> bool:
        """Stop the hub as an instructor would (SIGTERM to JupyterHub, which stops every user's server and its
        proxy), then SIGKILL whatever of its process group, and of ``users``' processes, is left after 30 s."""
        started = descendants_of(self.proc.pid)
        try:
            hub_pid = int((self.state / "jupyterhub.pid").read_text())
        except (OSError, ValueError):
            hub_pid = None
        if hub_pid in started:
            os.kill(hub_pid, signal.SIGTERM)
            wait_until(lambda: self.proc.poll() is not None and (users is None or not users.processes()), 30,
                       interval=0.2)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            if wait_until(lambda: not group_alive(self.proc.pid), 10, interval=0.2):
                break
        self.proc.wait(10)
        for pid in started:  # servers run in sessions of their own: end any the hub left
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return not group_alive(self.proc.pid)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hub_world():
    """The users, the course copy and a running `make hub`; everything removed afterwards."""
    reason = _missing()
    if reason:
        no_browser(reason)
    from devtools.scratch import course_copy

    work = Path(tempfile.mkdtemp(prefix="course-hub-"))
    work.chmod(0o755)  # users pass through to their homes, the state and the exchange
    (work / "homes").mkdir(mode=0o755)
    users = Users(work / "homes")
    hub = None
    try:
        users.add_group()
        instructor = users.add("i", learner=False)
        learners = [users.add("a", learner=True, full_name=FULL_NAME), users.add("b", learner=True),
                    users.add("c", learner=True)]
        course = course_copy(work / "course", lessons=[LESSON])
        subprocess.run(["chown", "-R", f"{instructor}:", str(course)], check=True)
        hub = Hub(users, instructor, course, work)
        yield {"users": users, "hub": hub, "instructor": instructor, "learners": learners, "course": course,
               "work": work}
    finally:
        ended = hub.stop(users) if hub is not None else True
        left = users.processes()  # the hub stops every user's server, and their kernels and ranks with it
        problems = users.remove()
        shutil.rmtree(work, ignore_errors=True)
        assert ended, "the hub's process group was still there after SIGKILL"
        assert not left, f"processes of the hub's users outlived the hub: {left}"
        assert not problems, problems


@pytest.fixture(scope="module")
def browser(browser):
    """The shared chromium (tests/conftest.py), with Playwright's expectations waiting up to a minute: the hub's
    pages come from three users' servers on a busy machine."""
    from playwright.sync_api import expect

    expect.set_options(timeout=60 * SECONDS)
    return browser


# --------------------------------------------------------------------------- people in the browser


class Person:
    """One person logged in to the hub in a browser context of their own."""

    def __init__(self, browser, hub: Hub, name: str, password: str, shots: Path, tag: str) -> None:
        self.name, self.hub, self.shots, self.tag = name, hub, shots, tag
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.context.set_default_timeout(120 * SECONDS)
        self.page = self.context.new_page()
        self.base = f"{hub.url}/user/{name}"
        self.page.goto(f"{hub.url}/hub/login")
        self.page.fill("#username_input", name)
        self.page.fill("#password_input", password)
        self.page.click("#login_submit")
        self.page.locator("#jp-main-dock-panel").wait_for(timeout=180 * SECONDS)
        self.lab = LabPage(self.page)
        config = self.page.evaluate("JSON.parse(document.getElementById('jupyter-config-data').textContent)")
        assert ANNOUNCEMENTS in json.dumps(config.get("disabledExtensions")), \
            f"{name}'s JupyterLab may ask about Jupyter news: {config.get('disabledExtensions')}"

    def no_news(self) -> None:
        """Long after JupyterLab started: no "get notified about official Jupyter news?" toast."""
        from playwright.sync_api import expect

        expect(self.page.get_by_text(NEWS)).to_have_count(0)

    def shot(self, step: str) -> None:
        self.page.screenshot(path=str(self.shots / f"hub-{step}-{self.tag}.png"))

    def assignments(self):
        """Nbgrader > Assignment List: the Assignments tab, refreshed."""
        self.lab.menu("Nbgrader", "Assignment List")
        panel = self.page.locator("#assignments")
        panel.wait_for()
        panel.locator("#refresh_assignments_list").click()
        return panel

    def close(self) -> None:
        self.context.close()


def cell_indexes(notebook: Path) -> dict[str, int]:
    """Where the cells the learner runs are in ``notebook``: grade_id or first words -> index."""
    found = {}
    for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        source = "".join(cell["source"])
        for key in (IMPORTS, CHUNK_BOUNDS, TRY_IT):
            if cell["cell_type"] == "code" and key in source:
                found.setdefault(key, index)
        if gid:
            found[gid] = index
    return found


def fetched_notebook(users: Users, learner: str) -> Path:
    return users.home(learner) / LESSON / f"{LESSON}.ipynb"


def learner_round(person: Person, users: Users, answers: dict[str, str], drop: list[str],
                  submit_first: bool = False) -> None:
    """Fetch in the Assignments tab, answer, open, run the ranks' cells, validate, submit."""
    from playwright.sync_api import expect

    page = person.page
    panel = person.assignments()
    released = panel.locator("#released_assignments_list .list_item", has_text=LESSON)
    released.get_by_role("button", name="Fetch").click()
    fetched = panel.locator("#fetched_assignments_list .list_item", has_text=LESSON)
    expect(fetched.get_by_role("button", name="Submit")).to_be_visible()
    person.shot("2-fetched")
    step(f"{person.name} fetched")
    path = fetched_notebook(users, person.name)
    assert path.is_file() and path.stat().st_uid == _uid(person.name), f"the fetch did not give {person.name} {path}"
    submitted = panel.locator("#submitted_assignments_list .list_item", has_text=LESSON)
    if submit_first:  # the untouched notebook, submitted by mistake before answering
        fetched.get_by_role("button", name="Submit").click()
        expect(submitted).to_have_count(1)

    done = run_as(person.name, str(hub_python()), "-c", WRITE_ANSWERS, str(path), json.dumps(answers),
                  json.dumps(drop))
    assert done.returncode == 0, done.stderr

    cells = cell_indexes(path)
    person.lab.open(f"{LESSON}/{LESSON}.ipynb")
    for key in (IMPORTS, CHUNK_BOUNDS, *EXERCISES, SELF_CHECK, TRY_IT):
        person.lab.cell(cells[key]).click()
        person.lab.button("run").click()
        person.lab.wait_done(cells[key], timeout=120)
    person.lab.cell(cells[TRY_IT]).scroll_into_view_if_needed()
    person.ranks_output = person.lab.output(cells[TRY_IT]).inner_text()
    person.ranks_errors = person.lab.stderr_text(cells[TRY_IT])
    person.self_check = person.lab.output(cells[SELF_CHECK]).inner_text()
    person.shot("3-ranks")
    step(f"{person.name} ran the cells")

    person.no_news()
    person.lab.panel.locator(".jp-NotebookPanel-toolbar jp-button", has_text="Validate").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_be_visible(timeout=240 * SECONDS)
    person.validated = dialog.inner_text()
    step(f"{person.name} validated")
    person.shot("4-validated")
    dialog.get_by_role("button").last.click()
    expect(dialog).to_have_count(0)

    panel = person.assignments()
    panel.locator("#fetched_assignments_list .list_item", has_text=LESSON).get_by_role("button", name="Submit").click()
    # One line per submission, each with its time: the earlier submission stays listed.
    expect(submitted).to_contain_text(re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d.*){%d}" % (2 if submit_first else 1), re.S))
    person.shot("5-submitted")
    step(f"{person.name} submitted")


_T0 = [time.monotonic()]


def step(what: str) -> None:
    print(f"[{time.monotonic() - _T0[0]:6.1f} s] {what}", flush=True)


def _uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


# --------------------------------------------------------------------------- the test


def test_round_trip_release_fetch_submit_grade_feedback(hub_world, browser, shots):
    """Does a lesson go from the instructor's Release button to two learners' Assignments tabs, come back as
    submissions, get graded by the course's grading (sandbox, clean re-grade, Dask), and reach each learner as
    feedback naming each part's verdict, with both scores in the formgrader and nobody reading what is not theirs?"""
    from playwright.sync_api import expect
    from devtools.scratch import RING_ANSWERS, solution_source

    users, hub, course = hub_world["users"], hub_world["hub"], hub_world["course"]
    instructor, (ann, ben, cas) = hub_world["instructor"], hub_world["learners"]
    solutions = {gid: solution_source(LESSON, gid) for gid in EXERCISES}
    people: list[Person] = []
    try:
        # 1. The instructor logs in and releases the lesson with the formgrader's Release button.
        step("start")
        teacher = Person(browser, hub, instructor, users.passwords[instructor], shots, "instructor")
        people.append(teacher)
        teacher.page.goto(f"{teacher.base}/formgrader")
        row = teacher.page.locator("tr", has_text=LESSON)
        row.locator("td.release a").click()
        expect(row.locator("td.status")).to_have_text("released")
        teacher.shot("1-released")
        step("released")
        outbound = hub.exchange / COURSE_ID / "outbound" / LESSON / f"{LESSON}.ipynb"
        assert outbound.is_file(), f"the Release button put nothing in the exchange ({outbound})"
        teacher.page.goto(f"{teacher.base}/lab")  # JupyterLab polls the server: the culler sees it in use

        # Only one hub of the course at a time: the running JupyterHub holds make hub's lock on the exchange.
        lock = os.open(hub.exchange / f".{COURSE_ID}.hub-lock", os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert os.pread(lock, 4096, 0).decode().startswith(f"instructor {instructor}, port {hub.port}, pid ")
        finally:
            os.close(lock)

        # cas logs in, saves a file and leaves: the idle culler stops her server, and her file stays. Her account's
        # home is gone when she first logs in (a department's account before pam_mkhomedir): the hub makes it, hers.
        sys.path.insert(0, str(ROOT / "hub"))
        from spawner import home_mode  # hub/spawner.py: the mode `useradd -m` gives a home here

        shutil.rmtree(users.home(cas))
        leaving = Person(browser, hub, cas, users.passwords[cas], shots, "learner-idle")
        made = users.home(cas).stat()
        assert (made.st_uid, made.st_mode & 0o777) == (pwd.getpwnam(cas).pw_uid, home_mode()), made
        assert f"made {cas}'s missing home {users.home(cas)}" in hub.output(), hub.output()[-3000:]
        notes = users.home(cas) / "notes.txt"
        assert run_as(cas, "sh", "-c", f"echo 'my ring notes' > {notes}").returncode == 0
        leaving.close()
        step(f"{cas} left")

        # 2. Two learners fetch, answer, run ranks, validate and submit; ann submits twice.
        learner_a = Person(browser, hub, ann, users.passwords[ann], shots, "learner-correct")
        people.append(learner_a)
        learner_round(learner_a, users, solutions, [], submit_first=True)
        out = learner_a.ranks_output
        for rank in range(3):
            assert re.search(rf"rank {rank}:\s+tensor\(\[ ?0\., +6\., +12\.", out), out
        assert "Success! Your notebook passes all the tests." in learner_a.validated, learner_a.validated

        learner_b = Person(browser, hub, ben, users.passwords[ben], shots, "learner-deadlock")
        people.append(learner_b)
        learner_round(learner_b, users, {**solutions, EXERCISES[3]: RING_ANSWERS["receive_first"]}, [DELETED_TEST])
        report = learner_b.ranks_errors
        assert "DeadlockError" in report and re.search(r"rank \d waits in recv\(src=\d\)", report), report
        assert "deadlock" in learner_b.self_check.lower(), learner_b.self_check
        # Validate runs the self-checks (autograder/learner/validate.py): the deadlock fails it, with the
        # self-check's own message naming the waiting rank, found by the ranks' 10 s limit (grading's), not by
        # the cell's.
        failed = learner_b.validated
        assert "The following cell failed" in failed and 'exercise("4.4").self_check(ring_allreduce)' in failed, failed
        assert re.search(r"rank \d waits in recv\(src=\d\)", failed) and "CellTimeoutError" not in failed, failed
        assert not re.search(r'exercise\("4\.[123]"\)\.self_check', failed), "a correct answer's self-check failed"

        inbound = hub.exchange / COURSE_ID / "inbound"
        mine = {who: sorted(p.name for p in inbound.iterdir() if p.name.startswith(f"{who}+{LESSON}+"))
                for who in (ann, ben)}
        assert len(mine[ann]) == 2 and len(mine[ben]) == 1, mine  # nbgrader keeps every submission

        # 3. The instructor collects and grades (`make collect`'s command, as the instructor's Unix user).
        env = {"PATH": f"{hub_python().parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(users.home(instructor)),
               "LANG": "C.UTF-8", "COURSE_ROOT": str(course), "COURSE_EXCHANGE": str(hub.exchange)}
        if os.environ.get("COURSE_REQUIRE_SANDBOX"):
            env["COURSE_REQUIRE_SANDBOX"] = os.environ["COURSE_REQUIRE_SANDBOX"]
        graded = run_as(instructor, str(hub_python()), "-m", "autograder", "collect", LESSON, "--jobs", "2",
                        env=env, cwd=course, timeout=400)
        step("graded")
        assert graded.returncode == 0, graded.stdout[-4000:] + graded.stderr[-4000:]
        assert f"Collected 2 submissions of {LESSON}" in graded.stdout, graded.stdout
        record = json.loads((course / "autograder" / "grading-run.json").read_text())
        assert record["sandbox"] is True and {r["student"] for r in record["submissions"]} == {ann, ben}, record
        scores = {row["student_id"]: float(row["score"])
                  for row in csv.DictReader((course / "autograder" / "grades.csv").open())}
        assert scores[ann] == float(row_max(course)) and scores[ben] < scores[ann], scores
        # ann's later submission was graded (the first was the untouched notebook, worth 0): full marks above.
        # ben's deleted test cell was put back and graded.
        autograded = json.loads((course / "autograder" / "autograded" / ben / LESSON / f"{LESSON}.ipynb").read_text())
        assert any(c["metadata"].get("nbgrader", {}).get("grade_id") == DELETED_TEST for c in autograded["cells"])

        # The formgrader's Collect button puts submissions where nbgrader's collect did: `make grade` grades that
        # folder in place (here nothing is left to grade, and nothing of it is lost).
        again = run_as(instructor, str(hub_python()), "-m", "autograder", "grade", "autograder/submitted",
                       "--only-ungraded", "--jobs", "1", env=env, cwd=course, timeout=300)
        assert again.returncode == 0 and "2 submissions already graded" in again.stdout, again.stdout + again.stderr

        # The formgrader's Autograde button grades one submission through the course's grading (sandbox, clean
        # re-grade: autograder/grading/formgrader.py), not with nbgrader's plain autograde in the server.
        teacher.page.goto(f"{teacher.base}/formgrader/manage_submissions/{LESSON}")
        teacher.page.locator("tr", has_text=ben).locator("td.autograde a").click()
        modal = teacher.page.locator("#success-modal, #error-modal")
        expect(modal).to_be_visible(timeout=300 * SECONDS)
        said = modal.inner_text()
        assert f"Successfully autograded '{LESSON}' for student '{ben}'" in said and "sandbox" in said, said[-3000:]
        teacher.shot("5-autograde-button")
        step("autograde button")
        record = json.loads((course / "autograder" / "grading-run.json").read_text())
        assert record["sandbox"] is True and [r["student"] for r in record["submissions"]] == [ben], record
        assert record["submissions"][0]["score"] == scores[ben], record["submissions"][0]
        teacher.page.goto(f"{teacher.base}/lab")
        for who in (ann, ben):
            assert (course / "autograder" / "submitted" / who / LESSON / f"{LESSON}.ipynb").is_file()
            assert (course / "autograder" / "submitted" / who / LESSON / "submission_secret.txt").is_file()

        # ... then releases the feedback with the formgrader's button.
        teacher.page.goto(f"{teacher.base}/formgrader")
        row = teacher.page.locator("tr", has_text=LESSON)
        expect(row.locator("td.num-submissions")).to_have_text("2")
        row.locator("td.release-feedback a").click()
        released = hub.exchange / COURSE_ID / "feedback"
        assert wait_until(lambda: len(list(released.glob("*.html"))) == 2, 60, interval=0.5), list(released.iterdir())
        teacher.shot("6-feedback-released")
        step("feedback released")

        # 4. Each learner fetches the feedback and reads each part's verdict.
        verdicts = {learner_a: "passed \\({p} of {p} points?\\)", learner_b: "0 of {p} points?"}
        for person in (learner_a, learner_b):
            panel = person.assignments()
            item = panel.locator("#submitted_assignments_list .list_item", has_text=LESSON).first
            item.get_by_role("button", name="Fetch Feedback").click()
            expect(panel.locator("#submitted_assignments_list", has_text="view feedback")).to_be_visible()
            person.shot("7-feedback-fetched")
            pages = sorted((users.home(person.name) / LESSON / "feedback").glob(f"*/{LESSON}.html"))
            assert pages, f"{person.name} fetched no feedback"
            person.page.goto(f"{person.base}/files/{LESSON}/feedback/{pages[-1].parent.name}/{LESSON}.html")
            text = person.page.locator("body").inner_text()
            person.page.get_by_text('Exercise 4.4, part "correct"').first.scroll_into_view_if_needed()
            person.shot("8-feedback")
            for part, points in PARTS_44.items():
                verdict = f'Exercise 4\\.4, part "{part}": ' + verdicts[person].format(p=points)
                assert re.search(verdict, text), f"{person.name}'s feedback lacks the verdict /{verdict}/"
            shown = [words for words in ("HIDDEN TESTS", "autograder.hidden", 'grade("4.4"') if words in text]
            assert not shown, f"{person.name}'s feedback shows the hidden tests' source: {shown}"
        text = learner_b.page.locator("body").inner_text()
        assert "deadlocked" in text and re.search(r"rank \d waits in recv", text), "the feedback does not say who waited"

        # 5. The formgrader's Manage Students page shows both scores.
        teacher.page.goto(f"{teacher.base}/formgrader/manage_students")
        table = teacher.page.get_by_role("grid")
        for who in (ann, ben):
            expect(table.locator("tr", has_text=who)).to_contain_text(f"{scores[who]:g}")
        # ... named from their accounts: ann's full name, ben's login name (his account has none); never "None".
        first, last = FULL_NAME.split()
        expect(table.locator("tr", has_text=ann).locator("td.name")).to_have_text(f"{last}, {first}")
        expect(table.locator("tr", has_text=ben).locator("td.name")).to_have_text(re.compile(rf"^{ben},\s*$"))
        teacher.shot("9-gradebook")
        step("gradebook")

        # 6. Nobody reads what is not theirs.
        secret = {
            "the other learner's home (fetched lesson, nbgrader's cache)": lambda other: users.home(other),
            "the other learner's fetched notebook": lambda other: fetched_notebook(users, other),
            "the exchange's inbound listing": lambda other: inbound,
            "the exchange's feedback listing": lambda other: released,
            "the instructor's course folder": lambda other: course,
            "the gradebook": lambda other: course / "autograder" / "gradebook.db",
            "the other learner's collected submission": lambda other: (
                course / "autograder" / "submitted" / other / LESSON / f"{LESSON}.ipynb"),
            "the solutions": lambda other: course / "solutions" / LESSON / f"{LESSON}.ipynb",
            "the hub's database": lambda other: hub.state / "jupyterhub.sqlite",
            "the hub's cookie secret": lambda other: hub.state / "jupyterhub_cookie_secret",
        }
        for who, other in ((ann, ben), (ben, ann)):
            paths = {what: str(where(other)) for what, where in secret.items()}
            tried = run_as(who, str(hub_python()), "-c", TRY_READ, *paths.values())
            results = json.loads(tried.stdout)
            readable = [what for what, path in paths.items() if results[path] == "read"]
            assert not readable, f"{who} could read {readable}"

        # 7. cas's server, idle since she left, was stopped by the idle culler; her file is where she left it.
        for person in (teacher, learner_a):
            person.page.goto(f"{person.base}/lab")
            person.no_news()
        assert wait_until(lambda: not users.processes(cas), IDLE_TIMEOUT + 120, interval=2), \
            f"{cas}'s server still runs, idle, {IDLE_TIMEOUT} s past the culler's limit: {users.processes(cas)}"
        assert f"Culling server {cas}" in hub.output(), hub.output()[-3000:]
        assert notes.read_text() == "my ring notes\n"
        assert users.processes(ann) and users.processes(instructor), "servers in use were culled"
    finally:
        for person in people:
            person.close()


def row_max(course: Path) -> float:
    """The lesson's maximum score, from the exported grades."""
    rows = list(csv.DictReader((course / "autograder" / "grades.csv").open()))
    return float(rows[0]["max_score"])


# --------------------------------------------------------------------------- `make hub` refusing bad input


def _make_hub(*settings: str, user: str | None = None) -> subprocess.CompletedProcess:
    command = ["make", "--no-print-directory", "hub", *settings]
    if user is not None:
        command = ["runuser", "-u", user, "--", *command]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_make_hub_refuses_a_taken_port_and_a_missing_instructor(hub_world):
    """Does `make hub` stop with what happened, the values and the next step, when its port is taken or the
    instructor is not a Unix user, before it changes anything?"""
    hub = hub_world["hub"]
    taken = _make_hub(f"HUB_PORT={hub.port}", f"HUB_INSTRUCTOR={hub_world['instructor']}",
                      f"HUB_COURSE={hub_world['course']}", f"HUB_STATE={hub_world['work'] / 'state2'}")
    assert taken.returncode != 0
    assert f"port {hub.port} on 127.0.0.1 is taken" in taken.stderr and f"HUB_PORT={hub.port + 1}" in taken.stderr, \
        taken.stderr
    nobody = _make_hub("HUB_INSTRUCTOR=no-such-teacher-here", f"HUB_COURSE={hub_world['course']}",
                       f"HUB_STATE={hub_world['work'] / 'state2'}")
    assert nobody.returncode != 0
    assert "'no-such-teacher-here' is not a Unix user" in nobody.stderr and "useradd -m no-such-teacher-here" in \
        nobody.stderr, nobody.stderr
    assert not (hub_world["work"] / "state2").exists(), "a refused `make hub` still prepared its folder"
