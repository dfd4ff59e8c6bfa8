"""Hidden-test checks for lesson 01: who am I, and sharing a value through a store.

Exercise 1.1, ``rank_report(rank, world_size)``: return a dict with the keys ``rank``,
``local_rank``, ``group_rank``, ``world_size`` and ``local_world_size``, as ints, read from
the environment variables torchrun sets (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``). Graded in two parts::

    check_rank_report(rank_report, part="one_host")       # 1 and 4 ranks on one host
    check_rank_report(rank_report, part="several_hosts")  # 4 ranks on 2 hosts, 6 on 3, 4 on 4

Exercise 1.2, ``share_run_id(rank, world_size, store, run_id)``: rank 0 is given a run id
(a str), the other ranks None; rank 0 publishes it in ``store`` under the key ``"run_id"``
and every rank returns it as a str. Graded in one part, with a TCPStore hosted by rank 0
(rank 0 sometimes late) and with a FileStore::

    check_share_run_id(share_run_id)

``self_check_rank_report(fn, nnodes=1)`` (and ``nnodes=2``) and ``self_check_share_run_id``
are the visible checks.
The expected answers are computed here, from the layout of the launch, not read back from
the ranks' environment.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from typing import Any, Callable, Sequence


from .harness import GradingFailure, require_function, run_ranks

__all__ = [
    "check_rank_report",
    "self_check_rank_report",
    "check_share_run_id",
    "self_check_share_run_id",
    "KEYS",
    "PARTS",
]

KEYS = ("rank", "local_rank", "group_rank", "world_size", "local_world_size")
PARTS = ("one_host", "several_hosts")
LAYOUTS = {  # part -> (world size, simulated hosts)
    "one_host": [(1, 1), (4, 1)],
    "several_hosts": [(4, 2), (6, 3), (4, 4)],
}
_ENV = {"rank": "RANK", "local_rank": "LOCAL_RANK", "group_rank": "GROUP_RANK",
        "world_size": "WORLD_SIZE", "local_world_size": "LOCAL_WORLD_SIZE"}


# -- running ranks ---------------------------------------------------------------------


_STORE_HINT = {
    "DistStoreError": "A store's get() or wait() gave up: the key it waited for was never set. "
    "Does rank 0 set exactly the key the other ranks read?"
}


def _run(part: str, worker: Callable, world_size: int, args: Sequence[Any] = (), *, nnodes: int = 1,
         init: bool = True, timeout: float = 10.0, context: str = ""):
    """``harness.run_ranks`` with the store hint this lesson's exercises need."""
    return run_ranks(part, worker, world_size, args, nnodes=nnodes, init=init, timeout=timeout,
                     context=context, hints=_STORE_HINT)


def _stub_message(part: str, name: str, exercise: str, text: str) -> GradingFailure:
    return GradingFailure(
        f"{part}: `{name}` still raises NotImplementedError ({text}). Replace the "
        f"`raise NotImplementedError(...)` line of {exercise} with your code, run that cell, "
        "then run this one again."
    )


# -- Exercise 1.1 ----------------------------------------------------------------------


def _report_worker(rank: int, world_size: int, fn: Callable) -> dict[str, Any]:
    try:
        return {"value": fn(rank, world_size)}
    except NotImplementedError as exc:
        return {"stub": str(exc) or "NotImplementedError"}


def _expected_report(rank: int, world_size: int, nnodes: int) -> dict[str, int]:
    per_host = world_size // nnodes
    return {"rank": rank, "local_rank": rank % per_host, "group_rank": rank // per_host,
            "world_size": world_size, "local_world_size": per_host}


def _judge_report(part: str, world_size: int, nnodes: int, replies: list[dict]) -> None:
    layout = f"{world_size} rank{'s' if world_size != 1 else ''} on {nnodes} host{'s' if nnodes != 1 else ''}"
    for rank, reply in enumerate(replies):
        if "stub" in reply:
            raise _stub_message(part, "rank_report", "Exercise 1.1", reply["stub"])
        value, want = reply["value"], _expected_report(rank, world_size, nnodes)
        where = f"{part}: with {layout}, rank {rank}"
        if not isinstance(value, dict):
            raise GradingFailure(f"{where}: `rank_report` returned {type(value).__name__} {value!r}; "
                                 f"it must return a dict with the keys {', '.join(KEYS)}.")
        missing = [k for k in KEYS if k not in value]
        if missing:
            raise GradingFailure(f"{where}: the dict has no key {missing[0]!r} (keys needed: "
                                 f"{', '.join(map(repr, KEYS))}; got {sorted(map(str, value))}).")
        for key in KEYS:
            got = value[key]
            if isinstance(got, bool) or not isinstance(got, int):
                hint = (" Environment variables are always strings: convert with int(os.environ[...])."
                        if isinstance(got, str) else "")
                raise GradingFailure(f"{where}: {key!r} is {type(got).__name__} {got!r}, not an int.{hint}")
            if got != want[key]:
                hint = ""
                if key in ("local_rank", "group_rank", "local_world_size"):
                    hint = (f" Read it from the environment variable {_ENV[key]}: with several hosts it "
                            "differs from what the rank and world size alone tell you.")
                raise GradingFailure(f"{where}: {key!r} should be {want[key]}, got {got}.{hint}\n"
                                     f"  expected {want}\n  actual   {value}")


