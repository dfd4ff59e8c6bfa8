"""Start the course's JupyterHub on this machine: what `make hub` runs (as root).

    sudo make hub [HUB_PORT=8000] [HUB_INSTRUCTOR=teacher] [HUB_GROUP=course-learners]
                  [HUB_COURSE=/path/to/this/repository] [HUB_EXCHANGE=/srv/nbgrader/exchange]
                  [HUB_IDLE_TIMEOUT=3600] [EXCHANGE=folder|ngshare]

It checks what the hub needs and stops with the next step when something is missing, prepares
the folders, then replaces itself with ``jupyterhub -f hub/jupyterhub_config.py`` (Ctrl-C or
SIGTERM stops the hub and every user's server). Steps:

1. checks: run as root; the proxy installed (the Makefile installs configurable-http-proxy with
   npm into hub/.proxy/); the port free on 127.0.0.1; the instructor a Unix user who owns the
   course folder; the learners' Unix group (made when missing); the course's venv usable by
   any user (a learner's server runs it);
2. closes the course folder to other users (``chmod -R o-rwx``, except the venvs and hub/):
   learners log in on this machine and must not read the solutions, the hidden tests or the
   gradebook;
3. the exchange folder, writable by everyone (nbgrader's shared-folder exchange); or, with
   ``EXCHANGE=ngshare``, nbgrader's exchange over HTTP: ngshare as a hub service, and every server's
   nbgrader configured for it (hub/ngshare_service.py), for hubs whose servers share one Unix user;
4. the hub's own folder (``HUB_STATE``, default hub/run/, readable by root only) with the
   learner release (``python -m autograder release``: the helpers and the self-checks, no
   answers) and the nbgrader and Jupyter settings of learners and of the instructor.

A server idle for ``HUB_IDLE_TIMEOUT`` seconds (an hour; 0: never) is stopped by
jupyterhub-idle-culler, run by the hub as a service; the learner's files stay in their home.
"""

from __future__ import annotations

import argparse
import fcntl
import grp
import importlib.util
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

HUB = Path(__file__).resolve().parent
REPO = HUB.parent
VENV_BIN = Path(sys.executable).parent  # not resolved: the venv's own bin folder
DEFAULT_PROXY = HUB / ".proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
#: Learners must not see nbgrader's instructor tools.
LEARNER_SERVER_EXTENSIONS_OFF = ("nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list")
#: JupyterLab's announcements plugin asks every new user "Would you like to get notified about official
#: Jupyter news?" and checks PyPI for updates: neither is for a class. Off in everyone's server.
EVERYONE_LAB_PLUGINS_OFF = ("@jupyterlab/apputils-extension:announcements",)
LEARNER_LAB_PLUGINS_OFF = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:course-list",
                           "@jupyter/nbgrader:create-assignment", *EVERYONE_LAB_PLUGINS_OFF)
#: The instructor's server: the formgrader's Autograde buttons grade through the course's grading.
INSTRUCTOR_SERVER_EXTENSIONS_ON = ("autograder.grading.formgrader",)
#: Entries of the course folder that stay open to other users: the venv (every server runs it; the
#: one this runs in is added) and hub/ (this file, the config, and the learners' release in hub/run/).
OPEN_ENTRIES = (".venv", "hub")


class HubError(SystemExit):
    """A check failed: the message says what, the values involved, and the next step."""

    def __init__(self, message: str) -> None:
        super().__init__(f"make hub: {message}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise HubError(f"port {port} on 127.0.0.1 is taken ({exc.strerror}); another hub or server is there. "
                           f"Stop it, or choose another port: `make hub HUB_PORT={port + 1}`.") from None


def as_user(user: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *command], capture_output=True, text=True)


