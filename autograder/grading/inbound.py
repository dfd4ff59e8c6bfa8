"""nbgrader's collect from the shared-folder exchange, taking only submissions that are whole.

nbgrader's submit copies the learner's lesson folder straight into the exchange's
``inbound/<student>+<lesson>+<time>+<random>/``, file by file, then writes ``timestamp.txt`` and,
last, ``submission_secret.txt``. A collect that runs meanwhile finds the folder by its name and
would copy (and the course would grade) the half-written notebook. :class:`WholeCollect` is
nbgrader's collect with one rule added: a submission folder without its non-empty
``submission_secret.txt`` is still being written (or its submit failed). It is left in the
exchange for the next collect, with a line saying so; that learner's newest whole submission,
if any, is collected instead. Used by ``make collect`` (:mod:`autograder.grading.exchange`) when the
exchange is the shared folder (ngshare stores a submission in one request, never half).
"""

from __future__ import annotations

import glob
import os
import time
from datetime import datetime

from nbgrader.exchange.default.collect import ExchangeCollect

__all__ = ["WholeCollect", "is_whole", "describe_partial"]

#: A partial submission untouched for this long is taken for a submit that failed, not one under way.
STALE_S = 600


def is_whole(folder: str) -> bool:
    """Did nbgrader's submit finish writing ``folder``? (its last file, the secret, is there and not empty)"""
    try:
        return os.path.getsize(os.path.join(folder, "submission_secret.txt")) > 0
    except OSError:  # missing, or not yet readable by the instructor (the learner's rights until submit ends)
        return False


def describe_partial(folder: str, student: str, lesson: str, when: datetime, instead: datetime | None) -> str:
    """The line a collect prints for a submission it left: what, the values, and what to do."""
    sizes, newest = 0, None
    for base, _, files in os.walk(folder):
        for name in files:
            try:
                info = os.stat(os.path.join(base, name))
            except OSError:
                continue
            sizes += info.st_size
            newest = max(newest or 0, info.st_mtime)
    try:
        newest = max(newest or 0, os.stat(folder).st_mtime)
    except OSError:
        pass
    idle = time.time() - newest if newest else None
    took = (f"collected {student}'s earlier whole submission of {instead:%Y-%m-%d %H:%M:%S} UTC instead"
            if instead else f"nothing of {student}'s is collected for {lesson} this time")
    line = (f"{student}'s submission of {lesson} made at {when:%Y-%m-%d %H:%M:%S} UTC is not whole yet ({folder}: "
            f"{sizes} bytes so far, no submission_secret.txt, which nbgrader's submit writes last): left in the "
            f"exchange for the next collect; {took}. Run `make collect LESSON={lesson}` again in a minute.")
    if idle is not None and idle > STALE_S:
        line += (f" It has not changed for {idle / 60:.0f} minutes, so {student}'s submit most likely failed "
                 f"(server stopped, disk full): ask {student} to press Submit again.")
    return line


class WholeCollect(ExchangeCollect):
    """nbgrader's ExchangeCollect that never collects a submission still being written (module docstring)."""

    def init_src(self):
        super().init_src()
        self.left_partial = []
        chosen = []
        for record in self.src_records:
            folder = os.path.join(self.inbound_path, record["filename"])
            if is_whole(folder):
                chosen.append(record)
                continue
            student = record["username"]
            pattern = os.path.join(self.inbound_path, f"{glob.escape(student)}+{self.coursedir.assignment_id}+*")
            earlier = [r for r in map(self._path_to_record, glob.glob(pattern))
                       if r["username"] == student and r["timestamp"] < record["timestamp"]
                       and is_whole(os.path.join(self.inbound_path, r["filename"]))]
            instead = self._sort_by_timestamp(earlier)[0] if earlier else None
            if instead:
                chosen.append(instead)
            line = describe_partial(folder, student, self.coursedir.assignment_id, record["timestamp"],
                                    instead["timestamp"] if instead else None)
            self.left_partial.append(line)
            self.log.warning(line)
        self.src_records = chosen
