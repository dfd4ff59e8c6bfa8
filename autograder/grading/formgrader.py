"""The formgrader's Autograde buttons, routed through the course's grading (a Jupyter server extension).

nbgrader's formgrader has an Autograde button on every collected submission (Manage Assignments
-> the number of submissions). Its own handler runs nbgrader's plain autograde inside the
instructor's server: the learner's code with the instructor's rights, no sandbox and no clean
re-grade, so a notebook that patches its own kernel could pass. On the course's hub
(hub/serve.py) the instructor's server loads this extension, which answers that button in place
of nbgrader's handler: the submission the formgrader collected
(``autograder/submitted/<student>/<lesson>/``) is copied into ``autograder/formgrader/<lesson>/``
and graded by ``python -m autograder grade`` (``make grade``: the sandbox, the clean re-grade,
the feedback, the gradebook), in a process of its own, so the server keeps answering while it
runs. The button's dialog shows that command's output. Elsewhere::

    jupyter lab --ServerApp.jpserver_extensions="{'autograder.grading.formgrader': True}"
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

__all__ = ["ROUTE", "grade_one"]

#: nbgrader's route for one submission's Autograde button (server_extensions/formgrader/apihandlers.py).
ROUTE = r"/formgrader/api/submission/([^/]+)/([^/]+)/autograde"


async def grade_one(root: Path, submitted: Path, lesson: str, student: str) -> dict:
    """Grade ``student``'s collected ``lesson`` with the course's grading; nbgrader's answer shape (success, log, error)."""
    source = submitted / student / lesson
    if not (source / f"{lesson}.ipynb").is_file():
        return {"success": False, "log": "", "error": (
            f"{student} has no collected {lesson} in {source}: press Collect in Manage Assignments, or run "
            f"`make collect LESSON={lesson}` in a terminal, then Autograde again.")}
    folder = root / "autograder" / "formgrader" / lesson
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder / student / lesson)
    env = {**os.environ, "COURSE_ROOT": str(root)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "autograder", "grade", str(folder), "--jobs", "1", cwd=root, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out = (await proc.communicate())[0].decode(errors="replace")
    if proc.returncode == 0:
        return {"success": True, "log": out, "error": ""}
    last = [line for line in out.splitlines() if line.strip()][-1:] or [f"exit status {proc.returncode}"]
    return {"success": False, "log": out, "error": f"the course's grading of {student}'s {lesson} failed: {last[0]} "
            "(the whole output is above; `make grade` prints the same in a terminal)."}


def _handler():
    from nbgrader.server_extensions.formgrader.base import BaseApiHandler, check_notebook_dir, check_xsrf
    from tornado import web

    class CourseAutogradeHandler(BaseApiHandler):
        """The Autograde button: the course's grading of one collected submission."""

        @web.authenticated
        @check_xsrf
        @check_notebook_dir
        async def post(self, lesson: str, student: str) -> None:
            coursedir = self.coursedir
            root = Path(coursedir.root)
            submitted = root / coursedir.submitted_directory
            self.write(json.dumps(await grade_one(root, submitted, lesson, student)))

    return CourseAutogradeHandler


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "autograder.grading.formgrader"}]


def _load_jupyter_server_extension(serverapp) -> None:
    """Put the course's handler before nbgrader's for the Autograde route (tornado takes the first rule that matches)."""
    from jupyter_server.utils import url_path_join
    from tornado.routing import PathMatches, Rule

    webapp = serverapp.web_app
    pattern = url_path_join(webapp.settings["base_url"], ROUTE.lstrip("/"))
    webapp.default_router.rules.insert(0, Rule(PathMatches(pattern), _handler()))
    serverapp.log.info("autograder.grading.formgrader: the formgrader's Autograde buttons grade with the course's "
                       "grading (sandbox, clean re-grade)")