def check_instructor(name: str, course: Path) -> pwd.struct_passwd:
    if not name:
        raise HubError("no instructor given: name the Unix user who teaches, e.g. `make hub HUB_INSTRUCTOR=teacher` "
                       "(make one with `useradd -m teacher && passwd teacher`; the course folder must be theirs).")
    names = re.split(r"[\s,;:]+", name.strip())
    if len(names) > 1:
        raise HubError(f"HUB_INSTRUCTOR={name!r} names {len(names)} people; the hub has one instructor, the Unix user "
                       f"who owns the course folder and grades it (one gradebook, one collect at a time). Choose one, "
                       f"e.g. `make hub HUB_INSTRUCTOR={names[0]}`; a co-teacher works in that instructor's account "
                       "or takes turns (docs/instructors.md, \"One instructor per course\").")
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise HubError(f"the instructor {name!r} is not a Unix user here. Make one: `useradd -m {name} && passwd {name}`, "
                       f"then `chown -R {name}: {course}`.") from None
    if user.pw_uid == 0:
        raise HubError("the instructor must not be root: JupyterHub would run their server, and learners' grading, "
                       "as root. Make a user: `useradd -m teacher && passwd teacher`, `chown -R teacher: "
                       f"{course}`, then `make hub HUB_INSTRUCTOR=teacher`.")
    for needed in (course / "nbgrader_config.py", course / "solutions"):
        if not needed.exists():
            raise HubError(f"{course} is not a course folder (it has no {needed.name}): set HUB_COURSE to this "
                           "repository, or a clone of it.")
    work = course / "autograder" if (course / "autograder").is_dir() else course  # grading makes it when missing
    if as_user(name, "test", "-w", str(work)).returncode != 0:
        owner = pwd.getpwuid(course.stat().st_uid).pw_name
        raise HubError(f"the instructor {name!r} cannot write {work} (the course folder belongs to "
                       f"{owner!r}): grading writes the gradebook there. Run `chown -R {name}: {course}` or give "
                       "HUB_INSTRUCTOR the folder's owner.")
    return user


def check_group(name: str) -> None:
    try:
        grp.getgrnam(name)
    except KeyError:
        subprocess.run(["groupadd", name], check=True)
        print(f"make hub: made the Unix group {name!r} for the learners (add one: `useradd -m -G {name} NAME`).")


def check_venv_for_everyone() -> None:
    """A learner's server runs the course's venv: every user must be able to start it and import torch and nbgrader."""
    probe = as_user("nobody", str(VENV_BIN / "python"), "-c", "import torch, nbgrader, jupyterhub")
    if probe.returncode != 0:
        real = Path(os.path.realpath(VENV_BIN / "python"))
        blocked = sorted({str(p) for p in [VENV_BIN, *VENV_BIN.parents, *real.parents]
                          if not os.stat(p).st_mode & stat.S_IXOTH})
        raise HubError(f"other users cannot run the course's venv {VENV_BIN.parent} (tried as `nobody`: "
                       f"{probe.stderr.strip().splitlines()[-1:] or probe.returncode}). Folders closed to others: "
                       f"{', '.join(blocked) or 'none; some files are unreadable'}. Open them with `chmod o+x` on "
                       f"those folders and `chmod -R o+rX {VENV_BIN.parent}`, or let `make hub` build a venv "
                       "from a Python all can run: `make hub HUB_VENV=.venv-hub HUB_PYTHON=/usr/bin/python3`.")


def close_course(course: Path) -> None:
    """Learners must not read the course folder: other users may only pass through it to the venv and hub/."""
    course.chmod(stat.S_IMODE(course.stat().st_mode) & ~0o007 | stat.S_IXOTH)
    open_entries = set(OPEN_ENTRIES)
    if VENV_BIN.parent.is_relative_to(course):  # the venv every server runs, e.g. .venv-hub
        open_entries.add(VENV_BIN.parent.relative_to(course).parts[0])
    closed = sorted(p for p in course.iterdir() if p.name not in open_entries)
    if closed:
        subprocess.run(["chmod", "-R", "o-rwx", *map(str, closed)], check=True)
    print(f"make hub: {course} is closed to other users (chmod o-rwx on everything but .venv and hub/): learners log "
          "in to this machine and must not read solutions, hidden tests or grades.")


def make_exchange(path: Path) -> None:
    if not path.is_dir():
        path.mkdir(parents=True)
        print(f"make hub: made the exchange folder {path} (mode 0777, as nbgrader's exchange needs); it was missing: "
              "a first start, or it was deleted. If it was deleted, release each lesson again (the formgrader's "
              "Release button) and ask the learners who submitted since your last `make collect` to press Submit "
              "again: their work and a copy of each submission are in their homes.")
    if stat.S_IMODE(path.stat().st_mode) != 0o777:
        path.chmod(0o777)  # nbgrader's shared-folder exchange: everyone writes, nbgrader sets each part's rights
    for parent in path.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise HubError(f"learners cannot reach the exchange {path}: {parent} is closed to other users. "
                           f"Choose another place (HUB_EXCHANGE=/srv/nbgrader/exchange) or `chmod o+x {parent}`.")


