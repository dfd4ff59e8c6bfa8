"""Bad input on the hub route, without starting a hub: the course's own code paths, run for real.

- a learner who submits while the instructor collects: a real ``nbgrader submit`` paused half-way
  through writing the notebook into the exchange, and ``make collect``'s collect run meanwhile
  (autograder/grading/inbound.py);
- two collects of one course at once (autograder/grading/onegrader.py);
- the exchange folder deleted under the hub: what ``make collect`` and ``make hub``'s start-up say;
- a learner whose Unix account has no home folder (hub/spawner.py's ``ensure_home``, real users);
- a second hub of the same course (hub/serve.py's lock, held across the exec into JupyterHub).

The whole hub round trip (tests/test_hub.py) runs through the same code; this module costs
seconds: a few nbgrader processes, no hub, no browser.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from conftest import proc_state, wait_until

pytest.importorskip("jupyterhub", reason="JupyterHub is not installed: run `make venv` (it is in the hub extra)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))

import serve  # noqa: E402 - hub/serve.py
from spawner import HomeUnusable, ensure_home, home_mode  # noqa: E402 - hub/spawner.py

from autograder.grading.onegrader import grading_lock  # noqa: E402
from autograder.notebooks.generate import tool_env  # noqa: E402
from autograder.paths import ROOT  # noqa: E402

LESSON = "04-ring-all-reduce"
COURSE_ID = "distributed-pytorch"
NOTEBOOK = ROOT / "course" / LESSON / f"{LESSON}.ipynb"
#: A learner's real `nbgrader submit`, which stops itself (SIGSTOP) after writing half of the notebook into the
#: exchange's inbound folder, as a submit is when a collect comes in the middle; SIGCONT lets it finish.
PAUSED_SUBMIT = r"""
import os, shutil, signal, sys
real_copytree = shutil.copytree

