"""Grading on Dask: this machine's LocalCluster, a Dask cluster that loses a worker mid-run, SLURM's job script.

- A small class of lesson 00 (the cheapest lesson: about 5 s a submission) is graded with the
  instructor's command on a real ``dask scheduler`` with two ``dask worker`` processes on
  127.0.0.1, standing in for two machines, which share no folder with the course: one of them
  is killed (``kill -9``) as soon as it starts a submission. Every learner must be graded once,
  with the scores this machine's own grading gives the same answers (a Dask ``LocalCluster``,
  the default: tests/test_grading_parallel.py grades them so, one at a time and all at once).
- The engine's own count of tries, on a real LocalCluster with a stand-in grading function
  (no nbgrader): a submission whose grading kills its worker process every time is marked
  failed after :data:`TRIES` tries with the reason; one whose grading fails once is graded on
  its second try; none is lost or graded twice.
- Ctrl-C stops a run, keeps what was merged and names the rest; ``--only-ungraded`` grades those.
- A worker that cannot start the sandbox refuses, with the install line.
- The SLURM job script dask-jobqueue would submit asks for the resources given.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autograder.notebooks.generate import tool_env
from autograder.grading.engine import TOPIC, died, run
from autograder.grading.slurm import Slurm
from autograder.grading.task import TRIES, Graded, Task
from devtools.scratch import run_instructor_command, sandbox_flags
from test_grading_failures import SOLUTION, _class

LESSON = "00-getting-started"
WRONG = 'def hello(rank, world_size):\n    return "hello"\n'
LEARNERS = {"ana": SOLUTION, "bo": WRONG, "cy": None}  # the right answer, a wrong one, the untouched stub
SCORES = {"ana": 1.0, "bo": 0.0, "cy": 0.0}
DASK = Path(sys.executable).with_name("dask")


def _record(root: Path) -> dict:
    return json.loads((root / "autograder" / "grading-run.json").read_text())


def _scores(record: dict) -> dict[str, float]:
    return {r["student"]: r["score"] for r in record["submissions"]}


class _Processes:
    """A dask scheduler and workers started by a test, ended by pid when it is over."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.started = folder, []
        folder.mkdir(parents=True, exist_ok=True)

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.folder / f"{args[0]}-{len(self.started)}.log").open("w")
        process = subprocess.Popen([str(DASK), *args], cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
        self.started.append(process)
        return process

    def scheduler(self) -> str:
        address_file = self.folder / "scheduler.json"
        self.start("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                   "--scheduler-file", str(address_file))
        for _ in range(600):
            if address_file.is_file() and address_file.stat().st_size:
                return json.loads(address_file.read_text())["address"]
            time.sleep(0.1)
        raise AssertionError(f"the dask scheduler did not start: {self._logs()}")

    def worker(self, address: str, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        # No nanny: killing this process is a machine going away, nothing starts it again.
        return self.start("worker", address, "--nthreads", "1", "--no-nanny", "--name", name, "--no-dashboard",
                          env=env)

    def _logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(self.folder.glob("*.log")))

    def stop(self) -> None:
        for process in reversed(self.started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def dask_processes(tmp_path):
    processes = _Processes(tmp_path / "dask")
    yield processes
    processes.stop()


def _workers_by_name(client, names: set[str]) -> dict[str, str]:
    for _ in range(600):
        found = {w["name"]: address for address, w in client.scheduler_info()["workers"].items()}
        if names <= set(found):
            return {name: found[name] for name in names}
        time.sleep(0.1)
    raise AssertionError(f"workers {names} did not join the scheduler (joined: {found})")


@pytest.mark.slow
def test_a_cluster_that_loses_a_worker_mid_run_grades_every_learner_once_with_the_local_scores(tmp_path,
                                                                                              dask_processes):
    """On a dask scheduler and two workers one of which is killed as soon as it starts a submission: is every
    learner graded exactly once, with the scores this machine's own grading gives them (tests/test_grading_parallel.py
    grades the same answers locally, serially and in parallel), the killed worker's submission on a second try
    elsewhere with the reason kept?"""
    from distributed import Client

    address = dask_processes.scheduler()
    victim_process = dask_processes.worker(address, "victim")
    dask_processes.worker(address, "survivor")
    remote = _class(tmp_path / "remote", LEARNERS)
    with Client(address, timeout="30s") as watcher:
        workers = _workers_by_name(watcher, {"victim", "survivor"})
        result: list[subprocess.CompletedProcess] = []
        grading = threading.Thread(target=lambda: result.append(run_instructor_command(
            remote, "grade", str(tmp_path / "remote" / "submissions"), "--scheduler", address)))
        grading.start()
        killed = None
        while killed is None and grading.is_alive():
            starts = [msg for _, msg in watcher.get_events(TOPIC)]
            killed = next((msg for msg in starts if msg["worker"] == workers["victim"]), None)
            time.sleep(0.05)
        assert killed is not None, "the victim worker never started a submission"
        os.kill(victim_process.pid, signal.SIGKILL)  # in the middle of grading killed["submission"]
        grading.join(timeout=900)
    assert result and result[0].returncode == 0, (result[0].stdout[-3000:] + result[0].stderr[-3000:]) if result else ""
    record = _record(remote)
    runs = {r["student"]: r for r in record["submissions"]}
    assert sorted(r["student"] for r in record["submissions"]) == sorted(LEARNERS), record["submissions"]
    assert _scores(record) == SCORES, record
    victim_learner = killed["submission"].split("/")[0]
    again = runs[victim_learner]
    assert again["tries"] == 2 and again["worker"].startswith(workers["survivor"]), again
    assert again["retried_because"] == [died(1, workers["victim"])], again
    assert all(r["tries"] == 1 and r["status"] == "ok" for who, r in runs.items() if who != victim_learner), runs
    assert "try 2" in (remote / again["log"]).read_text()
    assert record["workers"] == f"the Dask cluster at {address}" and record["jobs"] >= 1, record
    assert f"Grading {len(LEARNERS)} submissions, on the Dask cluster at {address}" in result[0].stdout
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{remote / 'autograder' / 'gradebook.db'}") as gb:
        assert sorted(s.student.id for s in gb.assignment_submissions(LESSON)) == sorted(LEARNERS)
    assert (remote / "autograder" / "feedback" / victim_learner / LESSON / f"{LESSON}.html").is_file()


def test_a_worker_that_cannot_sandbox_refuses_with_the_install_line(tmp_path, dask_processes):
    """Does a cluster whose worker has no bubblewrap stop the run before grading, naming the worker and saying
    how to install it?"""
    address = dask_processes.scheduler()
    dask_processes.worker(address, "no-bwrap", env={"COURSE_BWRAP": str(tmp_path / "no-such-bwrap")})
    root = _class(tmp_path, {"ana": SOLUTION})
    env = {**tool_env(), "COURSE_ROOT": str(root)}
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "submissions"),
                           "--scheduler", address], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "These Dask workers must not grade" in done.stderr and "cannot sandbox learners' code" in done.stderr
    assert "sudo apt-get install bubblewrap" in done.stderr and "--no-sandbox" in done.stderr, done.stderr
    assert "autograded" not in done.stdout, done.stdout[-3000:]


# -- the engine's tries, with a stand-in for grading ---------------------------------------------


def stand_in(task: Task) -> Graded:
    """Grading as the engine sees it: "poison" kills its worker process every time (a second in, as a notebook
    that fills the worker's memory would), "flaky" fails once."""
    if task.student == "poison":
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    graded = Graded(task.student, task.lesson, attempt=task.attempt, status="ok", log="== stand-in\n")
    if task.student == "flaky" and task.attempt == 1:
        graded.status, graded.failure, graded.error = "failed", "infrastructure", "the kernel did not start"
    return graded


@pytest.mark.slow
@pytest.mark.parametrize("allowed_failures", [TRIES, 0], ids=["scheduler-retries", "course-resubmits"])
def test_tries_are_counted_across_dead_workers_and_nothing_is_lost_or_doubled(allowed_failures):
    """On a real LocalCluster: is a submission that kills its worker every time failed after TRIES tries with
    the reason, one that fails once graded on its second try, and every other graded once? Both when the
    scheduler runs a task again after its worker died, and when it gives up at once (the course resubmits)."""
    import dask
    from distributed import Client, LocalCluster

    tasks = [Task(who, LESSON, {}, {}) for who in ("ana", "poison", "flaky", "bo", "cy")]
    finals: list[tuple[Graded, list[str]]] = []
    retries: list[Graded] = []
    with dask.config.set({"distributed.scheduler.allowed-failures": allowed_failures}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
    try:
        with Client(cluster) as client:
            left = run(client, tasks, "test-run", on_final=lambda g, why: finals.append((g, why)),
                       on_retry=retries.append, grade=stand_in)
    finally:
        cluster.close()
    assert left == []
    by = {g.student: (g, why) for g, why in finals}
    assert sorted(g.student for g, _ in finals) == sorted(t.student for t in tasks), finals  # each once
    poison, why = by["poison"]
    assert (poison.status, poison.failure, poison.attempt) == ("failed", "infrastructure", TRIES), poison
    assert "died" in poison.error and len(why) == TRIES - 1 and all("died" in w for w in why), (poison, why)
    flaky, why = by["flaky"]
    assert (flaky.status, flaky.attempt, why) == ("ok", 2, ["the kernel did not start"])
    # The scheduler runs a task again when its worker dies; when it gives up at once, the course resubmits.
    assert sorted(g.student for g in retries) == (["flaky"] if allowed_failures else ["flaky", "poison"])
    assert all(by[who][0].attempt == 1 and by[who][0].status == "ok" for who in ("ana", "bo", "cy")), by


@pytest.mark.slow
def test_a_retry_queued_behind_a_submission_that_kills_its_worker_is_not_charged_a_try():
    """On one worker with one thread: "flaky" fails its first try and its second waits behind "poison", which
    then kills the worker, taking the unstarted second try with it. Is "flaky" graded on its second try, with
    its own first failure as the only reason, rather than charged a try its submission never began?"""
    import dask
    from distributed import Client, LocalCluster

    tasks = [Task(who, LESSON, {}, {}) for who in ("flaky", "poison")]
    finals: list[tuple[Graded, list[str]]] = []
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
    try:
        with Client(cluster) as client:
            left = run(client, tasks, "bystander", on_final=lambda g, why: finals.append((g, why)),
                       on_retry=lambda g: None, grade=stand_in)
    finally:
        cluster.close()
    assert left == []
    by = {g.student: (g, why) for g, why in finals}
    assert sorted(by) == ["flaky", "poison"], finals
    assert by["flaky"][0].status == "ok" and by["flaky"][0].attempt == 2, by["flaky"]
    assert by["flaky"][1] == ["the kernel did not start"], by["flaky"]
    assert (by["poison"][0].failure, by["poison"][0].attempt) == ("infrastructure", TRIES), by["poison"]


# -- Ctrl-C ---------------------------------------------------------------------------------------


class _InterruptedClient:
    """A Dask client whose ``method`` raises KeyboardInterrupt on its ``nth`` call, as a Ctrl-C arriving
    right then would; everything else goes to the real client."""

    def __init__(self, client, method: str, nth: int) -> None:
        self._client, self._method, self._left = client, method, nth

    def __getattr__(self, name: str):
        real = getattr(self._client, name)
        if name != self._method:
            return real

        def call(*args, **kwargs):
            self._left -= 1
            if self._left == 0:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        return call


@pytest.mark.parametrize("where, nth", [("submit", 3), ("get_events", 1), ("on_final", 1)],
                         ids=["handing-one-to-a-worker", "reading-a-result", "merging"])
def test_a_ctrl_c_at_any_point_names_every_submission_not_finished(where, nth):
    """Whether the Ctrl-C comes while a submission is handed to a worker (no longer waiting, not yet running),
    while a result is read, or while one is merged: is every submission not finished returned as left, once,
    and every finished one not?"""
    from distributed import Client, LocalCluster

    tasks = [Task(who, LESSON, {}, {}) for who in ("ana", "bo", "cy", "dee")]
    finals: list[str] = []

    def on_final(graded: Graded, why: list[str]) -> None:
        if where == "on_final":
            raise KeyboardInterrupt
        finals.append(graded.student)

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
    try:
        with Client(cluster) as client:
            proxy = client if where == "on_final" else _InterruptedClient(client, where, nth)
            left = run(proxy, tasks, "test-ctrl-c", on_final=on_final, on_retry=lambda g: None, grade=stand_in)
    finally:
        cluster.close()
    assert sorted(finals + [t.student for t in left]) == ["ana", "bo", "cy", "dee"], (finals, left)
    assert len(left) >= 2, left  # at least the two it had not handed out yet


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_merged_and_only_ungraded_grades_the_rest(tmp_path):
    """Does Ctrl-C (SIGINT to the command's process group, as a terminal sends it) stop the run with what was
    merged kept and the rest named, and does the same command with --only-ungraded grade only the rest?"""
    root = _class(tmp_path, LEARNERS)
    env = {**tool_env(), "COURSE_ROOT": str(root)}
    command = [sys.executable, "-m", "autograder", "grade", str(tmp_path / "submissions"), "--jobs", "1",
               *sandbox_flags()]
    # A shell gives the command it runs in the foreground Ctrl-C as it comes; one that runs these tests in the
    # background passes SIGINT on ignored, and so would every process started here. As the terminal would:
    in_the_foreground = [sys.executable, "-c", "import runpy, signal, sys; signal.signal(signal.SIGINT, "
                         "signal.default_int_handler); sys.argv[0] = 'autograder'; runpy.run_module('autograder', "
                         "run_name='__main__', alter_sys=True)", *command[3:]]
    process = subprocess.Popen(in_the_foreground, cwd=root, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.strip().startswith("autograded "):
            os.killpg(process.pid, signal.SIGINT)
            break
    out = "".join(lines) + process.stdout.read()
    assert process.wait(timeout=300) == 130, out[-3000:]
    record = _record(root)
    graded = [r["student"] for r in record["submissions"]]
    assert len(graded) >= 1 and sorted(graded + [n.split("/")[0] for n in record["not_graded"]]) == sorted(LEARNERS)
    assert "Stopped before" in out and "--only-ungraded" in out, out[-3000:]
    done = subprocess.run([*command, "--only-ungraded"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"Grading {len(record['not_graded'])} submission" in done.stdout, done.stdout[-3000:]
    assert _scores(_record(root)) == SCORES


# -- SLURM ----------------------------------------------------------------------------------------


def test_the_slurm_job_script_asks_for_the_resources_given():
    """Does dask-jobqueue's job script ask SLURM for the jobs' cores, memory, time, partition and account, and run
    one single-threaded grading worker per core with this Python and the grading workers' environment?"""
    settings = Slurm.parse("jobs=3,cores=4,memory=16GB,walltime=02:30:00,partition=short,account=cs101,"
                           "directive=--qos=normal")
    script = settings.job_script()
    lines = script.splitlines()
    for directive in ("#SBATCH -p short", "#SBATCH -A cs101", "#SBATCH --cpus-per-task=4", "#SBATCH --mem=15G",
                      "#SBATCH -t 02:30:00", "#SBATCH --qos=normal", "#SBATCH -J course-grading"):
        assert directive in lines, script
    assert "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False" in lines, script
    command = next(line for line in lines if "distributed.cli.dask_worker" in line)
    assert command.startswith(sys.executable) and "--nworkers 4" in command and "--nthreads 1" in command, command
    assert "--memory-limit 3.73GiB" in command, command  # 16 GB shared by 4 workers


def test_slurm_settings_and_the_dry_run_from_the_command_line(tmp_path):
    """Does `--slurm ... --dry-run` print the job script and grade nothing, and does a setting that is not one
    stop the command with the list of settings?"""
    env = {**tool_env(), "COURSE_ROOT": str(tmp_path)}
    base = [sys.executable, "-m", "autograder", "grade", str(tmp_path)]
    done = subprocess.run([*base, "--slurm", "jobs=2,cores=8,partition=gpu", "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "#SBATCH -p gpu" in done.stdout and "#SBATCH --cpus-per-task=8" in done.stdout, done.stdout
    assert "2 SLURM jobs of 8 cores" in done.stdout and not (tmp_path / "autograder").exists()
    done = subprocess.run([*base, "--slurm", "nodes=2"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "'nodes=2' is not a setting" in done.stderr and "walltime=" in done.stderr
    done = subprocess.run([*base, "--slurm", "--scheduler", "tcp://127.0.0.1:1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "give one of them" in done.stderr, done.stderr


# -- what travels with a task, and what a worker leaves behind -------------------------------------


def test_task_files_stay_in_their_folder_and_links_do_not_travel(tmp_path):
    """Are a task's files refused when they would leave their folder, and does a link a learner's kernel left in
    its folder (to a file of the grading machine) stay behind when the graded folder travels back?"""
    from autograder.grading.task import read_files, write_files

    with pytest.raises(ValueError, match="must stay inside"):
        write_files(tmp_path / "work", {"../escaped.txt": b"x"})
    assert not (tmp_path / "escaped.txt").exists()
    made = tmp_path / "made"
    write_files(made, {"nb.ipynb": b"{}", "sub/data.txt": b"1"})
    (made / "key").symlink_to(tmp_path / "secret")
    (tmp_path / "secret").write_text("instructor's key")
    (made / "linked-folder").symlink_to(tmp_path)
    assert read_files(made) == {"nb.ipynb": b"{}", "sub/data.txt": b"1"}


def test_work_folders_of_dead_grading_processes_are_swept(tmp_path):
    """Does a worker clear the work folders that a killed grading process left, and only those?"""
    from autograder.grading.workfolder import PREFIX, sweep

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"{PREFIX}{dead.pid}-abc"
    alive = tmp_path / f"{PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{PREFIX}not-a-pid"
    for folder in (left, alive, other):
        folder.mkdir()
    assert sweep(tmp_path) == [left]
    assert not left.exists() and alive.exists() and other.exists()


def test_a_worker_without_bubblewrap_refuses_a_sandboxed_task(monkeypatch):
    """Does grade_submission on a machine where bubblewrap cannot run refuse to grade (the grading machinery's
    failure, with the install line) instead of running the learner's code unsandboxed?"""
    from autograder.grading import sandbox
    from autograder.grading.submission import grade_submission

    monkeypatch.setattr(sandbox, "BWRAP", "no-such-bwrap-here")
    sandbox.problem.cache_clear()
    try:
        graded = grade_submission(Task("ana", LESSON, {}, {"00-getting-started.ipynb": b"{}"}))
    finally:
        sandbox.problem.cache_clear()
    assert (graded.status, graded.failure) == ("failed", "infrastructure"), graded
    assert "cannot sandbox learners' code" in graded.error and "apt-get install bubblewrap" in graded.error
    assert graded.files == {} and graded.gradebook == {}
