"""Grade one learner's submission of one lesson, in a work folder of its own.

:func:`grade_submission` takes a :class:`Task` (who, which lesson, where the handed-in
notebook, the course's nbgrader files and a gradebook template are) and returns a
:class:`Graded` record: how it ended, the score of every graded part, seconds per stage,
and the whole log. The graded notebook, the feedback page and the private gradebook stay in
the task's work folder, which the class workflow (:mod:`autograder.grading.grade`) merges into the
course and then removes. It runs in a worker process that grades many submissions one after
another, with nbgrader already imported, so no submission pays for starting nbgrader.

The steps:

1. **set-up**: a private copy of nbgrader's configuration, the gradebook template and the
   submission;
2. **autograde** (nbgrader, in this process): deleted and edited cells are restored, then the
   notebook runs in a fresh kernel inside the grading sandbox (:mod:`autograder.grading.sandbox`).
   Hidden test cells run no check there (:func:`autograder.lessons.kit.decided_by_clean_run`): a
   learner's kernel can be made to say anything, so its verdict would not count anyway;
3. **clean re-grade** (:mod:`autograder.grading.clean`, sandboxed too): every graded part is
   decided in a fresh process that holds only the learner's definitions. It starts as soon
   as the restored notebook exists, so it runs beside the kernel;
4. **settle**: each part's verdict goes into the gradebook and, in place of the hidden test
   cell's output, into the graded notebook, with no path of the grading machine in it;
5. **feedback** (nbgrader, in this process): the learner's HTML page.

Whose failure it is decides what happens next (:attr:`Graded.failure`):

- ``"infrastructure"``: the sandbox could not be set up, the kernel did not start, nbgrader
  or the clean re-grade broke. Nothing the learner did; the class workflow grades such a
  submission once more (:data:`TRIES`), and the record says why.
- ``"learner"``: the notebook file cannot be read. The learner has to hand it in again.
- A kernel that died while it ran the learner's cells (``os._exit``, a crash in C) is the
  learner's doing, but loses nothing: the clean re-grade still decides every part, and the
  feedback says the notebook stopped there (:attr:`Graded.notes`).

Example (what :mod:`autograder.grading.grade` does for each submission, in a worker)::

    task = Task(student="ana", lesson="04-ring-all-reduce", submitted=Path("autograder/submitted/ana/04-ring-all-reduce"),
                course=ROOT, template=Path("/tmp/gradebook.db"))
    graded = grade_submission(task)    # graded.status == "ok", graded.parts[0]["score"] == 1.0, ...
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["Task", "Graded", "grade_submission", "warm_up", "quiet_gradebook", "redact", "TRIES", "CLEAN_TIMEOUT", "CLEAN_NOTE"]

#: Tries a submission gets when grading fails for a reason that is not the learner's.
TRIES = 2
#: Seconds the clean re-grade of one submission may take before its unfinished parts score 0.
CLEAN_TIMEOUT = float(os.environ.get("COURSE_CLEAN_TIMEOUT", "600"))
#: The heading of what a graded cell shows when the notebook's code was not all kept for the clean run.
CLEAN_NOTE = "Left out of the fresh process"
#: The most of a process's error output kept in the log (its start and its end).
_KEEP_BYTES = 64 << 10
_SLOWEST_CELLS = 5


@dataclass(frozen=True)
class Task:
    """Everything one submission's grading needs; it can travel to any worker that sees these paths."""

    student: str
    lesson: str
    submitted: Path  # the folder holding <lesson>.ipynb (and nbgrader's timestamp.txt)
    course: Path  # the course root: nbgrader_config.py, solutions/, course/
    template: Path  # a gradebook that knows every lesson and no submission
    sandboxed: bool = True
    attempt: int = 1


@dataclass
class Graded:
    """How grading one submission went; :meth:`record` is its entry in ``grading-run.json``."""

    student: str
    lesson: str
    folder: str  # the work folder: autograder/{autograded,feedback}/..., autograder/gradebook.db
    attempt: int = 1
    status: str = "failed"  # "ok" when scores and feedback were made
    failure: str | None = None  # whose failure: "infrastructure" or "learner" (None when ok)
    error: str | None = None  # the line that says what went wrong
    notes: list[str] = field(default_factory=list)  # what the learner should know (their kernel died)
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    cells: dict[str, Any] = field(default_factory=dict)  # the notebook's run: count, seconds, slowest
    parts: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    log: str = ""

    def record(self) -> dict[str, Any]:
        """Everything but the work folder and the log (which goes to a file of its own); ``attempt`` as ``tries``."""
        out = asdict(self)
        del out["folder"], out["log"]
        out["tries"] = out.pop("attempt")
        return out