def hold_hub_lock(path: Path, instructor: str, port: int, course: Path, exchange: str) -> int:
    """One hub per course and exchange: an exclusive flock on ``path``, kept by JupyterHub after the exec.

    A second ``make hub`` of the same course on the same exchange (a second instructor's clone, or
    the same one on another port) stops here, naming the first hub's instructor, port and pid; the
    kernel drops the lock when that hub ends, however it ends. Returns the lock's descriptor.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "details not written"
        os.close(fd)
        raise HubError(
            f"a hub already serves this course on {exchange} ({holder}). A second hub would release, collect and "
            "return feedback in the same place, each unaware of the other. One hub per course: grade on that hub (in its "
            "instructor's server), or stop it first (Ctrl-C in its terminal, or "
            "`kill PID` with the pid above) and start this one; or give this hub its own exchange "
            "(HUB_EXCHANGE=/srv/nbgrader/exchange-2) so the two classes stay apart.") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"instructor {instructor}, port {port}, pid {os.getpid()}, course folder {course}, since "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}".encode(), 0)
    os.set_inheritable(fd, True)  # the exec below keeps it: the lock lives as long as the hub
    return fd


def course_id(course: Path) -> str:
    found = re.search(r'course_id\s*=\s*"([^"]+)"', (course / "nbgrader_config.py").read_text())
    if not found:
        raise HubError(f"{course / 'nbgrader_config.py'} sets no CourseDirectory.course_id")
    return found.group(1)


def prepare_state(state: Path, course: Path, exchange: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o711)  # others pass through to the learner folders; the hub's database and secret stay root's
    database = state / "jupyterhub.sqlite"
    database.touch(mode=0o600)  # SQLite keeps the file's mode (and gives its journal the same)
    database.chmod(0o600)
    release = state / "learner-course"
    env = {k: v for k, v in os.environ.items() if k != "COURSE_ROOT"}  # the learner release of this repository
    built = subprocess.run([sys.executable, "-m", "autograder", "release", "--allow-colab-placeholder", str(release)],
                           cwd=REPO, env=env, capture_output=True, text=True)
    if built.returncode != 0:
        raise HubError(f"building the learner release into {release} failed:\n{built.stdout}{built.stderr}")
    Path(f"{release}.tar.gz").unlink(missing_ok=True)
    subprocess.run(["chmod", "-R", "a+rX", str(release)], check=True)
    cid = course_id(course)
    learner = state / "learner-config"
    (learner / "labconfig").mkdir(parents=True, exist_ok=True)
    limits = (release / "nbgrader_config.py").read_text().split("c = get_config()", 1)[1]
    (learner / "nbgrader_config.py").write_text(
        '"""nbgrader for a learner on the course hub (written by hub/serve.py): the exchange, the course, '
        'Validate\'s limits."""\n\nc = get_config()  # noqa: F821\n'
        f"c.Exchange.root = {str(exchange)!r}\nc.CourseDirectory.course_id = {cid!r}\n{limits}")
    (learner / "jupyter_server_config.json").write_text(
        '{"ServerApp": {"jpserver_extensions": {' + ", ".join(f'"{e}": false' for e in LEARNER_SERVER_EXTENSIONS_OFF)
        + "}}}\n")
    _page_config(learner, LEARNER_LAB_PLUGINS_OFF)
    instructor = state / "instructor-config"
    _page_config(instructor, EVERYONE_LAB_PLUGINS_OFF)
    (instructor / "jupyter_server_config.json").write_text(
        '{"ServerApp": {"jpserver_extensions": {' + ", ".join(f'"{e}": true' for e in INSTRUCTOR_SERVER_EXTENSIONS_ON)
        + "}}}\n")
    (instructor / "nbgrader_config.py").write_text(
        '"""nbgrader for the instructor on the course hub (written by hub/serve.py): the course folder\'s own '
        'settings, wherever a command starts."""\n\nc = get_config()  # noqa: F821\n'
        f"load_subconfig({str(course / 'nbgrader_config.py')!r})  # noqa: F821\n"
        f"c.Exchange.root = {str(exchange)!r}\n")
    for folder in (learner, instructor):
        subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)


def _page_config(folder: Path, plugins_off: tuple[str, ...]) -> None:
    """JupyterLab's page settings for the servers that read ``folder``: ``plugins_off`` disabled."""
    (folder / "labconfig").mkdir(parents=True, exist_ok=True)
    (folder / "labconfig" / "page_config.json").write_text(
        '{"disabledExtensions": {' + ", ".join(f'"{p}": true' for p in plugins_off) + "}}\n")


def check_idle_culler(timeout: int) -> None:
    if timeout < 0:
        raise HubError(f"HUB_IDLE_TIMEOUT={timeout}: give the seconds a server may stay idle (3600), or 0 for never.")
    if timeout and importlib.util.find_spec("jupyterhub_idle_culler") is None:
        raise HubError(f"jupyterhub-idle-culler is not installed in {VENV_BIN.parent} (it stops idle servers): run "
                       "`make venv` (it is in the hub extra), or `make hub HUB_IDLE_TIMEOUT=0` to keep idle servers.")


