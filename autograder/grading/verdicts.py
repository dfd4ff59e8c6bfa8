"""*settle*: the clean re-grade's verdicts into the gradebook and into each graded cell, with no path of the grading machine.

:func:`settle` is the step (:mod:`autograder.grading.submission`): it writes every part's score
into the submission's private gradebook and its verdict in place of the hidden test cell's output,
and the parts into the record; :func:`redact` takes the grading machine's paths out
of everything the learner reads; :func:`cell_times` reads how long the notebook's cells took.
"""

from __future__ import annotations

import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from .regrade import Verdicts
from .workfolder import Job

__all__ = ["settle", "verdict_outputs", "redact", "cell_times", "CLEAN_NOTE"]


#: The heading of what a graded cell shows when the notebook's code was not all kept for the clean run.
CLEAN_NOTE = "Left out of the fresh process"


_SLOWEST_CELLS = 5


def redact(text: str, folder: Path | str | None = None) -> str:
    """``text`` without the grading machine's paths: the work folder, the course, Python's installation.

    Learners read their feedback; where the grader keeps its files is none of theirs.

    >>> import sys
    >>> redact(f'File "{sys.prefix}/lib/x.py", line 3', None).startswith('File "<python>/lib/x.py"')
    True
    """
    from ..paths import ROOT
    from .sandbox import PACKAGE_DIRS

    names = {}
    if folder:
        names[str(folder)] = "."
    for package in PACKAGE_DIRS:
        names[str(package)] = f"<course>/{package.name}"
    names[str(ROOT)] = "<course>"
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.realpath(sys.prefix)}:
        names[prefix] = "<python>"
    home = os.path.expanduser("~")
    if home not in ("", "/"):
        names[home] = "~"
    for path in sorted(names, key=len, reverse=True):
        text = text.replace(path, names[path])
    return re.sub(r"/tmp/course-grading-[\w-]+", ".", text)


def _seconds_between(start: str, end: str) -> float:
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def cell_times(nb: Any) -> dict[str, Any]:
    """From nbclient's timestamps: how many cells ran, their seconds in all and each, the imports cell, the slowest.

    The imports cell is the first code cell that imports something, past the Colab set-up
    cell (which does nothing outside Colab).
    """
    from ..notebooks.colab import SETUP_ID

    timed = []
    for index, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if cell.cell_type == "code" and start and end:
            first = next((line for line in cell.source.splitlines() if line.strip()), "")
            timed.append({"cell": index, "seconds": round(_seconds_between(start, end), 2), "source": first[:80],
                          "imports": cell.get("id") != SETUP_ID and re.search(r"^\s*(import|from) ", cell.source,
                                                                                re.M) is not None})
    imports = next((c["seconds"] for c in timed if c["imports"]), None)
    for c in timed:
        del c["imports"]
    slowest = sorted(timed, key=lambda c: -c["seconds"])[:_SLOWEST_CELLS]
    return {"ran": len(timed), "seconds": round(sum(c["seconds"] for c in timed), 2), "imports": imports,
            "each": [[c["cell"], c["seconds"]] for c in timed], "slowest": slowest}


def verdict_outputs(cell: Any, result: dict[str, Any], left_out: list[str], folder: Path) -> list[Any]:
    """What a graded cell shows: the lines the kernel printed (not the placeholder), then the verdict."""
    import nbformat

    from ..kit.exercise import DEFERRED

    kept = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            continue  # the kernel's own error here (a name the learner never defined): the verdict says it better
        if output.get("output_type") == "stream":
            text = "".join(output.get("text", ""))
            text = "".join(line for line in text.splitlines(True) if line.strip() != DEFERRED)
            if not text.strip():
                continue
            output["text"] = text
        kept.append(output)
    label = f'Exercise {result["exercise"]}, part "{result["part"]}"'
    points = result["points"]
    if float(result["score"]) >= float(points):
        kept.append(nbformat.v4.new_output("stream", name="stdout", text=f"{label}: passed ({points:g} of {points:g} "
                                                                           f"point{'s' if points != 1 else ''}).\n"))
        return kept
    if result.get("check_error"):  # the course's fault: its whole message, with where it failed, for the instructor
        name, message = "CheckError", redact(result.get("message") or "no message", folder)
    else:  # the learner's: the part, the verdict, then what went wrong, and no frame of the checks
        name, message = "GradingFailure", redact(_verdict(result, label), folder)
    if left_out:
        shown = [f"  {line}" for line in left_out[:8]] + ([f"  ... and {len(left_out) - 8} more"] if len(left_out) > 8
                                                          else [])
        message += (f"\n{CLEAN_NOTE} (parts are graded from your notebook's imports, functions, classes and "
                    "constants alone):\n" + "\n".join(shown))
    red, reset = "\x1b[0;31m", "\x1b[0m"
    lines = message.splitlines() or [""]
    kept.append(nbformat.v4.new_output("error", ename=name, evalue=lines[0],
                                       traceback=[f"{red}{name}{reset}: {lines[0]}", *lines[1:]]))
    return kept