#: For the kernel and the clean re-grade, which launch ranks (this process sets ``HELPERS_PRESTART=0``
#: for itself, and the sandbox passes ``HELPERS_*`` on): the rank factory starts when helpers is
#: imported, and imports at once what every rank that builds an optimizer would import again
#: (see ``helpers._runtime.factory_process``). Without it lesson 05's clean checks took 10.3 s instead of 4.2 s.
RANK_FACTORY_ENV = {"HELPERS_PRESTART": "1", "HELPERS_WARM_UP": "now"}


def warm_up() -> None:
    """Import what grading a submission uses, once per worker process (nbgrader, nbconvert, nbclient)."""
    os.environ["HELPERS_PRESTART"] = "0"  # this process starts no ranks: no rank factory for it
    quiet_gradebook()
    import nbclient  # noqa: F401
    import nbgrader.apps.api  # noqa: F401
    import nbgrader.converters  # noqa: F401
    from nbconvert.exporters import HTMLExporter  # noqa: F401

    from ..course import cells

    from ..course import preprocessors  # noqa: F401


def quiet_gradebook() -> None:
    """Hide SQLAlchemy's warnings about nbgrader's own sessions (nbgrader's commands hide them the same way)."""
    import warnings

    try:
        from sqlalchemy.exc import SAWarning
    except ImportError:
        return
    warnings.filterwarnings("ignore", category=SAWarning)


# -- the pieces --------------------------------------------------------------------------------


class _Tail:
    """A pipe whose other end a child process writes; a thread keeps its first and last bytes.

    Its :attr:`path` (``/proc/<this pid>/fd/<n>``) opens the pipe's writing end from another
    process, so a kernel that floods its error output costs this process nothing.
    """

    def __init__(self) -> None:
        self._read, write = os.pipe()
        self._write: int | None = write
        self.path = f"/proc/{os.getpid()}/fd/{write}"
        self._head, self._tail, self._dropped = bytearray(), bytearray(), 0
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self._read, 1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            room = _KEEP_BYTES // 8 - len(self._head)
            if room > 0:
                self._head += data[:room]
                data = data[room:]
            self._tail += data
            if len(self._tail) > _KEEP_BYTES:
                self._dropped += len(self._tail) - _KEEP_BYTES
                del self._tail[:len(self._tail) - _KEEP_BYTES]
        os.close(self._read)

    def close(self) -> str:
        """Stop writing here (children may still hold the pipe: wait briefly), and return what was kept."""
        if self._write is not None:
            os.close(self._write)
            self._write = None
            self._thread.join(timeout=2.0)
        gap = f"\n[... {self._dropped} bytes left out ...]\n" if self._dropped else ""
        return (bytes(self._head) + gap.encode() + bytes(self._tail)).decode("utf-8", "replace")


