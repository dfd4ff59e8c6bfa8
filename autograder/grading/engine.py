"""Where a class is graded: Dask workers, on this machine, on a Dask cluster, or in SLURM jobs.

:class:`Workers` says where (one object, passed down): ``jobs`` worker processes of a Dask
``LocalCluster`` on this machine (the default, nothing to start), the ``scheduler`` of a
running Dask cluster (``tcp://host:8786``, or a Dask cluster or client object), or SLURM jobs
(:class:`autograder.grading.slurm.Slurm`). :func:`connect` gives a Dask client for it, with
every worker warmed up (:class:`autograder.grading.cluster.WarmUp`: nbgrader imported once per
worker process, which then grades one submission after another).

:func:`run` submits the tasks (a few more than there are worker threads: the rest wait here,
with their bytes), merges nothing itself (its ``on_final`` does, in this process) and decides
the tries. Each start of a submission on a worker is an event on the scheduler
(``course-grading/<run>/<student>/<lesson>``, and ``course-grading`` for anyone watching), so
the tries are counted wherever they ran: a worker killed in the middle of a submission (Dask
runs the task again on another worker) costs it one try, a failure that is not the learner's
costs one (this process submits it again), and after :data:`~autograder.grading.task.TRIES`
tries it is marked failed with the reason of each. Ctrl-C cancels what is running and returns
what was not graded.

Example::

    with connect(Workers(jobs=2)) as client:          # a LocalCluster of 2 worker processes
        left = run(client, tasks, "run-1", on_final=print, on_retry=print)
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from .cluster import ClusterUnavailable, WarmUp, configure
from .progress import Progress
from .slurm import Slurm
from .submission import grade_submission
from .task import TRIES, Graded, Task
from .workfolder import sweep

__all__ = ["Workers", "Connection", "connect", "start_line", "run", "grade_on_worker", "died", "TOPIC"]

#: The scheduler event topic every start of a submission on a worker is also logged to.
TOPIC = "course-grading"


@dataclass(frozen=True)
class Workers:
    """Where submissions are graded: ``jobs`` processes here (default: one per core), a ``scheduler``, or ``slurm`` jobs."""

    jobs: int | None = None
    scheduler: Any = None  # "tcp://host:8786", or a Dask Cluster (SLURMCluster, ...) or Client
    slurm: Slurm | None = None

    def __post_init__(self) -> None:
        if self.scheduler is not None and self.slurm is not None:
            raise ValueError("give a Dask scheduler or SLURM settings, not both")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs must be 1 or more (got {self.jobs})")

    @property
    def local(self) -> bool:
        """Whether grading runs on this machine only (a LocalCluster started here)."""
        return self.scheduler is None and self.slurm is None

    def describe(self) -> str:
        if self.slurm is not None:
            return self.slurm.describe()
        if self.scheduler is not None:
            return f"the Dask cluster at {getattr(self.scheduler, 'scheduler_address', self.scheduler)}"
        return "this machine"


@contextmanager
def connect(workers: Workers) -> Iterator[Any]:
    """A Dask client for ``workers``, every worker warmed up; what this started is closed on the way out."""
    from distributed import Client, LocalCluster

    configure()
    cluster = client = None
    owned = True
    try:
        if workers.local:
            cluster = LocalCluster(n_workers=workers.jobs or os.cpu_count() or 1, threads_per_worker=1,
                                   processes=True, dashboard_address=None,
                                   silence_logs=logging.ERROR)
        elif workers.slurm is not None:
            cluster = workers.slurm.cluster()
            cluster.scale(jobs=workers.slurm.jobs)
        elif isinstance(workers.scheduler, Client):
            client, owned = workers.scheduler, False
        elif not isinstance(workers.scheduler, str):
            cluster, owned = workers.scheduler, False  # the caller's cluster: closed by the caller
        if client is None:
            try:
                client = Client(cluster if cluster is not None else workers.scheduler, timeout="20s")
            except OSError as exc:
                raise ClusterUnavailable(
                    f"Cannot reach the Dask scheduler at {workers.scheduler} ({exc}). Start one with `dask scheduler` "
                    f"and workers with `dask worker {workers.scheduler} --nthreads 1`, or check the address.") from exc
        client.register_plugin(WarmUp())
        yield client
    finally:
        if client is not None and owned:
            client.close()
        if cluster is not None and owned:
            cluster.close()
            if workers.local:  # a run stopped by Ctrl-C leaves the folders its workers were grading in
                sweep()


class Connection:
    """:func:`connect` begun in a thread of its own: the cluster starts and warms up while the run prepares.

    :meth:`client` waits for it (raising what connecting raised); leaving the ``with`` block closes
    what was started.
    """

    def __init__(self, workers: Workers) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._context = connect(workers)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="course-grading-connect")
        self._started = self._pool.submit(self._context.__enter__)

    def client(self) -> Any:
        return self._started.result()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._started.result()
        except BaseException:  # noqa: BLE001 - it never connected: nothing to close (the error was raised by client())
            return
        finally:
            self._pool.shutdown(wait=False)
        self._context.__exit__(None, None, None)


def start_line(count: int, workers: Any, client: Any, sandboxed: bool) -> str:
    """What this run does, where, how many at a time, and how safely (printed once it starts)."""
    plural = "s" if count != 1 else ""
    if workers.local:
        where = f"{workers.jobs} at a time"
    else:
        threads = _threads(client)
        where = f"on {workers.describe()}, {threads} at a time now"
        link = client.dashboard_link if "dashboard" in client.scheduler_info().get("services", {}) else None
        where += f" (dashboard: {link})" if link else ""
    safety = ("each in a sandbox." if sandboxed else
              "WITHOUT a sandbox (--no-sandbox): learners' code runs with your rights.")
    return f"Grading {count} submission{plural}, {where}, {safety}"


# -- the workers ------------------------------------------------------------------------------


_ONE_AT_A_TIME = threading.Lock()  # a worker with several threads still grades one submission at a time


def died(attempt: int, worker: str) -> str:
    """What a record says of a try whose worker process died while it graded."""
    return (f"the worker process grading try {attempt} ({worker}) died: out of memory, or killed "
            "(the workers' own logs say which)")


def _topic(run: str, task: Task) -> str:
    return f"{TOPIC}/{run}/{task.student}/{task.lesson}"


def grade_on_worker(task: Task, run: str, grade: Callable[[Task], Graded] = grade_submission) -> Graded:
    """Grade ``task`` on this Dask worker with ``grade``, as its next try; refused once it has had :data:`TRIES` tries."""
    from distributed import get_client, get_worker

    worker, client = get_worker(), get_client()
    topic = _topic(run, task)
    earlier = [msg for _, msg in client.get_events(topic)]
    if len(earlier) >= TRIES:  # its last try ended its worker, and it has had its tries: not started again
        last = earlier[-1]["worker"]
        graded = Graded(task.student, task.lesson, attempt=len(earlier), failure="infrastructure", worker=last,
                        error=died(len(earlier), last) + f"; it has had its {TRIES} tries")
        graded.log = f"== {task.name}: not tried again\n== infrastructure: {graded.error}\n"
        return graded
    start = {"worker": worker.address, "try": len(earlier) + 1, "pid": os.getpid()}
    # Through the client, not the worker's batched stream: the scheduler has the start before grading begins,
    # even when this process is killed a moment later.
    client.log_event(topic, start)
    client.log_event(TOPIC, {**start, "run": run, "submission": task.name})
    with _ONE_AT_A_TIME:
        graded = grade(replace(task, attempt=len(earlier) + 1))
    graded.worker = f"{worker.address} ({socket.gethostname()})"
    return graded


# -- the run ----------------------------------------------------------------------------------


def _threads(client: Any) -> int:
    try:
        return sum(client.nthreads().values())
    except Exception:  # noqa: BLE001 - the scheduler is briefly busy: carry on with what is known
        return 0


def _failed(task: Task, error: str, attempt: int) -> Graded:
    graded = Graded(task.student, task.lesson, attempt=attempt, failure="infrastructure", error=error)
    graded.log = f"== {task.name}, try {attempt}\n== infrastructure: {error}\n"
    return graded


def _outcome(result: Any, task: Task, starts: list[dict[str, Any]], tried: int) -> Graded | None:
    """The record a finished task gives: its result, or what became of it (its workers died, it was lost);
    None when a worker that died held it before it started (it was not tried).

    ``tried`` is how many of ``starts`` earlier futures of this submission account for: a future queued behind
    a submission that kills its worker dies with it unstarted, and its submission's earlier tries are not its own.
    """
    from distributed.scheduler import KilledWorker

    if isinstance(result, Graded):
        return result
    if isinstance(result, KilledWorker):
        if len(starts) <= tried:
            return None
        return _failed(task, died(len(starts), starts[-1]["worker"]), len(starts))
    return _failed(task, f"{type(result).__name__}: {result}", max(1, len(starts)))


def _landed(results: "queue.Queue[tuple[Task, Any]]", task: Task, future: Any) -> None:
    """A future's done-callback (a thread of the client): fetch the record at once and let the worker drop it.

    A worker that dies holding a finished, unfetched record would make Dask grade it again.
    """
    try:
        outcome = future.result()
    except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which decides
        outcome = exc
    future.release()
    results.put((task, outcome))


def _retried_because(tries: int, said: dict[int, str], starts: list[dict[str, Any]]) -> list[str]:
    """Why each try before the last failed: the reason its record gave, or its worker's death (no record came back)."""
    because = []
    for n in range(1, tries):
        if n in said:
            because.append(said[n])
        elif n <= len(starts):
            because.append(died(n, starts[n - 1]["worker"]))
    return because