def _verdict(result: dict[str, Any], label: str) -> str:
    """``Exercise 5.1, part "correct": 0 of 2 points.`` and, on the lines after it, what the learner reads.

    The failure's own label stays where it says more than the part's name (``crash (gather_all)``).

    >>> print(_verdict({"part": "crash", "points": 2, "score": 0, "text": "rank 1 died.",
    ...                 "message": "crash (gather_all): rank 1 died."}, 'Exercise 8.1, part "crash"'))
    Exercise 8.1, part "crash" (gather_all): 0 of 2 points.
    rank 1 died.
    """
    text, message = result.get("text"), result.get("message") or "no message"
    if not text or not message.endswith(text):
        text = message
    own = message[:len(message) - len(text)].rstrip(": ") if message.endswith(text) else ""
    if own.startswith(result["part"]) and own != result["part"]:
        label += own[len(result["part"]):]
    points = result["points"]
    return (f"{label}: {float(result['score']):g} of {points:g} point{'s' if points != 1 else ''}.\n{text}")


def settle(job: Job, verdicts: Verdicts) -> None:
    """*settle*: every part's clean score into the job's gradebook, its verdict into its cell, and the parts, what
    was left out and how long the cells took into the record."""
    import nbformat

    started, graded = time.monotonic(), job.graded
    graded.left_out = verdicts.left_out
    graded.parts = _settle(job, verdicts.results, verdicts.left_out, verdicts.stopped, graded.notes)
    graded.cells = cell_times(nbformat.read(job.notebook, as_version=4))
    graded.stages["settle"] = round(time.monotonic() - started, 2)


def _settle(job: Job, results: list[dict[str, Any]], left_out: list[str], stopped: str | None,
            notes: list[str]) -> list[dict[str, Any]]:
    """Every part's clean score into the job's gradebook, and its verdict into its cell; returns the parts."""
    import nbformat
    from nbgrader.api import Gradebook

    from ..notebooks.cells import graded_cells

    task = job.task
    cells = {c.grade_id: c for c in graded_cells(job.solution)}
    clean = {(r["exercise"], r["part"]): r for r in results}
    nb = nbformat.read(job.notebook, as_version=4)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    parts = []
    with Gradebook(f"sqlite:///{job.work / 'gradebook.db'}") as gb:
        for grade_id, graded in cells.items():
            if graded.part is None:
                continue
            result = clean.get((graded.number, graded.part)) or {
                "exercise": graded.number, "part": graded.part, "points": graded.points, "score": 0,
                "text": f"grading did not reach this part ({stopped or 'no result'})."}
            result.setdefault("message", f"{graded.part}: {result.get('text')}")
            score = float(result["score"])
            grade = gb.find_grade(grade_id, task.lesson, task.lesson, task.student)
            grade.auto_score = score
            parts.append({"grade_id": grade_id, "exercise": graded.number, "part": graded.part,
                          "points": graded.points, "score": score, "message": result.get("message"),
                          "text": result.get("text"),
                          "check_error": bool(result.get("check_error")), "seconds": result.get("seconds"),
                          "launches": result.get("launches"), "launch_seconds": result.get("launch_seconds"),
                          "fresh_groups": result.get("fresh_groups")})
            cell = by_id.get(grade_id)
            if cell is not None:
                cell.outputs = verdict_outputs(cell, result, left_out, job.folder)
        gb.db.commit()
    for cell in nb.cells:  # the kernel's own outputs: tracebacks name files of the grading machine
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = redact("".join(output["text"]), job.folder)
            if "traceback" in output:
                output["traceback"] = [redact(line, job.folder) for line in output["traceback"]]
    if notes and nb.cells:
        first = next((c for c in nb.cells if c.cell_type == "code"), None)
        if first is not None:
            first.outputs.insert(0, nbformat.v4.new_output("stream", name="stderr", text="\n".join(notes) + "\n"))
    os.chmod(job.notebook, 0o644)  # nbgrader leaves it read-only
    nbformat.write(nb, job.notebook)
    return parts