def _text_tail(path: Path) -> str:
    """The start and end of a file a child process wrote (at most :data:`_KEEP_BYTES`)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size <= _KEEP_BYTES:
                return f.read().decode("utf-8", "replace")
            head = f.read(_KEEP_BYTES // 8)
            f.seek(size - _KEEP_BYTES * 7 // 8)
            tail = f.read()
        return (head + f"\n[... {size - len(head) - len(tail)} bytes left out ...]\n".encode() + tail).decode(
            "utf-8", "replace")
    except OSError:
        return ""


def redact(text: str, folder: Path | str | None = None) -> str:
    """``text`` without the grading machine's paths: the work folder, the course, Python's installation.

    Learners read their feedback; where the grader keeps its files is none of theirs.

    >>> import sys
    >>> redact(f'File "{sys.prefix}/lib/x.py", line 3', None).startswith('File "<python>/lib/x.py"')
    True
    """
    from ..course.build import ROOT
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


def _cell_times(nb: Any) -> dict[str, Any]:
    """From nbclient's timestamps: how many cells ran, their seconds in all and each, the imports cell, the slowest.

    The imports cell is the first code cell that imports something, past the Colab set-up
    cell (which does nothing outside Colab).
    """
    from ..course.colab import SETUP_ID

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


class _Job:
    """One submission's work folder, and the nbgrader and clean runs inside it."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.folder = Path(tempfile.mkdtemp(prefix="course-grading-"))
        self.work = self.folder / "autograder"
        self.work.mkdir()
        shutil.copy2(task.course / "nbgrader_config.py", self.folder / "nbgrader_config.py")
        (self.folder / "solutions").symlink_to(task.course / "solutions")
        shutil.copy2(task.template, self.work / "gradebook.db")
        shutil.copytree(task.submitted, self.work / "submitted" / task.student / task.lesson)
        self.autograded = self.work / "autograded" / task.student / task.lesson
        self.runtime = self.folder / "runtime"
        self.runtime.mkdir()
        self.clean_folder = self.folder / "clean"
        self.clean_folder.mkdir()
        self.clean_process: subprocess.Popen | None = None
        self.clean_started: float | None = None

    @property
    def notebook(self) -> Path:
        return self.autograded / f"{self.task.lesson}.ipynb"

    def box(self, writable: list[Path], env: dict[str, str] | None = None):
        from .sandbox import Sandbox

        return Sandbox(writable=writable, hidden=[self.task.course, self.folder], env=env or {})

    def api(self, kernel_stderr: str | None = None) -> Any:
        """nbgrader's API over this work folder; with ``kernel_stderr``, set up to autograde: the kernel in
        the sandbox (from the spec in ``jupyter/``, which goes first on JUPYTER_PATH while it starts), over
        Unix sockets, its error output to that file, and watched (autograder.course.preprocessors)."""
        from nbgrader.converters import Autograde
        from nbgrader.preprocessors import Execute

        from ..course.build import nbgrader_api
        from ..lessons.kit import CLEAN_RUN_DECIDES
        from ..course.preprocessors import SANITIZE, KeepSanitized, WatchedExecute
        from .sandbox import kernel_spec

        if kernel_stderr is None:
            return nbgrader_api(self.folder)
        env = {"NBGRADER_EXECUTION": "autograde", CLEAN_RUN_DECIDES: "1", "HELPERS_PRESTART": "1"}
        self.autograded.mkdir(parents=True, exist_ok=True)
        box = self.box([self.autograded, self.runtime], env) if self.task.sandboxed else None
        kernel_spec(self.folder / "jupyter", box, stderr=kernel_stderr, env=env)
        return nbgrader_api(self.folder, **{
            "Autograde.sanitize_preprocessors": [*SANITIZE, KeepSanitized],
            "Autograde.autograde_preprocessors": [WatchedExecute if p is Execute else p for p in
                                                  Autograde.class_traits()["autograde_preprocessors"].default()],
            "KernelManager.transport": "ipc",
            "KernelManager.ip": str(self.runtime / "kernel"),
            "KernelManager.connection_file": str(self.runtime / "kernel.json"),
        })

    def start_clean(self, notebook: Any) -> None:
        """Start the clean re-grade of ``notebook`` (the restored one, before it runs) in the background."""
        import nbformat

        from ..course.cells import lesson_number

        copy = self.clean_folder / "submission.ipynb"
        nbformat.write(notebook, copy)
        argv = [sys.executable, "-m", "autograder.grading.clean", str(copy), str(lesson_number(self.notebook))]
        if self.task.sandboxed:
            argv = self.box([self.clean_folder], RANK_FACTORY_ENV).wrap(argv)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **RANK_FACTORY_ENV)
        env.pop("COURSE_CLEAN_RUN_DECIDES", None)
        with (self.folder / "clean.out").open("wb") as out, (self.folder / "clean.err").open("wb") as err:
            self.clean_started = time.monotonic()
            self.clean_process = subprocess.Popen(argv, cwd=self.clean_folder, env=env, stdout=out, stderr=err,
                                                  stdin=subprocess.DEVNULL, start_new_session=True)

    def finish_clean(self) -> tuple[list[dict[str, Any]], dict[str, Any], str | None, str]:
        """Wait for the clean re-grade: (one result per part, its first line, why it stopped early or None, its log)."""
        process, stopped = self.clean_process, None
        if process is None:
            return [], {}, "it did not start", ""
        remaining = CLEAN_TIMEOUT - (time.monotonic() - (self.clean_started or time.monotonic()))
        try:
            code = process.wait(timeout=max(1.0, remaining))
            if code != 0:
                stopped = f"it exited with code {code}"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)  # its own session: the sandbox and everything in it
            process.wait()
            stopped = f"it did not finish within {CLEAN_TIMEOUT:g} s and was stopped"
        lines = []
        for line in (self.folder / "clean.out").read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    pass
        head = next((line for line in lines if "left_out" in line), {})
        errors = _text_tail(self.folder / "clean.err")
        if stopped and errors.strip():
            stopped += ": " + errors.strip().splitlines()[-1]
        return [line for line in lines if "part" in line], head, stopped, errors

    def remove(self) -> None:
        if self.clean_process is not None and self.clean_process.poll() is None:
            os.killpg(self.clean_process.pid, 9)
            self.clean_process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