def run(client: Any, tasks: list[Task], run_id: str, on_final: Callable[[Graded, list[str]], None],
        on_retry: Callable[[Graded], None], progress: Progress | None = None,
        grade: Callable[[Task], Graded] = grade_submission) -> list[Task]:
    """Grade ``tasks`` on ``client``'s workers; ``on_final(graded, retried_because)`` gets each final record.

    ``on_retry(graded)`` gets a record whose failure is not the learner's and that is tried again.
    ``grade`` grades one task on a worker (an importable function: it travels by name).
    Returns the tasks a Ctrl-C left ungraded (none when the run finished).
    """
    waiting, running = list(tasks), {}
    finished: set[str] = set()  # submissions whose final record on_final took in whole
    results: queue.Queue[tuple[Task, Any]] = queue.Queue()
    why: dict[str, dict[int, str]] = {}  # submission -> try -> why that try failed (tries whose result came back)
    lost: dict[str, int] = {}  # submission -> times a dead worker held it before it started
    tried: dict[str, int] = {}  # submission -> the starts its futures so far account for
    progress = progress or Progress(len(tasks))
    serial = 0
    try:
        while waiting or running:
            threads = _threads(client)
            progress.workers(threads)
            while waiting and len(running) < max(2, 2 * threads):  # a few ahead, so no worker waits for the next
                task = waiting.pop(0)
                serial += 1
                key = f"grade-{task.student}-{task.lesson}-{run_id[:8]}-{serial}"
                future = client.submit(grade_on_worker, task, run_id, grade, key=key, pure=False)
                running[task.name] = (task, future)
                future.add_done_callback(functools.partial(_landed, results, task))
            try:
                task, outcome = results.get(timeout=1.0)
            except queue.Empty:
                progress.show(running=len(running))
                continue
            del running[task.name]
            starts = [msg for _, msg in client.get_events(_topic(run_id, task))]
            graded = _outcome(outcome, task, starts, tried.get(task.name, 0))
            tried[task.name] = len(starts)
            if graded is None:  # never started: not a try, unless that keeps happening
                lost[task.name] = lost.get(task.name, 0) + 1
                graded = _failed(task, "its workers kept dying before it started", max(1, len(starts)))
                if lost[task.name] <= TRIES:
                    waiting.append(task)
                    continue
            if graded.failure == "infrastructure" and graded.attempt < TRIES:
                why.setdefault(task.name, {})[graded.attempt] = graded.error or "no reason given"
                progress.clear()
                on_retry(graded)
                waiting.append(replace(task, attempt=graded.attempt + 1))
                continue
            progress.clear()
            on_final(graded, _retried_because(graded.attempt, why.get(task.name, {}), starts))
            finished.add(task.name)  # a Ctrl-C while it is merged leaves it among the ungraded
            progress.done(ok=graded.status == "ok")
            progress.show(running=len(running))
        progress.clear()
        return []
    except KeyboardInterrupt:
        # Whatever the loop was doing (handing a task to a worker, reading a result, merging it),
        # every submission not finished is left: none falls between the waiting and the running.
        progress.clear()
        client.cancel([future for _, future in running.values()])
        return [task for task in tasks if task.name not in finished]
