"""`make hub EXCHANGE=ngshare`: nbgrader's exchange over HTTP, every person's nbgrader as one Unix user.

The Kubernetes case: every learner's server runs as the same Unix user, so Unix rights cannot keep
learners apart; only the hub token each server holds can. This module starts `make hub
EXCHANGE=ngshare` (ngshare and its roster as hub services, hub/ngshare_service.py) and runs a
lesson's round trip through nbgrader's own exchange classes (the ``nbgrader`` commands the
Assignments tab and the formgrader call), with each person's environment as the hub gives their
server (``JUPYTERHUB_USER``, a token with a server's scopes, the hub's nbgrader settings, a home of
their own) and every command run as one Unix user: the instructor's. (The learners also get Unix
accounts, unused, because the hub's PAM authenticator refuses to make a hub user without one; on
Kubernetes there are none.)

The same round trip also runs in Chromium, as tests/test_hub.py's does over the shared folder: the
instructor releases the lesson and its feedback with the formgrader's buttons, and one more learner fetches,
submits and fetches her feedback with the Assignments tab, each logged in to the hub, which starts their
servers (each as their own Unix user: the hub's spawner); every one of those requests goes from their
server's nbgrader to ngshare (ngshare-exchange, with the course's fixes). tests/test_hub.py alone runs the
lesson's cells and Validate in the browser: neither touches the exchange.

Release, fetch, submit, `python -m autograder collect` (nbgrader's collect from ngshare, then the
course's grading with the sandbox), release and fetch feedback; and what a learner must not do, tried
with their own token: collect, list or download submissions, release or remove a lesson, fetch
another learner's feedback (even with ``JUPYTERHUB_USER`` set to that learner's name), or submit
without a valid token and be told it worked.

Skipped, saying why, when not root or without npm, useradd or bubblewrap; with
``COURSE_REQUIRE_BROWSER=1`` (CI) those skips fail instead.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import no_browser, wait_until
from test_hub import (COURSE_ID, EXERCISES, LESSON, PARTS_44, PORT_TAKEN, SECONDS, TRY_READ, WRITE_ANSWERS, Hub,
                      Person, Users, fetched_notebook, hub_python, row_max, run_as)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

#: A server's token: what JupyterHub's "server" role gives $JUPYTERHUB_API_TOKEN in a user's server.
SERVER_SCOPES = ("users:activity!user", "access:servers!server={name}/")


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the ngshare hub test makes a Unix user and runs JupyterHub as root: run the suite as root (CI does)"
    for tool, how in (("npm", "apt-get install npm"), ("useradd", "apt-get install passwd"),
                      ("runuser", "apt-get install util-linux"), ("bwrap", "apt-get install bubblewrap")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: `{how}`"
    return None


class NgshareHub(Hub):
    """`make hub EXCHANGE=ngshare` in its own process group (test_hub.Hub's start, stop and log)."""

    def __init__(self, users: Users, instructor: str, course: Path, work: Path) -> None:  # noqa: super not called
        from helpers._runtime.spec import free_port

        self.exchange, self.state, self.log_path = work / "exchange", work / "state", work / "make-hub.log"
        for attempt in range(4):
            self.port = free_port()
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(
                    ["make", "--no-print-directory", "hub", "EXCHANGE=ngshare", f"HUB_PORT={self.port}",
                     f"HUB_INSTRUCTOR={instructor}", f"HUB_GROUP={users.group}", f"HUB_COURSE={course}",
                     f"HUB_EXCHANGE={self.exchange}", f"HUB_STATE={self.state}", "HUB_IDLE_TIMEOUT=0"],
                    cwd=Path(__file__).resolve().parents[1], stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
            self.url = f"http://127.0.0.1:{self.port}"
            if self._wait_up(300):
                return
            self.stop()
            if not any(words in self.output() for words in PORT_TAKEN) or attempt == 3:
                break
        raise AssertionError(f"`make hub EXCHANGE=ngshare` did not serve the login page:\n{self.output()[-4000:]}")


class People:
    """Hub users and their tokens; every command of theirs runs as the one Unix user ``unix``."""

    def __init__(self, hub: NgshareHub, unix: str, password: str, course: Path, work: Path) -> None:
        import requests

        self.hub, self.unix, self.course, self.work = hub, unix, course, work
        self.api, self.ngshare = f"{hub.url}/hub/api", f"{hub.url}/services/ngshare"
        login = requests.Session()  # the instructor (a hub admin) logs in with the Unix password, once
        login.get(f"{hub.url}/hub/login", timeout=30)
        xsrf = login.cookies.get("_xsrf", "")
        done = login.post(f"{hub.url}/hub/login", data={"username": unix, "password": password, "_xsrf": xsrf},
                          allow_redirects=False, timeout=60)
        assert done.status_code == 302, f"the instructor's login was refused: {done.status_code} {done.text[:300]}"
        made = login.post(f"{self.api}/users/{unix}/tokens", json={"note": "test admin"},
                          headers={"X-XSRFToken": login.cookies.get("_xsrf", xsrf)}, timeout=30)
        assert made.status_code == 201, made.text
        self.admin = {"Authorization": f"token {made.json()['token']}"}
        self.tokens: dict[str, str] = {}

    def add(self, name: str, learner: bool = True) -> str:
        import requests

        if learner:
            made = requests.post(f"{self.api}/users/{name}", headers=self.admin, timeout=30)
            assert made.status_code in (201, 409), made.text
            home = self.work / "pods" / name
            home.mkdir(parents=True)
            shutil.chown(home, self.unix, self.unix)
        scopes = [s.format(name=name) for s in SERVER_SCOPES]
        made = requests.post(f"{self.api}/users/{name}/tokens", headers=self.admin, json={"scopes": scopes}, timeout=30)
        assert made.status_code == 201, made.text
        self.tokens[name] = made.json()["token"]
        return name

    def home(self, name: str) -> Path:
        return self.course if name == self.unix else self.work / "pods" / name

    def env(self, name: str, **changes: str) -> dict[str, str]:
        """What the hub's config gives this person's server (hub/jupyterhub_config.py's _environment)."""
        state, venv_bin = self.hub.state, hub_python().parent
        base = {"PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "JUPYTERHUB_USER": name,
                "JUPYTERHUB_API_TOKEN": self.tokens[name], "JUPYTERHUB_API_URL": self.api}
        if name == self.unix:
            base.update({"HOME": str(self.work / "homes" / name), "COURSE_ROOT": str(self.course),
                         "VENV": str(venv_bin.parent), "JUPYTER_CONFIG_PATH": str(state / "instructor-config"),
                         "COURSE_NGSHARE_URL": self.ngshare})
            if os.environ.get("COURSE_REQUIRE_SANDBOX"):
                base["COURSE_REQUIRE_SANDBOX"] = os.environ["COURSE_REQUIRE_SANDBOX"]
        else:
            base.update({"HOME": str(self.home(name)), "PYTHONPATH": str(state / "learner-course"),
                         "JUPYTER_CONFIG_PATH": str(state / "learner-config")})
        return {**base, **changes}

    def nbgrader(self, name: str, *args: str, **changes: str) -> subprocess.CompletedProcess:
        return run_as(self.unix, str(hub_python()), "-m", "nbgrader", *args, env=self.env(name, **changes),
                      cwd=self.home(name), timeout=300)

    def http(self, name: str, method: str, path: str, **kwargs):
        import requests

        return requests.request(method, f"{self.ngshare}/{path}", timeout=30,
                                headers={"Authorization": f"token {self.tokens[name]}"}, **kwargs)


@pytest.fixture(scope="module")
def ngshare_world():
    reason = _missing()
    if reason:
        no_browser(reason)
    from devtools.scratch import course_copy

    work = Path(tempfile.mkdtemp(prefix="course-hub-ngshare-"))
    work.chmod(0o755)
    (work / "homes").mkdir(mode=0o755)
    users = Users(work / "homes")
    hub = None
    try:
        users.add_group()
        unix = users.add("i", learner=False)  # the instructor, and the one Unix user every server runs as
        course = course_copy(work / "course", lessons=[LESSON])
        subprocess.run(["chown", "-R", f"{unix}:", str(course)], check=True)
        hub = NgshareHub(users, unix, course, work)
        people = People(hub, unix, users.passwords[unix], course, work)
        yield {"people": people, "users": users, "hub": hub, "course": course, "unix": unix, "work": work}
    finally:
        ended = hub.stop(users) if hub is not None else True
        problems = users.remove()
        shutil.rmtree(work, ignore_errors=True)
        assert ended, "the hub's process group was still there after SIGKILL"
        assert not problems, problems


def _out(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


def _said(done: subprocess.CompletedProcess) -> str:
    return f"rc {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_round_trip_over_ngshare_with_one_unix_user(ngshare_world, browser, shots):
    """With every server the same Unix user, does a lesson go out, come back from two learners, get graded by the
    course's grading and reach each learner as their own feedback, while no learner can collect, release, read
    another's submission or feedback, or submit without a valid token and be told it worked? And does a third
    learner's Assignments tab in Chromium fetch, submit and fetch her feedback over ngshare?"""
    from playwright.sync_api import expect

    from devtools.scratch import solution_source

    expect.set_options(timeout=60 * SECONDS)
    people, course, unix, hub = (ngshare_world[k] for k in ("people", "course", "unix", "hub"))
    teacher = people.add(unix, learner=False)
    users = ngshare_world["users"]
    ann, ben = people.add(users.add("a", learner=True)), people.add(users.add("b", learner=True))
    cyd = users.add("c", learner=True)  # the browser's learner: the hub makes her its user at her first login

    # The roster service enrols the hub's users in ngshare's course, the instructor teaching it.
    def enrolled() -> set[str]:
        listed = people.http(teacher, "GET", f"students/{COURSE_ID}")
        return {s["username"] for s in listed.json().get("students", [])} if listed.ok else set()
    assert wait_until(lambda: {ann, ben} <= enrolled(), 60, interval=0.5), (enrolled(), hub.output()[-3000:])

    # ngshare listens on loopback only, and keeps its files in the hub's state, which no server can read.
    service = re.search(r"Starting managed service ngshare at http://127\.0\.0\.1:(\d+)", hub.output())
    assert service, hub.output()[-3000:]
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{service.group(1)}"], capture_output=True, text=True).stdout
    assert listening.split() and all(line.split()[3].startswith("127.0.0.1:") for line in listening.splitlines()), \
        f"ngshare listens beyond loopback: {listening}"
    tried = json.loads(run_as(unix, str(hub_python()), "-c", TRY_READ, str(hub.state / "ngshare")).stdout)
    assert tried[str(hub.state / "ngshare")] == "PermissionError", tried

    # 1. The instructor releases the lesson with the formgrader's Release button: her server's nbgrader sends it to
    # ngshare.
    instructor = Person(browser, hub, unix, users.passwords[unix], shots, "ngshare-instructor")
    instructor.page.goto(f"{instructor.base}/formgrader")
    row = instructor.page.locator("tr", has_text=LESSON)
    row.locator("td.release a").click()
    expect(row.locator("td.status")).to_have_text("released")
    instructor.shot("1-released")
    lessons = people.http(teacher, "GET", f"assignments/{COURSE_ID}").json()
    assert lessons.get("assignments") == [LESSON], lessons

    # 2. Each learner fetches it, answers (ann: the instructor's answers; ben: nothing) and submits.
    stamps = {}
    for who, answers in ((ann, {gid: solution_source(LESSON, gid) for gid in EXERCISES}), (ben, {})):
        fetched = people.nbgrader(who, "fetch_assignment", LESSON)
        notebook = people.home(who) / LESSON / f"{LESSON}.ipynb"
        assert fetched.returncode == 0 and notebook.is_file(), _said(fetched)
        if answers:
            wrote = run_as(unix, str(hub_python()), "-c", WRITE_ANSWERS, str(notebook), json.dumps(answers), "[]")
            assert wrote.returncode == 0, _said(wrote)
        submitted = people.nbgrader(who, "submit", LESSON)
        stamp = re.search(rf"Submitted as: {COURSE_ID} {LESSON} (\S+ \S+)", _out(submitted))
        assert submitted.returncode == 0 and stamp, _said(submitted)
        stamps[who] = stamp.group(1)

    # cyd, in Chromium: her server (started by the hub at her login) fetches over ngshare, she answers, and her
    # Assignments tab's Submit sends the notebook to ngshare.
    solutions = {gid: solution_source(LESSON, gid) for gid in EXERCISES}
    learner_c = Person(browser, hub, cyd, users.passwords[cyd], shots, "ngshare-learner")
    try:
        assert wait_until(lambda: cyd in enrolled(), 60, interval=0.5), (enrolled(), hub.output()[-3000:])
        panel = learner_c.assignments()
        panel.locator("#released_assignments_list .list_item", has_text=LESSON).get_by_role("button", name="Fetch").click()
        fetched = panel.locator("#fetched_assignments_list .list_item", has_text=LESSON)
        expect(fetched.get_by_role("button", name="Submit")).to_be_visible()
        path = fetched_notebook(users, cyd)
        assert path.is_file(), f"the Assignments tab's Fetch gave {cyd} no {path}"
        wrote = run_as(cyd, str(hub_python()), "-c", WRITE_ANSWERS, str(path), json.dumps(solutions), "[]")
        assert wrote.returncode == 0, _said(wrote)
        panel = learner_c.assignments()
        panel.locator("#fetched_assignments_list .list_item", has_text=LESSON).get_by_role("button", name="Submit").click()
        expect(panel.locator("#submitted_assignments_list .list_item", has_text=LESSON)).to_have_count(1)
        learner_c.shot("1-submitted")
        listed = people.http(teacher, "GET", f"submissions/{COURSE_ID}/{LESSON}").json()
        assert cyd in {entry.get("student_id") for entry in listed.get("submissions", [])}, listed
    except BaseException:
        learner_c.close()
        raise

    # A submit that ngshare refuses (no valid token) fails and says it is not submitted (ngshare-exchange alone
    # logs "Failed to submit." and ends with success: autograder/learner/ngshare.py).
    refused = people.nbgrader(ann, "submit", LESSON, JUPYTERHUB_API_TOKEN="not-a-token")
    assert refused.returncode != 0 and "NOT submitted" in _out(refused), _said(refused)

    # 3. What a learner must not do, with her own token, through nbgrader and through ngshare's API.
    collect = people.nbgrader(ann, "collect", LESSON)
    assert collect.returncode != 0 and "Permission denied" in _out(collect), _said(collect)
    for method, path in (("GET", f"submissions/{COURSE_ID}/{LESSON}"),
                         ("GET", f"submission/{COURSE_ID}/{LESSON}/{ben}"),
                         ("POST", f"assignment/{COURSE_ID}/ann-lesson"),
                         ("DELETE", f"assignment/{COURSE_ID}/{LESSON}"), ("POST", f"students/{COURSE_ID}")):
        answer = people.http(ann, method, path, data={"files": "[]", "students": "[]"})
        assert answer.status_code == 403, (method, path, answer.status_code, answer.text[:300])
    own = people.home(ann) / "course" / "ann-lesson"  # her own "release" of a lesson, through nbgrader
    own.mkdir(parents=True)
    shutil.copy2(people.home(ann) / LESSON / f"{LESSON}.ipynb", own / "ann-lesson.ipynb")
    shutil.chown(own, unix, unix)
    people.nbgrader(ann, "release_assignment", "ann-lesson", "--CourseDirectory.release_directory=course")
    lessons = people.http(teacher, "GET", f"assignments/{COURSE_ID}").json()
    assert lessons.get("assignments") == [LESSON], lessons

    # 4. The instructor collects and grades: `make collect`'s command, nbgrader's collect from ngshare.
    graded = run_as(unix, str(hub_python()), "-m", "autograder", "collect", LESSON, "--jobs", "2",
                    env=people.env(teacher), cwd=course, timeout=400)
    assert graded.returncode == 0 and f"Collected 3 submissions of {LESSON}" in graded.stdout, _said(graded)
    grades = csv.DictReader((course / "autograder" / "grades.csv").open())
    scores = {row["student_id"]: float(row["score"]) for row in grades}
    assert scores[ann] == scores[cyd] == row_max(course) and scores[ben] < scores[ann], scores
    record = json.loads((course / "autograder" / "grading-run.json").read_text())
    assert record["sandbox"] is True, record

    # 5. ... and hands the feedback back with the formgrader's Release Feedback button.
    instructor.page.goto(f"{instructor.base}/formgrader")
    row = instructor.page.locator("tr", has_text=LESSON)
    expect(row.locator("td.num-submissions")).to_have_text("3")
    row.locator("td.release-feedback a").click()
    handed_in = people.http(teacher, "GET", f"submissions/{COURSE_ID}/{LESSON}").json()["submissions"]
    newest = {entry["student_id"]: entry["timestamp"] for entry in sorted(handed_in, key=lambda e: e["timestamp"])}
    assert set(newest) == {ann, ben, cyd}, handed_in

    def feedback_of(who: str) -> list:
        got = people.http(teacher, "GET", f"feedback/{COURSE_ID}/{LESSON}/{who}", params={"timestamp": newest[who]})
        return got.json().get("files", []) if got.ok else []
    assert wait_until(lambda: all(feedback_of(who) for who in newest), 120, interval=1), \
        {who: feedback_of(who) for who in newest}
    instructor.shot("2-feedback-released")
    instructor.close()

    # ben cannot have ann's feedback, not even by giving her name as his JUPYTERHUB_USER.
    theirs = people.http(ben, "GET", f"feedback/{COURSE_ID}/{LESSON}/{ann}", params={"timestamp": stamps[ann]})
    assert theirs.status_code == 403, theirs.text[:300]
    posing = people.nbgrader(ben, "fetch_feedback", LESSON, JUPYTERHUB_USER=ann)
    got = [p.name for p in (people.home(ben) / LESSON).rglob("*.html")]
    assert "Permission denied" in _out(posing) and not got, f"{got}\n{_said(posing)}"

    # 6. Each learner fetches their own feedback: each part's verdict, no hidden tests' source.
    verdicts = {ann: "passed \\({p} of {p} points?\\)", ben: "0 of {p} points?"}
    for who in (ann, ben):
        fetched = people.nbgrader(who, "fetch_feedback", LESSON)
        pages = sorted((people.home(who) / LESSON / "feedback").glob(f"*/{LESSON}.html"))
        assert fetched.returncode == 0 and len(pages) == 1, _said(fetched)
        text = html.unescape(re.sub(r"<[^>]+>", "", pages[0].read_text()))
        for part, points in PARTS_44.items():
            verdict = f'Exercise 4\\.4, part "{part}": ' + verdicts[who].format(p=points)
            assert re.search(verdict, text), f"{who}'s feedback lacks the verdict /{verdict}/"
        assert "HIDDEN TESTS" not in text, f"{who}'s feedback shows the hidden tests' source"

    # cyd fetches hers with the Assignments tab's Fetch Feedback and reads each part's verdict in the browser.
    try:
        panel = learner_c.assignments()
        item = panel.locator("#submitted_assignments_list .list_item", has_text=LESSON).first
        item.get_by_role("button", name="Fetch Feedback").click()
        expect(panel.locator("#submitted_assignments_list", has_text="view feedback")).to_be_visible()
        pages = sorted((users.home(cyd) / LESSON / "feedback").glob(f"*/{LESSON}.html"))
        assert len(pages) == 1, f"{cyd} fetched {pages}"
        learner_c.page.goto(f"{learner_c.base}/files/{LESSON}/feedback/{pages[0].parent.name}/{LESSON}.html")
        text = learner_c.page.locator("body").inner_text()
        learner_c.shot("2-feedback")
        for part, points in PARTS_44.items():
            verdict = f'Exercise 4\\.4, part "{part}": ' + verdicts[ann].format(p=points)
            assert re.search(verdict, text), f"{cyd}'s feedback lacks the verdict /{verdict}/"
        assert "HIDDEN TESTS" not in text, f"{cyd}'s feedback shows the hidden tests' source"
    finally:
        learner_c.close()