def check_ngshare() -> None:
    missing = [name for name in ("ngshare", "ngshare_exchange") if importlib.util.find_spec(name) is None]
    if missing:
        raise HubError(f"EXCHANGE=ngshare needs {' and '.join(missing)} in {VENV_BIN.parent}: `make hub EXCHANGE=ngshare` "
                       f"installs them (`{VENV_BIN / 'python'} -m pip install --no-deps ngshare==0.6.0 "
                       "ngshare-exchange==0.5.3`; --no-deps: ngshare-exchange asks for jupyter-core<4.11.2, which "
                       "JupyterLab 4 cannot run with, and works with jupyter_core 5).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--instructor", default="")
    parser.add_argument("--group", default="course-learners")
    parser.add_argument("--course", type=Path, default=REPO)
    parser.add_argument("--exchange", type=Path, default=Path("/srv/nbgrader/exchange"))
    parser.add_argument("--state", type=Path, default=HUB / "run")
    parser.add_argument("--proxy", type=Path, default=DEFAULT_PROXY)
    parser.add_argument("--idle-timeout", type=int, default=3600)
    parser.add_argument("--exchange-kind", choices=("folder", "ngshare"), default="folder")
    args = parser.parse_args(argv)
    course, exchange, state = args.course.resolve(), args.exchange.resolve(), args.state.resolve()

    if os.geteuid() != 0:
        raise HubError(f"it must run as root (it runs as {pwd.getpwuid(os.geteuid()).pw_name!r}): the hub starts "
                       "each person's server as their own Unix user and checks passwords with PAM. Run `sudo make hub`.")
    if not args.proxy.exists():
        raise HubError(f"the proxy is not installed at {args.proxy}: run `make hub`, which installs "
                       "configurable-http-proxy there with npm (`apt-get install npm` if npm is missing).")
    check_port(args.port)
    check_idle_culler(args.idle_timeout)
    instructor = check_instructor(args.instructor, course)
    check_group(args.group)
    check_venv_for_everyone()
    close_course(course)
    ngshare_url = f"http://127.0.0.1:{args.port}/services/ngshare" if args.exchange_kind == "ngshare" else ""
    if ngshare_url:
        check_ngshare()
    else:
        make_exchange(exchange)
    lock = state / "hub.lock" if ngshare_url else exchange / f".{course_id(course)}.hub-lock"
    state.mkdir(parents=True, exist_ok=True)
    hold_hub_lock(lock, instructor.pw_name, args.port, course, ngshare_url or str(exchange))
    prepare_state(state, course, exchange)
    if ngshare_url:  # every server's nbgrader: the learners' settings here, the instructor's from COURSE_NGSHARE_URL
        with open(state / "learner-config" / "nbgrader_config.py", "a") as config:
            config.write(f"\nfrom autograder.learner.ngshare import use_ngshare  # noqa: E402\n\n"
                         f"use_ngshare(c, {ngshare_url!r})\n")

    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_HUB_")}
    env.update({
        "COURSE_HUB_STATE": str(state), "COURSE_HUB_COURSE": str(course), "COURSE_HUB_INSTRUCTOR": instructor.pw_name,
        "COURSE_HUB_GROUP": args.group, "COURSE_HUB_EXCHANGE": str(exchange), "COURSE_HUB_PORT": str(args.port),
        "COURSE_HUB_API_PORT": str(free_port()), "COURSE_HUB_PROXY_API_PORT": str(free_port()),
        "COURSE_HUB_PROXY": str(args.proxy.resolve()), "COURSE_HUB_IDLE_TIMEOUT": str(args.idle_timeout),
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
    })
    if ngshare_url:
        env.update({"COURSE_HUB_NGSHARE_URL": ngshare_url, "COURSE_HUB_NGSHARE_PORT": str(free_port()),
                    "COURSE_HUB_COURSE_ID": course_id(course)})
    where = f"exchange {ngshare_url} (ngshare)" if ngshare_url else f"exchange {exchange}"
    idle = f"servers idle for {args.idle_timeout} s are stopped" if args.idle_timeout else "idle servers are kept"
    print(f"make hub: JupyterHub for course {course_id(course)!r} at http://127.0.0.1:{args.port}/ "
          f"(instructor {instructor.pw_name!r}, learners: the Unix group {args.group!r}, {where}, "
          f"hub files in {state}; {idle}). Add a learner: `useradd -m -G {args.group} NAME && passwd NAME`.", flush=True)
    os.chdir(state)
    command = [str(VENV_BIN / "jupyterhub"), "-f", str(HUB / "jupyterhub_config.py")]
    os.execve(command[0], command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