def copy_half_then_pause(src, dst, **kwargs):
    if "inbound" in str(dst) and str(dst).endswith(".ipynb"):
        data = open(src, "rb").read()
        with open(dst, "wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
            out.write(data[len(data) // 2:])
        shutil.copystat(src, dst)
        return dst
    return shutil.copy2(src, dst, **kwargs)

shutil.copytree = lambda src, dst, **kw: real_copytree(src, dst, copy_function=copy_half_then_pause, **kw)
from nbgrader.apps.nbgraderapp import main
sys.argv = ["nbgrader", "submit", sys.argv[1], "--Exchange.root=" + sys.argv[2],
            "--CourseDirectory.course_id=" + sys.argv[3]]
main()
"""
COLLECT = "from autograder.grading.exchange import collect_from_exchange; collect_from_exchange({lesson!r})"


@pytest.fixture
def course(tmp_path):
    """A throw-away course folder (lesson 04 only) and an exchange where lesson 04 was released."""
    root = tmp_path / "course"
    (root / "solutions").mkdir(parents=True)
    (root / "autograder").mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions" / LESSON, root / "solutions" / LESSON)
    exchange = tmp_path / "exchange"
    (exchange / COURSE_ID / "inbound").mkdir(parents=True)
    (exchange / COURSE_ID / "outbound" / LESSON).mkdir(parents=True)
    shutil.copy(NOTEBOOK, exchange / COURSE_ID / "outbound" / LESSON)
    return root, exchange


def _collect(root: Path, exchange: Path, *argv: str) -> subprocess.CompletedProcess:
    """`make collect`'s collect (or, with argv, `python -m autograder ...`) on ``root`` from ``exchange``."""
    command = [sys.executable, *(["-m", "autograder", *argv] if argv else ["-c", COLLECT.format(lesson=LESSON)])]
    env = {**tool_env(), "COURSE_ROOT": str(root), "COURSE_EXCHANGE": str(exchange)}
    env.pop("COURSE_NGSHARE_URL", None)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_collect_leaves_a_submission_still_being_written(course, tmp_path):
    """Does `make collect` leave a half-written submission in the exchange, saying so, and take it whole next time?"""
    root, exchange = course
    learner = pwd.getpwuid(os.geteuid()).pw_name  # nbgrader's submit names the submission after its Unix user
    home = tmp_path / "learner"
    (home / LESSON).mkdir(parents=True)
    shutil.copy(NOTEBOOK, home / LESSON)
    env = {**tool_env(), "HOME": str(home)}
    submit = subprocess.Popen([sys.executable, "-c", PAUSED_SUBMIT, LESSON, str(exchange), COURSE_ID], cwd=home,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(lambda: proc_state(submit.pid) == "T" or submit.poll() is not None, 60), \
            "the submit never reached the notebook's copy"
        assert submit.poll() is None, f"the submit ended before it paused: {submit.communicate()[0]}"
        [partial] = (exchange / COURSE_ID / "inbound").iterdir()
        written = (partial / f"{LESSON}.ipynb").stat().st_size
        assert 0 < written < NOTEBOOK.stat().st_size and not (partial / "submission_secret.txt").exists()
        during = _collect(root, exchange)
        assert during.returncode == 0, during.stderr
        said = during.stdout + during.stderr
        assert f"{learner}'s submission of {LESSON}" in said and "is not whole yet" in said, said
        assert f"{written} bytes so far" in said and "left in the exchange for the next collect" in said, said
        assert "Collected 0 submissions" in said and "Left for the next collect, still being written: 1" in said
        assert not (root / "autograder" / "submitted" / learner).exists(), "a half-written notebook was collected"
        assert partial.is_dir(), "the submission being written was removed from the exchange"
    finally:
        os.kill(submit.pid, signal.SIGCONT)
        out = submit.communicate(timeout=60)[0]
    assert submit.returncode == 0, f"the submit failed once let go on:\n{out}"
    after = _collect(root, exchange)
    assert after.returncode == 0, after.stderr
    assert "Collected 1 submission of" in after.stdout and "not whole" not in after.stdout + after.stderr
    got = root / "autograder" / "submitted" / learner / LESSON
    assert (got / f"{LESSON}.ipynb").read_bytes() == NOTEBOOK.read_bytes()
    assert (got / "submission_secret.txt").stat().st_size > 0 and (got / "timestamp.txt").is_file()
    json.loads((root / "autograder" / "exchange" / LESSON / learner / LESSON / f"{LESSON}.ipynb").read_text())


def test_second_collect_is_refused_naming_the_first(course):
    """While one collect holds the course's grading lock, does a second stop at once, naming the first?"""
    root, exchange = course
    with grading_lock(root / "autograder", "make collect LESSON=04-ring-all-reduce"):
        second = _collect(root, exchange, "collect", LESSON)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "another collect or grade of this course is running" in second.stderr, second.stderr
    assert f"pid {os.getpid()}" in second.stderr and "`make collect LESSON=04-ring-all-reduce` by" in second.stderr
    assert not (root / "autograder" / "gradebook.db").exists(), "the refused collect wrote the gradebook"
    assert (root / "autograder" / ".grading.lock").read_text() == "", "the lock kept its holder's line after the end"


def test_collect_says_the_exchange_is_gone(course, tmp_path):
    """With the exchange folder deleted, or emptied, does `make collect` say so and how to recover?"""
    root, exchange = course
    gone = _collect(root, tmp_path / "deleted", "collect", LESSON)
    assert gone.returncode == 2
    assert f"the exchange folder {tmp_path / 'deleted'} does not exist" in gone.stderr, gone.stderr
    assert f"mkdir -p {tmp_path / 'deleted'} && chmod 0777" in gone.stderr and "Submit again" in gone.stderr
    assert not (tmp_path / "deleted").exists(), "collect made the exchange itself, as the instructor"
    shutil.rmtree(exchange / COURSE_ID)
    emptied = _collect(root, exchange, "collect", LESSON)
    assert emptied.returncode == 2 and "holds no submissions folder for course" in emptied.stderr, emptied.stderr


def test_make_hub_makes_a_deleted_exchange_and_says_what_to_redo(capsys):
    """Does `make hub`'s start-up make a missing exchange with nbgrader's rights, and say what to release again?"""
    with tempfile.TemporaryDirectory(dir="/tmp") as place:  # pytest's own folder is closed to others: refused
        os.chmod(place, 0o755)
        exchange = Path(place) / "srv" / "exchange"
        serve.make_exchange(exchange)
        assert exchange.stat().st_mode & 0o777 == 0o777
        said = capsys.readouterr().out
        assert f"made the exchange folder {exchange}" in said and "release each lesson again" in said, said
        serve.make_exchange(exchange)
        assert "missing" not in capsys.readouterr().out, "an exchange that was there was reported as made"


def test_second_hub_of_a_course_is_refused_while_the_first_runs(tmp_path):
    """Is a second `make hub` on the same exchange refused, naming the first, for as long as the first hub lives,
    and a hub given two instructors refused?"""
    lock = tmp_path / ".distributed-pytorch.hub-lock"
    holder = ("import os, sys; sys.path.insert(0, sys.argv[1]); import serve; from pathlib import Path; "
              "serve.hold_hub_lock(Path(sys.argv[2]), 'teacher', 8000, Path('/srv/course'), 'the exchange'); "
              "os.execv('/bin/sleep', ['sleep', '60'])")
    first = subprocess.Popen([sys.executable, "-c", holder, str(serve.HUB), str(lock)])
    try:
        assert wait_until(lambda: first.poll() is not None or
                          os.readlink(f"/proc/{first.pid}/exe").endswith("sleep"), 30), "the first hub never started"
        with pytest.raises(SystemExit) as refused:
            serve.hold_hub_lock(lock, "ted", 8001, Path("/srv/other"), "the exchange")
        assert f"instructor teacher, port 8000, pid {first.pid}" in str(refused.value), refused.value
    finally:
        first.kill()
        first.wait()
    os.close(serve.hold_hub_lock(lock, "ted", 8001, Path("/srv/other"), "the exchange"))
    with pytest.raises(SystemExit) as two:
        serve.check_instructor("teacher,ted", ROOT)
    assert "names 2 people; the hub has one instructor" in str(two.value), two.value


@pytest.fixture
def users(tmp_path):
    """Makes Unix users without homes (``useradd -M``); removes them after."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("making Unix users needs root and useradd")
    made = []

    def make(home: Path) -> pwd.struct_passwd:
        name = f"i46{uuid.uuid4().hex[:8]}"
        subprocess.run(["useradd", "-M", "-d", str(home), name], check=True)
        made.append(name)
        return pwd.getpwnam(name)

    yield make
    for name in made:
        subprocess.run(["userdel", name], check=False)


def test_spawner_makes_a_missing_home_and_refuses_an_unusable_one(users, tmp_path):
    """Does the spawner make a learner's missing home theirs, with the machine's HOME_MODE (0700 when unset), and
    refuse a home that is not theirs, or on a folder that does not exist, changing nothing?"""
    (tmp_path / "homes").mkdir()
    ann = users(tmp_path / "homes" / "ann")
    said = ensure_home(ann.pw_name)
    home = os.stat(ann.pw_dir)
    assert (home.st_uid, home.st_gid, home.st_mode & 0o777) == (ann.pw_uid, ann.pw_gid, home_mode()), said
    assert "as pam_mkhomedir would" in said and ensure_home(ann.pw_name) == ""
    ben = users(Path(ann.pw_dir))  # ben's passwd entry names ann's home
    with pytest.raises(HomeUnusable) as theirs:
        ensure_home(ben.pw_name)
    assert f"belongs to {ann.pw_name}, not to {ben.pw_name}" in str(theirs.value)
    assert os.stat(ann.pw_dir).st_uid == ann.pw_uid, "ann's home was given away"
    cam = users(tmp_path / "unmounted" / "cam")
    with pytest.raises(HomeUnusable) as nowhere:
        ensure_home(cam.pw_name)
    assert "nothing was made" in str(nowhere.value) and not (tmp_path / "unmounted").exists()
