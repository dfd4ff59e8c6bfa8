"""nbgrader's exchange over HTTP for `make hub EXCHANGE=ngshare`: ngshare as a hub service, and its roster.

On Kubernetes every learner's server runs as the same Unix user, so nbgrader's shared-folder exchange
(which tells learners apart by Unix rights) cannot keep them apart. ngshare (PyPI ``ngshare``) keeps
the exchange in a service of the hub instead and tells people apart by their hub API token; each
server's nbgrader talks to it through ``ngshare-exchange`` (autograder/learner/ngshare.py configures it).

Run by the hub (hub/jupyterhub_config.py adds both services when ``COURSE_HUB_NGSHARE_URL`` is set)::

    python hub/ngshare_service.py serve --database sqlite:///STATE/ngshare/ngshare.db --storage STATE/ngshare/files
    python hub/ngshare_service.py roster --course distributed-pytorch --instructor teacher

``serve`` runs ngshare 0.6.0 (the newest on PyPI, 2022) with two corrections the course owns:

- SQLAlchemy 2 no longer adds an object to the session because it was attached to an object that is
  in it ("cascade_backrefs", removed in 2.0). ngshare 0.6.0 makes a released assignment
  (``Assignment(assignment_id, course)``) and a submission (``Submission(self.user, assignment)``)
  that way and never adds them, so with SQLAlchemy 2 a release or a submission answers "success" and
  is not stored: the next fetch says "Assignment not found". ngshare fixed it upstream (LibreTexts/ngshare
  #170, ``self.db.add(...)``; no release since). Here a listener adds them when they are attached.
- ngshare listens on 0.0.0.0 ("must listen on all interfaces for proxy"); the course's hub listens on
  127.0.0.1 only, so the service does too.

``roster`` keeps ngshare's list of the course's students equal to the hub's users: ngshare refuses
anything to a user who is not on it. It creates the course (the instructor as its instructor) and,
every few seconds, enrols each hub user other than the instructor (a learner is a hub user as soon as
they first log in, before their server has started).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from urllib.parse import quote

SERVICE, ROSTER = "ngshare", "course-roster"
#: What `make hub EXCHANGE=ngshare` installs (with --no-deps: ngshare-exchange 0.5.3 declares
#: jupyter-core<4.11.2, which no jupyter_server 2 accepts; it runs with jupyter_core 5).
PACKAGES = ("ngshare==0.6.0", "ngshare-exchange==0.5.3")
ROSTER_EVERY = 3.0  # seconds between two looks at the hub's users


def hub_services(python: str, state: str, instructor: str, course_id: str, port: int) -> tuple[list, list]:
    """The hub's services and roles for ngshare and its roster (for hub/jupyterhub_config.py)."""
    here = os.path.abspath(__file__)
    folder = os.path.join(state, "ngshare")
    services = [
        {"name": SERVICE, "url": f"http://127.0.0.1:{port}",
         "command": [python, here, "serve", "--admins", ROSTER, "--database", f"sqlite:///{folder}/ngshare.db",
                     "--storage", f"{folder}/files/"]},
        {"name": ROSTER, "command": [python, here, "roster", "--course", course_id, "--instructor", instructor,
                                     "--ngshare", f"http://127.0.0.1:{port}/services/{SERVICE}"]},
    ]
    roles = [{"name": ROSTER, "scopes": ["list:users"], "services": [ROSTER]}]
    return services, roles


def patch_ngshare() -> None:
    """ngshare 0.6.0 made fit for SQLAlchemy 2 and for a loopback-only hub (the module docstring says why)."""
    from sqlalchemy import event
    from sqlalchemy.orm import configure_mappers, object_session
    from tornado.httpserver import HTTPServer
    from ngshare import ngshare as app
    from ngshare.database import database as db

    configure_mappers()  # the backref attributes (Assignment.course) exist once the mappers are configured

    def join_session(target, value, _old, _initiator):
        session = object_session(value) if value is not None else None
        if session is not None and object_session(target) is None:
            session.add(target)

    for attribute in (db.Assignment.course, db.Submission.assignment, db.Submission.student):
        event.listen(attribute, "set", join_session)

    class LoopbackServer(HTTPServer):
        def listen(self, port, address=None, **kwargs):
            return super().listen(port, "127.0.0.1", **kwargs)

    app.HTTPServer = LoopbackServer


def serve(argv: list[str]) -> None:
    patch_ngshare()
    from ngshare import ngshare as app

    os.makedirs(os.path.dirname(argv[argv.index("--storage") + 1].rstrip("/")), mode=0o700, exist_ok=True)
    app.main(argv)


def _call(method: str, url: str, token: str, data: dict | None = None) -> dict:
    import requests

    answer = requests.request(method, url, headers={"Authorization": f"token {token}"}, data=data, timeout=30)
    try:
        body = answer.json()
    except ValueError:
        body = {"success": False, "message": answer.text[:300]}
    if answer.status_code >= 400 and "success" not in body:
        answer.raise_for_status()
    return body


def _hub_users(hub_api: str, token: str, page: int = 200) -> set[str]:
    """Every user of the hub (its API gives them a page at a time)."""
    names: set[str] = set()
    while True:
        batch = _call("GET", f"{hub_api}/users?offset={len(names)}&limit={page}", token)
        names |= {u["name"] for u in batch if isinstance(u, dict)}
        if len(batch) < page:
            return names


def roster(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="ngshare_service.py roster")
    parser.add_argument("--course", required=True)
    parser.add_argument("--instructor", required=True)
    parser.add_argument("--ngshare", required=True)
    parser.add_argument("--every", type=float, default=ROSTER_EVERY)
    args = parser.parse_args(argv)
    token, hub_api = os.environ["JUPYTERHUB_API_TOKEN"], os.environ["JUPYTERHUB_API_URL"].rstrip("/")
    course = quote(args.course, safe="")
    enrolled: set[str] = set()
    while True:
        try:
            if not enrolled:
                known = _call("GET", f"{args.ngshare}/courses", token)
                if args.course not in known.get("courses", []):
                    made = _call("POST", f"{args.ngshare}/course/{course}", token,
                                 {"instructors": json.dumps([args.instructor])})
                    print(f"course-roster: made the course {args.course!r} in ngshare, taught by "
                          f"{args.instructor!r}: {made}", flush=True)
                listed = _call("GET", f"{args.ngshare}/students/{course}", token)
                enrolled = {s["username"] for s in listed.get("students", [])} | {args.instructor}
            users = _hub_users(hub_api, token)
            new = sorted(users - enrolled)
            if new:
                rows = [{"username": n, "first_name": "", "last_name": "", "email": ""} for n in new]
                done = _call("POST", f"{args.ngshare}/students/{course}", token, {"students": json.dumps(rows)})
                added = {s["username"] for s in done.get("status", []) if s.get("success")}
                enrolled |= added
                print(f"course-roster: enrolled {sorted(added)} in {args.course!r}"
                      + (f"; refused: {done}" if added != set(new) else ""), flush=True)
        except Exception as exc:  # ngshare or the hub not answering yet: say so, look again
            print(f"course-roster: {type(exc).__name__}: {exc}; trying again in {args.every:g} s", flush=True)
            enrolled = set()
        time.sleep(args.every)


if __name__ == "__main__":
    command, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if command == "serve":
        serve(rest)
    elif command == "roster":
        roster(rest)
    else:
        sys.exit("usage: python hub/ngshare_service.py serve|roster ... (the hub runs both; see the docstring)")