# -- settling: the clean verdicts into the gradebook and the notebook ----------------------------


def _verdict_outputs(cell: Any, result: dict[str, Any], left_out: list[str], folder: Path) -> list[Any]:
    """What a graded cell shows: the lines the kernel printed (not the placeholder), then the verdict."""
    import nbformat

    from ..lessons.kit import DEFERRED

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
    message = redact(result.get("message") or "no message", folder)
    if left_out:
        shown = [f"  {line}" for line in left_out[:8]] + ([f"  ... and {len(left_out) - 8} more"] if len(left_out) > 8
                                                          else [])
        message += (f"\n{CLEAN_NOTE} (parts are graded from your notebook's imports, functions, classes and "
                    "constants alone):\n" + "\n".join(shown))
    name = "CheckError" if result.get("check_error") else "GradingFailure"
    red, reset = "\x1b[0;31m", "\x1b[0m"
    lines = message.splitlines() or [""]
    kept.append(nbformat.v4.new_output("error", ename=name, evalue=lines[0],
                                       traceback=[f"{red}{name}{reset}: {lines[0]}", *lines[1:]]))
    return kept


def _settle(job: _Job, results: list[dict[str, Any]], left_out: list[str], stopped: str | None,
            notes: list[str]) -> list[dict[str, Any]]:
    """Every part's clean score into the job's gradebook, and its verdict into its cell; returns the parts."""
    import nbformat
    from nbgrader.api import Gradebook

    from ..course.cells import graded_cells

    task = job.task
    cells = {c.grade_id: c for c in graded_cells(task.course / "solutions" / task.lesson / f"{task.lesson}.ipynb")}
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
                "message": f"{graded.part}: grading did not reach this part ({stopped or 'no result'})."}
            score = float(result["score"])
            grade = gb.find_grade(grade_id, task.lesson, task.lesson, task.student)
            grade.auto_score = score
            parts.append({"grade_id": grade_id, "exercise": graded.number, "part": graded.part,
                          "points": graded.points, "score": score, "message": result.get("message"),
                          "check_error": bool(result.get("check_error")), "seconds": result.get("seconds"),
                          "launches": result.get("launches"), "launch_seconds": result.get("launch_seconds"),
                          "fresh_groups": result.get("fresh_groups")})
            cell = by_id.get(grade_id)
            if cell is not None:
                cell.outputs = _verdict_outputs(cell, result, left_out, job.folder)
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


# -- one submission ------------------------------------------------------------------------------


def _readable(path: Path) -> str | None:
    """None when ``path`` is a notebook nbformat can read; else why not, for the learner."""
    import nbformat

    try:
        nbformat.read(path, as_version=4)
        return None
    except Exception as exc:  # noqa: BLE001 - any way a file can fail to be a notebook
        return f"the notebook file cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"


def _telling_line(kernel: str, error: BaseException | None, nbgrader_error: str) -> str:
    """The one line that says what went wrong: bubblewrap's message, the kernel's last words, the error."""
    lines = [line.strip() for line in kernel.splitlines() if line.strip()]
    bwrap = [line for line in lines if line.startswith("bwrap:")]
    if bwrap:
        return bwrap[-1]
    said = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}" if error else ""
    if lines and error is not None:
        return f"{said} (the kernel's last words: {lines[-1][:300]})"
    if said:
        return said
    found = [line for line in nbgrader_error.strip().splitlines() if line.strip() and "above traceback" not in line]
    return found[-1].strip() if found else "nbgrader failed without a message"


