"""What every grading worker is given, and the check that a cluster's workers may grade.

Every Dask worker that grades (a ``LocalCluster``'s, a running cluster's, a SLURM job's) is
warmed up once by :class:`WarmUp` (nbgrader imported, the work folders that killed workers left
behind cleared), then grades one submission after another.
:func:`configure` sets what this process's Dask scheduler and log do. Before a run on a
cluster, :func:`check` asks every worker whether it can start the grading sandbox and runs
the same course code as this machine, and refuses the cluster otherwise, naming the workers.

Example::

    with Client("tcp://grader-1:8786") as client:
        client.register_plugin(WarmUp())
        check(client, sandboxed=True)      # ClusterUnavailable: which workers, and the install line
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .submission import warm_up
from .task import TRIES

__all__ = ["DASK_ENV", "WarmUp", "ClusterUnavailable", "configure", "check", "code_fingerprint"]

#: Seconds to wait for a cluster's first worker before saying that none is there.
FIRST_WORKER_TIMEOUT = float(os.environ.get("COURSE_FIRST_WORKER_TIMEOUT", "60"))


class ClusterUnavailable(RuntimeError):
    """The Dask cluster cannot be reached, has no workers, or has workers that must not grade; the message says why."""


#: Dask settings for grading, as ``DASK_*`` environment variables (how a SLURM job's workers get them). A grading
#: worker runs one long task at a time, mostly waiting for the kernel: Dask's own sampling (a profile of the
#: running thread every 10 ms, an event-loop check every 20 ms, memory every 100 ms) cost a core about a tenth of
#: its time on a 2-core machine, and told nothing here; work stealing has nothing to balance.
DASK_ENV = {
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__GIL__ENABLED": "False",
    "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "1s",
    "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False",
}


def configure() -> None:
    """Dask's settings for grading in this process, and in the workers it starts (:data:`DASK_ENV`).

    The scheduler lets a submission's task run again after its worker died, up to :data:`TRIES` times and
    once more (the course's own count refuses that last run with the reason); Dask's own log stays quiet.
    """
    import dask

    settings = {"distributed.scheduler.allowed-failures": TRIES}
    for name, value in DASK_ENV.items():
        key = "distributed." + name.removeprefix("DASK_DISTRIBUTED__").lower().replace("__", ".").replace("_", "-")
        settings[key] = {"False": False, "True": True}.get(value, value)
    dask.config.set(settings)
    logging.getLogger("distributed").setLevel(logging.ERROR)


class WarmUp(WorkerPlugin):
    """A Dask worker plugin: each worker process imports nbgrader once."""

    name = "course-grading-warm-up"
    idempotent = True

    async def setup(self, worker: Any) -> None:
        import asyncio

        await asyncio.get_running_loop().run_in_executor(None, warm_up)


def code_fingerprint() -> str:
    """A digest of the course code a process runs (the helpers and autograder packages' modules)."""
    from .sandbox import PACKAGE_DIRS

    digest = hashlib.sha256()
    for package in PACKAGE_DIRS:
        for path in sorted(package.rglob("*.py")):
            digest.update(path.relative_to(package.parent).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _worker_state() -> dict[str, Any]:
    from .sandbox import problem

    return {"host": socket.gethostname(), "sandbox": problem(), "code": code_fingerprint()}


def check(client: Any, sandboxed: bool, wait: bool = True) -> dict[str, dict[str, Any]]:
    """Every connected worker's host, sandbox and code; raises :class:`ClusterUnavailable` when one must not grade.

    With ``wait``, waits for a first worker (a cluster whose workers are still starting).
    """
    from .sandbox import install_hint

    if wait:
        try:
            client.wait_for_workers(1, timeout=FIRST_WORKER_TIMEOUT)
        except TimeoutError:
            raise ClusterUnavailable(
                f"No Dask worker joined the scheduler at {client.scheduler.address} within {FIRST_WORKER_TIMEOUT:g} s. "
                f"Start some with `dask worker {client.scheduler.address} --nthreads 1 --nworkers N` (from this "
                "course's virtual environment, on machines with bubblewrap).") from None
    states = client.run(_worker_state)
    mine = code_fingerprint()
    wrong = []
    unsandboxed = sorted(address for address, state in states.items() if sandboxed and state["sandbox"])
    for address in unsandboxed:
        wrong.append(f"  {address} ({states[address]['host']}) cannot sandbox learners' code: "
                     f"{states[address]['sandbox']}.")
    for address, state in sorted(states.items()):
        if state["code"] != mine:
            wrong.append(f"  {address} ({state['host']}) runs other course code than this machine (its helpers and "
                         f"autograder modules differ: {state['code']} there, {mine} here); install this commit "
                         "there.")
    several = sorted(address for address, n in client.nthreads().items() if n > 1)
    if several:
        print(f"Note: {', '.join(several)} run several threads each, and grade one submission at a time all the same: "
              "start grading workers with `dask worker ... --nthreads 1 --nworkers N` instead.", flush=True)
    if wrong:
        hint = f"\n{install_hint()}\nTo grade without a sandbox anyway, pass --no-sandbox." if unsandboxed else ""
        raise ClusterUnavailable("These Dask workers must not grade:\n" + "\n".join(wrong) + hint)
    return states