def _check_report(fn: Any, part: str, layouts: list[tuple[int, int]], timeout: float) -> None:
    fn = require_function(fn, "rank_report", "Exercise 1.1")
    for world_size, nnodes in layouts:
        result = _run(part, _report_worker, world_size, (fn,), nnodes=nnodes, timeout=timeout)
        _judge_report(part, world_size, nnodes, list(result))


def check_rank_report(fn: Any, part: str) -> None:
    """Grade one part of Exercise 1.1; raises GradingFailure with feedback."""
    if part not in LAYOUTS:
        raise ValueError(f"unknown part {part!r}; use one of {PARTS}")
    _check_report(fn, part, LAYOUTS[part], timeout=10.0)


def self_check_rank_report(fn: Any, nnodes: int = 1) -> None:
    """The visible check of Exercise 1.1: 4 ranks on ``nnodes`` (1 or 2) simulated hosts."""
    if nnodes not in (1, 2):
        raise ValueError("self_check_rank_report runs 4 ranks on nnodes=1 or nnodes=2")
    _check_report(fn, "self-check", [(4, nnodes)], timeout=10.0)
    layout = "one host" if nnodes == 1 else "2 hosts of 2"
    more = "1 rank alone" if nnodes == 1 else "3 hosts of 2 and 4 hosts of 1"
    print(f"Self-check passed: the right ints on 4 ranks on {layout}. The hidden test also tries {more}.")


# -- Exercise 1.2 ----------------------------------------------------------------------


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
    try:
        value = fn(rank, world_size, store, run_id if rank == 0 else None)
    except NotImplementedError as exc:
        return {"stub": str(exc) or "NotImplementedError"}
    published = store.check(["run_id"]) if rank == 0 else True
    # Rank 0 hosts the TCPStore: it stays until every rank is done with it.
    store.add("grader/finished", 1)
    if rank == 0:
        deadline = time.monotonic() + 5.0
        while store.add("grader/finished", 0) < world_size and time.monotonic() < deadline:
            time.sleep(0.01)
    return {"value": value, "published": published}


def _check_share(fn: Any, part: str, cases: list[tuple[int, str, float]], timeout: float) -> None:
    fn = require_function(fn, "share_run_id", "Exercise 1.2")
    for world_size, kind, late in cases:
        run_id = f"run-{secrets.token_hex(4)}"
        tmpdir = tempfile.mkdtemp(prefix="grade-store-")
        try:
            label = "a TCPStore hosted by rank 0" if kind == "tcp" else "a FileStore"
            if late:
                label += f", rank 0 {late:g} s late"
            result = _run(part, _share_worker, world_size,
                          (fn, run_id, kind, os.path.join(tmpdir, "store"), late),
                          init=False, timeout=timeout, context=label)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        for rank, reply in enumerate(result):
            if "stub" in reply:
                raise _stub_message(part, "share_run_id", "Exercise 1.2", reply["stub"])
            where = f"{part}: on {world_size} ranks with {label}, rank {rank}"
            value = reply["value"]
            if isinstance(value, bytes):
                raise GradingFailure(f"{where} returned bytes {value!r}: a store gives back bytes; "
                                     "return a str with .decode().")
            if value != run_id:
                raise GradingFailure(f"{where} returned {value!r}; every rank should return rank 0's "
                                     f"run id, {run_id!r}."
                                     + (" Rank 0 gets it as its `run_id` argument." if rank == 0 else ""))
            if rank == 0 and not reply["published"]:
                raise GradingFailure(f"{where}: after your function, the store has no key 'run_id'. "
                                     "Publish it under exactly that key: store.set('run_id', run_id).")


def check_share_run_id(fn: Any) -> None:
    """Grade Exercise 1.2 on TCPStores and a FileStore; raises GradingFailure with feedback."""
    _check_share(fn, "share_run_id", [(2, "tcp", 0.0), (4, "tcp", 0.3), (3, "file", 0.2)], timeout=12.0)


def self_check_share_run_id(fn: Any) -> None:
    """The visible check of Exercise 1.2: 3 ranks and a TCPStore, rank 0 late."""
    _check_share(fn, "self-check", [(3, "tcp", 0.2)], timeout=10.0)
    print("Self-check passed: on 3 ranks every rank returned rank 0's run id, though rank 0 "
          "published it 0.2 s late. The hidden test also tries 2 and 4 ranks and a FileStore.")