def grade_submission(task: Task) -> Graded:
    """Autograde, re-grade cleanly and write the feedback of one submission; never raises."""
    from ..course import preprocessors

    began = time.monotonic()
    job = _Job(task)
    graded = Graded(task.student, task.lesson, str(job.folder), attempt=task.attempt)
    stages = graded.stages
    log: list[str] = [f"== {task.student}/{task.lesson}, try {task.attempt}, work folder {job.folder}"]
    watch = preprocessors.WATCH = preprocessors.Watch(on_sanitized=job.start_clean)
    kernel = _Tail()
    try:
        unreadable = _readable(job.work / "submitted" / task.student / task.lesson / f"{task.lesson}.ipynb")
        if unreadable:
            graded.failure, graded.error = "learner", unreadable
            return graded
        stages["setup"] = round(time.monotonic() - began, 2)
        mark = time.time()
        api = job.api(kernel.path)
        # The kernel spec is looked up on JUPYTER_PATH when the kernel starts (this worker grades one
        # submission at a time, so its environment is this submission's meanwhile).
        saved = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(job.folder / "jupyter"), saved) if p)
        try:
            done = api.autograde(task.lesson, task.student, force=True, create=True)
        finally:
            if saved is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = saved
        stages["autograde"] = round(time.monotonic() - began - stages["setup"], 2)
        if watch.kernel_started:
            stages["kernel_start"] = round(watch.kernel_started - mark, 2)
        kernel_text = kernel.close()
        log += ["== nbgrader autograde", done.get("log", "").rstrip(), done.get("error", "").rstrip()]
        log += ["== the kernel's error output", kernel_text.rstrip()]
        if not done["success"]:
            if watch.kernel_died and watch.sanitized is not None:
                graded.notes.append(f"Your notebook's kernel died while it ran ({watch.cells_started} code cells had "
                                    "started): the outputs below stop there. Every graded part was still decided in "
                                    "a fresh process from your code.")
                import nbformat

                # nbgrader removed the failed run's folder: the notebook as it was about to run stands in for it.
                submitted = job.work / "submitted" / task.student / task.lesson
                shutil.copytree(submitted, job.autograded, dirs_exist_ok=True)
                os.chmod(job.notebook, 0o644)
                nbformat.write(watch.sanitized, job.notebook)
            else:
                graded.failure = "learner" if watch.kernel_died else "infrastructure"
                graded.error = _telling_line(kernel_text, watch.error, done.get("error", ""))
                return graded
        if job.clean_process is None:  # no restored copy was seen: now, from the notebook as it was to run
            import nbformat

            job.start_clean(watch.sanitized if watch.sanitized is not None else
                            nbformat.read(job.notebook, as_version=4))
        waited = time.monotonic()
        results, head, stopped, clean_errors = job.finish_clean()
        stages["clean"] = round(time.monotonic() - (job.clean_started or waited), 2)
        stages["clean_after_kernel"] = round(time.monotonic() - waited, 2)
        if "ready" in head:
            stages["clean_ready"] = head["ready"]
        log += ["== clean re-grade" + (f" (stopped: {stopped})" if stopped else ""),
                *(json.dumps(r) for r in results), clean_errors.rstrip()]
        if stopped and not results:
            graded.failure, graded.error = "infrastructure", f"the clean re-grade failed: {stopped}"
            return graded
        settled = time.monotonic()
        graded.left_out = head.get("left_out", [])
        graded.parts = _settle(job, results, graded.left_out, stopped, graded.notes)
        import nbformat

        graded.cells = _cell_times(nbformat.read(job.notebook, as_version=4))
        stages["settle"] = round(time.monotonic() - settled, 2)
        made = job.api().generate_feedback(task.lesson, task.student, force=True)
        stages["feedback"] = round(time.monotonic() - settled - stages["settle"], 2)
        log += ["== nbgrader generate_feedback", made.get("log", "").rstrip(), made.get("error", "").rstrip()]
        if not made["success"]:
            graded.failure = "infrastructure"
            graded.error = "feedback: " + _telling_line("", None, made.get("error", ""))
            return graded
        graded.status = "ok"
        return graded
    except KeyboardInterrupt:
        job.remove()  # the run is being stopped: nothing of this submission is merged
        raise
    except Exception as exc:  # noqa: BLE001 - a fault of the grading machinery: recorded, tried again
        import traceback

        log.append("== grading broke\n" + traceback.format_exc())
        graded.failure, graded.error = "infrastructure", f"{type(exc).__name__}: {exc}"
        return graded
    finally:
        kernel.close()
        if job.clean_process is not None and job.clean_process.poll() is None:
            os.killpg(job.clean_process.pid, 9)
            job.clean_process.wait()
        graded.seconds = round(time.monotonic() - began, 2)
        if graded.error:
            log.append(f"== {graded.failure or 'failed'}: {graded.error}")
        graded.log = "\n".join(part for part in log if part) + "\n"
