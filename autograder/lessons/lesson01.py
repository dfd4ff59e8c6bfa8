"""Lesson 01's graded exercises: who am I (1.1), and sharing a value through a store (1.2).

Exercise 1.1, ``rank_report(rank, world_size)``: return a dict with the keys ``rank``,
``local_rank``, ``group_rank``, ``world_size`` and ``local_world_size``, as ints, read from
the environment variables torchrun sets (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``). The expected answers are computed here from the
layout of the launch, not read back from the ranks' environment.

Exercise 1.2, ``share_run_id(rank, world_size, store, run_id)``: rank 0 is given a run id
(a str), the other ranks None; rank 0 publishes it in ``store`` under the key ``"run_id"``
and every rank returns it as a str. Graded with a TCPStore hosted by rank 0 (rank 0
sometimes late) and with a FileStore.

Hidden test cells and visible self-checks::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("1.1", rank_report, "one_host")        # also "several_hosts"
    exercise("1.1").self_check(rank_report, nnodes=2)     # 4 ranks on nnodes=1 or 2 hosts
    grade("1.2", share_run_id, "share_run_id")
    exercise("1.2").self_check(share_run_id)

"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from typing import Any, Callable

from ..kit.exercise import Attempt, Exercise, Part
from ..kit.pieces import call_learner, plural

__all__ = ["EXERCISES", "exercise_1_1", "exercise_1_2", "KEYS"]

KEYS = ("rank", "local_rank", "group_rank", "world_size", "local_world_size")
_ENV = {"rank": "RANK", "local_rank": "LOCAL_RANK", "group_rank": "GROUP_RANK",
        "world_size": "WORLD_SIZE", "local_world_size": "LOCAL_WORLD_SIZE"}
STORE_HINT = {
    "DistStoreError": "A store's get() or wait() gave up: the key it waited for was never set. "
    "Does rank 0 set exactly the key the other ranks read?"
}


# -- Exercise 1.1 ----------------------------------------------------------------------


def _expected_report(rank: int, world_size: int, nnodes: int) -> dict[str, int]:
    per_host = world_size // nnodes
    return {"rank": rank, "local_rank": rank % per_host, "group_rank": rank // per_host,
            "world_size": world_size, "local_world_size": per_host}


def _judge_report(attempt: Attempt, world_size: int, nnodes: int, replies: list[Any]) -> None:
    layout = f"{plural(world_size, 'rank')} on {plural(nnodes, 'host')}"
    for rank, value in enumerate(replies):
        want = _expected_report(rank, world_size, nnodes)
        where = f"with {layout}, rank {rank}"
        if not isinstance(value, dict):
            attempt.fail(f"{where}: `rank_report` returned {type(value).__name__} {value!r}; "
                         f"it must return a dict with the keys {', '.join(KEYS)}.")
        missing = [k for k in KEYS if k not in value]
        if missing:
            attempt.fail(f"{where}: the dict has no key {missing[0]!r} (keys needed: "
                         f"{', '.join(map(repr, KEYS))}; got {sorted(map(str, value))}).")
        for key in KEYS:
            got = value[key]
            if isinstance(got, bool) or not isinstance(got, int):
                hint = (" Environment variables are always strings: convert with int(os.environ[...])."
                        if isinstance(got, str) else "")
                attempt.fail(f"{where}: {key!r} is {type(got).__name__} {got!r}, not an int.{hint}")
            if got != want[key]:
                hint = ""
                if key in ("local_rank", "group_rank", "local_world_size"):
                    hint = (f" Read it from the environment variable {_ENV[key]}: with several hosts it "
                            "differs from what the rank and world size alone tell you.")
                attempt.fail(f"{where}: {key!r} should be {want[key]}, got {got}.{hint}\n"
                             f"  expected {want}\n  actual   {value}")


def _report(attempt: Attempt, layouts: list[tuple[int, int]]) -> None:
    for world_size, nnodes in layouts:
        result = attempt.run(call_learner, world_size, (attempt.fn,), nnodes=nnodes, timeout=10.0)
        _judge_report(attempt, world_size, nnodes, list(result))


def _self_check_report(attempt: Attempt, nnodes: int = 1) -> str:
    if nnodes not in (1, 2):
        raise ValueError("the self-check of Exercise 1.1 runs 4 ranks on nnodes=1 or nnodes=2")
    _report(attempt, [(4, nnodes)])
    layout = "one host" if nnodes == 1 else "2 hosts of 2"
    more = "1 rank alone" if nnodes == 1 else "3 hosts of 2 and 4 hosts of 1"
    return f"Self-check passed: the right ints on 4 ranks on {layout}. The hidden test also tries {more}."


exercise_1_1 = Exercise(
    number="1.1",
    function="rank_report",
    title="who am I?",
    parts=(
        Part("one_host", 1, "the right ints on 1 rank and on 4 ranks on one host."),
        Part("several_hosts", 1, "the right ints on 2 hosts of 2, 3 hosts of 2 and 4 hosts of 1."),
    ),
    visible_check=_self_check_report,
    hints=STORE_HINT,
)


# -- Exercise 1.2 ----------------------------------------------------------------------


def _has_key(store: Any, key: str) -> bool:
    """Whether ``store`` holds ``key`` now (``Store.check`` is missing from some torch versions)."""
    from datetime import timedelta

    try:
        store.wait([key], timedelta(milliseconds=50))
        return True
    except Exception:  # noqa: BLE001 - the store's timeout error type differs between versions
        return False


def _share_worker(rank: int, world_size: int, fn: Callable, run_id: str, kind: str, path: str,
                  late: float) -> dict[str, Any]:
    from datetime import timedelta

    import torch.distributed as dist

    if kind == "tcp":
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                              is_master=rank == 0, timeout=timedelta(seconds=5))
    else:
        store = dist.FileStore(path, world_size)
        store.set_timeout(timedelta(seconds=5))
    if rank == 0:
        time.sleep(late)  # the others must wait for the value, not assume it is there
    value = fn(rank, world_size, store, run_id if rank == 0 else None)
    published = _has_key(store, "run_id") if rank == 0 else True
    # Rank 0 hosts the TCPStore: it stays until every rank is done with it.
    store.add("grader/finished", 1)
    if rank == 0:
        deadline = time.monotonic() + 5.0
        while store.add("grader/finished", 0) < world_size and time.monotonic() < deadline:
            time.sleep(0.01)
    return {"value": value, "published": published}


def _share(attempt: Attempt, cases: list[tuple[int, str, float]], timeout: float) -> None:
    for world_size, kind, late in cases:
        run_id = f"run-{secrets.token_hex(4)}"
        tmpdir = tempfile.mkdtemp(prefix="grade-store-")
        try:
            label = "a TCPStore hosted by rank 0" if kind == "tcp" else "a FileStore"
            if late:
                label += f", rank 0 {late:g} s late"
            result = attempt.run(_share_worker, world_size,
                                 (attempt.fn, run_id, kind, os.path.join(tmpdir, "store"), late),
                                 init=False, timeout=timeout, context=label)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        for rank, reply in enumerate(result):
            where = f"on {world_size} ranks with {label}, rank {rank}"
            value = reply["value"]
            if isinstance(value, bytes):
                attempt.fail(f"{where} returned bytes {value!r}: a store gives back bytes; return a str with .decode().")
            if value != run_id:
                attempt.fail(f"{where} returned {value!r}; every rank should return rank 0's run id, {run_id!r}."
                             + (" Rank 0 gets it as its `run_id` argument." if rank == 0 else ""))
            if rank == 0 and not reply["published"]:
                attempt.fail(f"{where}: after your function, the store has no key 'run_id'. "
                             "Publish it under exactly that key: store.set('run_id', run_id).")


def _self_check_share(attempt: Attempt) -> str:
    _share(attempt, [(3, "tcp", 0.2)], timeout=10.0)
    return ("Self-check passed: on 3 ranks every rank returned rank 0's run id, though rank 0 "
            "published it 0.2 s late. The hidden test also tries 2 and 4 ranks and a FileStore.")


exercise_1_2 = Exercise(
    number="1.2",
    function="share_run_id",
    title="share rank 0's run id",
    parts=(
        Part("share_run_id", 2, "every rank returns rank 0's run id, through TCPStores (rank 0 late) and a FileStore."),
    ),
    visible_check=_self_check_share,
    hints=STORE_HINT,
)

EXERCISES = (exercise_1_1, exercise_1_2)
