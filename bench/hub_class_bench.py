"""A class at once on the course's JupyterHub: N learners fetch lesson 04, run it and submit, then grading.

Run (as root; heavy: about 10 minutes and 20 GB for 30 learners on 2 cores)::

    make bench-class-hub [LEARNERS=30] [BROWSERS=3] [SPREAD=60] [JOBS=2]
    .venv/bin/python bench/hub_class_bench.py --learners 30 --browsers 3 --spread 60 --jobs 2 --json PATH

What it does, as tests/test_hub.py does it (real Unix users, `make hub` on a loopback port):

1. makes an instructor and N learners (Unix users in a group of their own, homes 0700, in a
   temporary folder), a course copy with lesson 04 owned by the instructor, and starts
   `make hub` (PAM logins, the course's spawner, the idle culler at the class's default hour);
2. the instructor releases lesson 04 (``nbgrader release_assignment``, what the formgrader's
   Release button runs);
3. the learners arrive within ``--spread`` seconds of each other. Each logs in with their Unix
   password and then, as an HTTP client driving the endpoints JupyterLab calls (bench/_hub_client.py):
   starts their server (the hub's REST API, as the spawn page does), fetches the lesson
   (nbgrader's assignment_list extension: ``POST /assignments/fetch``, the Assignments tab's Fetch),
   writes the instructor's answers into the fetched notebook's exercise cells and saves it (the
   contents API), opens it (the sessions API starts its kernel), runs every code cell over the
   kernel's websocket, saves the outputs, and submits (``POST /assignments/submit``). ``--browsers``
   of them do the same in Chromium instead, as tests/test_hub.py drives it: the login page, the
   Assignments tab's Fetch and Submit, Run > Run All Cells;
4. the instructor runs what `make collect` runs (nbgrader's collect, then `make grade` with
   ``--jobs``: the sandbox, the clean re-grade) and ``nbgrader release_feedback``; every learner
   fetches their feedback (``POST /assignments/fetch_feedback``; the browser learners with the
   tab's Fetch Feedback).

Measured, from /proc, every second (PSS every 5 s): RSS (and PSS) of the hub's whole process tree
(make, JupyterHub, the proxy, the culler, every server, kernel and rank) and of every process of
the users made, at its peak, and the CPU time of all of them; the slowest and median learner's
time for each step (spawn, fetch, run, submit); collect and grade times. Asserted: nothing lost
(N submissions collected, N graded with the instructor's answers' full marks, N feedbacks fetched
by their learners). Everything it made is removed at the end, failure or not (the hub's process
group, every process of its users, the users, their group, the folder). When the machine's
available memory falls under ``--min-free-gb`` the run stops early, cleans up and says so.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from _common import machine_line, parse_args, save_json, say  # noqa: E402
from _hub_client import BrowserLearner, HttpLearner, Watch, summary  # noqa: E402

LESSON = "04-ring-all-reduce"


def instructor_env(users, instructor: str, course: Path, hub, python: Path) -> dict[str, str]:
    """The environment the instructor's terminal on the hub has (hub/jupyterhub_config.py), for their commands."""
    env = {"PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(users.home(instructor)),
           "LANG": "C.UTF-8", "COURSE_ROOT": str(course), "COURSE_EXCHANGE": str(hub.exchange)}
    if os.environ.get("COURSE_REQUIRE_SANDBOX"):
        env["COURSE_REQUIRE_SANDBOX"] = os.environ["COURSE_REQUIRE_SANDBOX"]
    return env


def timed_command(user: str, command: list[str], env: dict[str, str], cwd: Path, marker: str,
                  timeout: float) -> tuple[int, str, float, float | None]:
    """``command`` as ``user``: exit status, output, seconds in all, and seconds until ``marker`` was printed."""
    started, marked, lines = time.monotonic(), None, []
    proc = subprocess.Popen(["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                             *command], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if marked is None and marker in line:
                marked = time.monotonic() - started
        proc.wait()
    finally:
        timer.cancel()
    return proc.returncode, "".join(lines), time.monotonic() - started, marked


def run_class(args, users, hub, instructor: str, learners: list[str], course: Path, watch: Watch) -> dict:
    """Release, the class's round, collect and grade, feedback: the figures, and what was lost."""
    from test_hub import EXERCISES, hub_python, run_as
    from devtools.scratch import solution_source

    python = hub_python()
    env = instructor_env(users, instructor, course, hub, python)
    released = run_as(instructor, "env", "-i", *(f"{k}={v}" for k, v in env.items()), str(python), "-m", "nbgrader",
                      "release_assignment", LESSON, cwd=course)
    assert released.returncode == 0, f"release_assignment failed:\n{released.stdout}{released.stderr}"
    say(f"released {LESSON}")
    answers = {gid: solution_source(LESSON, gid) for gid in EXERCISES}  # the instructor's, as hand_in writes them
    n = len(learners)
    in_browser = {round(k * n / args.browsers) for k in range(args.browsers)} if args.browsers else set()
    people = [(BrowserLearner if i in in_browser else HttpLearner)(
        name, users.passwords[name], hub.url, LESSON, answers, users.home(name), python, watch)
        for i, name in enumerate(learners)]
    try:
        return class_round(args, people, instructor, env, course, python, watch)
    finally:
        for person in people:
            person.close()


def class_round(args, people, instructor: str, env: dict[str, str], course: Path, python: Path, watch: Watch) -> dict:
    """The learners' round (arrivals spread over ``args.spread`` s), collect and grade, feedback; the figures."""
    from test_hub import run_as

    gap = args.spread / max(1, len(people) - 1) if len(people) > 1 else 0
    watch.phase("class")
    threads = [threading.Thread(target=person.round_trip, args=(i * gap,), daemon=True)
               for i, person in enumerate(people)]
    class_started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    class_wall = time.monotonic() - class_started
    failed = {p.name: p.error for p in people if p.error}
    say(f"the class's round took {class_wall:.0f} s; {len(people) - len(failed)} of {len(people)} learners submitted")
    if watch.stopped:
        raise SystemExit(f"stopped early: {watch.stopped}")

    watch.phase("collect and grade")
    status, output, total, collected_at = timed_command(
        instructor, [str(python), "-m", "autograder", "collect", LESSON, "--jobs", str(args.jobs)], env, course,
        "Collected ", timeout=3600)
    say(output[-1500:])
    assert status == 0 and collected_at is not None, f"`make collect` failed ({status}):\n{output[-4000:]}"
    collect_s, grade_s = collected_at, total - collected_at
    rows = list(csv.DictReader((course / "autograder" / "grades.csv").open()))
    scores = {r["student_id"]: (float(r["score"]), float(r["max_score"])) for r in rows if r.get("assignment", LESSON) == LESSON}

    watch.phase("feedback")
    fed = run_as(instructor, "env", "-i", *(f"{k}={v}" for k, v in env.items()), str(python), "-m", "nbgrader",
                 "release_feedback", LESSON, cwd=course)
    assert fed.returncode == 0, f"release_feedback failed:\n{fed.stdout}{fed.stderr}"
    threads = [threading.Thread(target=person.fetch_feedback, daemon=True) for person in people if not person.error]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    watch.phase("done")

    submitted = sorted(p.name for p in people if "submit" in p.times)
    collected = sorted(p.name for p in (course / "autograder" / "submitted").iterdir() if (p / LESSON).is_dir())
    full = sorted(who for who, (score, top) in scores.items() if score == top)
    feedback = sorted(p.name for p in people if p.feedback_pages)
    return {
        "learners": len(people), "browsers": sum(isinstance(p, BrowserLearner) for p in people),
        "spread_s": args.spread, "class_wall_s": round(class_wall, 1),
        "steps": summary(people), "per_learner": {p.name: {**p.times, "browser": isinstance(p, BrowserLearner),
                                                           "cell_errors": p.cell_errors} for p in people},
        "failed": failed, "collect_s": round(collect_s, 1), "grade_s": round(grade_s, 1), "jobs": args.jobs,
        "submitted": len(submitted), "collected": len(collected), "graded": len(scores),
        "full_marks": len(full), "max_score": next(iter(scores.values()))[1] if scores else None,
        "not_full_marks": {w: s for w, (s, top) in scores.items() if s != top},
        "feedback_fetched": len(feedback), "cell_errors": sum(len(p.cell_errors) for p in people),
        "open_lesson_pss_mb": summary_of([p.open_pss_mb for p in people if p.open_pss_mb is not None]),
    }


def summary_of(values: list[float]) -> dict:
    return {"median": statistics.median(values), "max": max(values), "n": len(values)} if values else {}


def report(result: dict, watch: dict) -> None:
    n = result["learners"]
    print(machine_line())
    print(f"{n} learners ({result['browsers']} in Chromium, {n - result['browsers']} over HTTP) arriving within "
          f"{result['spread_s']:g} s: the class's round took {result['class_wall_s']} s")
    print("step      slowest   median  (seconds)")
    for step, figures in result["steps"].items():
        print(f"{step:<8} {figures['max']:8.1f} {figures['median']:8.1f}")
    peak = watch["class"]
    print(f"peak while the class ran: RSS {peak['rss_peak_mb']} MB (hub, proxy and culler {peak['hub_rss_mb']} MB; "
          f"servers {peak['servers_rss_mb']} MB; kernels and ranks {peak['kernels_rss_mb']} MB), PSS "
          f"{peak['pss_peak_mb']} MB, the machine's used memory up {peak['used_rise_mb']} MB; "
          f"{peak['processes_peak']} processes")
    print(f"CPU while the class ran: {peak['cpu_s']} s in {peak['wall_s']} s ({peak['busy_mean']} cores busy on "
          f"average; the whole machine, others' work and the learners' clients included, {peak['machine_busy_mean']} "
          f"cores on average and {peak['machine_busy_peak_5s']} over its busiest 5 s)")
    held = result["open_lesson_pss_mb"]
    if held:
        print(f"a learner with the lesson run and still open (server, kernel, rank factory): PSS {held['median']} MB "
              f"median, {held['max']} MB at most; the learners then closed it (Close and Shut Down Notebook)")
    grading = watch["collect and grade"]
    print(f"collect {result['collect_s']} s, grade {result['grade_s']} s (--jobs {result['jobs']}; "
          f"the machine {grading['machine_busy_mean']} cores busy on average, others' work included; peak PSS of the "
          f"hub and the users' processes, grading's included, {grading['pss_peak_mb']} MB)")
    print(f"nothing lost: {result['submitted']} submitted, {result['collected']} collected, {result['graded']} graded, "
          f"{result['full_marks']} with full marks ({result['max_score']}), {result['feedback_fetched']} feedbacks "
          f"fetched; {result['cell_errors']} cells raised")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=30)
    parser.add_argument("--browsers", type=int, default=3, help="how many of the learners use Chromium")
    parser.add_argument("--spread", type=float, default=60.0, help="seconds between the first and last arrival")
    parser.add_argument("--jobs", type=int, default=2, help="grading workers (`make collect JOBS=`)")
    parser.add_argument("--min-free-gb", type=float, default=2.5,
                        help="stop early when the machine's available memory falls below this")
    args = parse_args(parser, argv, at_least=[("learners", 1), ("jobs", 1)])
    args.browsers = min(args.browsers, args.learners)

    import test_hub
    from test_hub import Hub, Users
    from devtools.scratch import course_copy

    missing = test_hub._missing()
    if missing:
        print(f"bench-class-hub cannot run here: {missing}", file=sys.stderr)
        return 2
    # The class's own idle limit (the default of `make hub`): nobody's server is culled while the class grades.
    test_hub.IDLE_TIMEOUT = 3600
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    work = Path(tempfile.mkdtemp(prefix="course-hub-class-"))
    work.chmod(0o755)
    (work / "homes").mkdir(mode=0o755)
    users, hub, watch, result, problems = Users(work / "homes"), None, None, None, []
    try:
        users.add_group()
        instructor = users.add("i", learner=False)
        say(f"making {args.learners} learners")
        learners = [users.add(f"l{i:02d}", learner=True) for i in range(1, args.learners + 1)]
        course = course_copy(work / "course", lessons=[LESSON])
        subprocess.run(["chown", "-R", f"{instructor}:", str(course)], check=True)
        say("starting `make hub`")
        hub = Hub(users, instructor, course, work)
        watch = Watch(hub.proc.pid, users, args.min_free_gb)
        watch.start()
        result = run_class(args, users, hub, instructor, learners, course, watch)
    finally:
        if watch is not None:
            watch.stop()
        ended = hub.stop(users) if hub is not None else True
        left = users.processes()
        problems = users.remove()
        shutil.rmtree(work, ignore_errors=True)
        say(f"cleaned up: hub ended {ended}, processes left {left}, problems {problems}")
    phases = watch.figures()
    report(result, phases)
    if args.json:
        save_json(args.json, {"machine": machine_line(), "lesson": LESSON, **result, "resources": phases})
    lost = [f"{what} {result[what]} of {result['learners']}" for what in
            ("submitted", "collected", "graded", "full_marks", "feedback_fetched") if result[what] != result["learners"]]
    if lost or result["failed"] or not ended or left or problems:
        print(f"FAIL: {'; '.join(lost)} {result['failed'] or ''} {'' if ended else 'the hub outlived its stop'} "
              f"{left or ''} {problems or ''}".strip())
        return 1
    print("PASS: nothing lost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
