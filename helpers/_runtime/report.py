"""How a request to the ranks ended, and the one place that turns it into an exception.

:class:`Outcome` is what :class:`helpers._runtime.group.RankGroup` returns for a request: the
replies, the failures and the evidence that explains them. :func:`outcome_error` turns it
into the notebook's exception, for launches and persistent ranks alike: the root cause's
own error (:func:`failure_error` for a rank that raised, :func:`death_error` for one that
died) when a rank failed, else, when ranks had not started the request within the start-up
limit, the start-up report (:func:`startup_report`), else the hang report (a
:class:`~helpers.DeadlockError` when the ranks were found deadlocked before the timeout).
:func:`kept_ranks_error` adds, for persistent ranks, what state the group is left in, :func:`unusable_rank_error` says why a
rank cannot take the next request, and :func:`interrupted_launch`, :func:`interrupted_cell`
and :func:`not_interrupted_note` word what the stop button ended. Decisions here read typed
fields (the cause's class, the board's records, the hang's :class:`~helpers._runtime.diagnose.Finding`
kinds), never the text of a message.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from . import diagnose
from .deadlock import Deadlock
from ..errors import ClusterError, DeadlockError, Interrupted, LaunchError, LaunchTimeoutError, RankFailedError
from .board import BoardRecord
from .cells import relabel_traceback
from .protocol import Death, Failure, Result

__all__ = [
    "Outcome",
    "outcome_error",
    "cause_error",
    "failure_error",
    "death_error",
    "group_stopped_error",
    "kept_ranks_error",
    "unusable_rank_error",
    "interrupted_launch",
    "interrupted_cell",
    "not_interrupted_note",
    "stopped_ranks",
    "signal_name",
    "hang_report",
    "startup_report",
    "earliest",
    "in_distributed_call",
]


@dataclass
class Outcome:
    """How a request to several ranks ended, with the evidence that explains it."""

    replies: dict[int, Result] = field(default_factory=dict)
    failures: list[Failure | Death] = field(default_factory=list)  # errors and unexpected exits
    pending: list[int] = field(default_factory=list)  # ranks still busy when waiting stopped
    unstarted: list[int] = field(default_factory=list)  # pending ranks that had not started the request
    start_limit: float = 0.0  # the seconds they had to start it
    cause: Failure | Death | None = None  # the root cause among the failures
    diag: str = ""  # what the cause wrote on its diagnostics stream during the request
    board: list[BoardRecord] = field(default_factory=list)  # when waiting stopped, with pending ranks
    stacks: dict[int, str] = field(default_factory=dict)  # pending rank -> its Python stacks
    main_threads: dict[int, int | None] = field(default_factory=dict)
    # Set when waiting stopped because pending ranks were found deadlocked (helpers._runtime.deadlock),
    # rather than at the timeout.
    deadlock: Deadlock | None = None

    @property
    def ok(self) -> bool:
        return not self.failures and not self.pending

    @property
    def finished(self) -> list[int]:
        return sorted(self.replies)


def failure_error(failure: Failure, world_size: int, stopped: list[int], note: str = "") -> RankFailedError:
    """The notebook's error for a rank that raised; ``note`` is added as a last paragraph."""
    err, rank = failure.error, failure.rank
    phase = {"init": " while setting up its process group",
             "load": " while loading what was sent to it"}.get(err.phase, "")
    if err.type == "SystemExit":
        head = f"rank {rank} of {world_size} called sys.exit({err.message}){phase}"
    else:
        head = f"rank {rank} of {world_size} raised {err.type}{phase}: {err.message}"
    lines = relabel_traceback(err.text).rstrip().splitlines()
    if lines and lines[0].startswith("Traceback"):
        lines = lines[1:]
    message = f"{head}\n\nTraceback from rank {rank} (most recent call last):\n" + "\n".join(lines)
    return RankFailedError(
        message + (f"\n\n{note}" if note else ""),
        rank=rank,
        world_size=world_size,
        exc_type=err.type,
        exc_message=err.message,
        rank_traceback=err.text,
        exitcode=None,
        original=err.original(),
        frames=list(err.frames),
        stopped=list(stopped),
    )


def death_error(death: Death, world_size: int, stopped: list[int], note: str = "", diag: str = "") -> RankFailedError:
    """The notebook's error for a rank that died; ``diag`` is what faulthandler wrote (a crash's stack)."""
    code = death.code if death.code is not None else 1
    if code < 0:
        how = f"was killed by {signal_name(code)} (exit code {code})"
        hint = (" A SIGKILL often means the machine ran out of memory; SIGSEGV or SIGABRT point at a "
                "crash inside C++ code.")
    else:
        how = f"exited with code {code} before returning"
        hint = " A call to os._exit, or a crash in C code, ends a rank without a Python exception."
    message = f"rank {death.rank} of {world_size} {how}.{hint}"
    threads = diagnose.parse_dump(diag) if diag.strip() else []
    if threads and threads[-1]["frames"]:
        message += "\n\nIts last Python stack:\n" + diagnose.format_stack(threads[-1]["frames"])
    return RankFailedError(
        message + (f"\n\n{note}" if note else ""),
        rank=death.rank,
        world_size=world_size,
        exc_type=None,
        exc_message=how,
        rank_traceback="",
        exitcode=code,
        original=None,
        frames=[],
        stopped=list(stopped),
    )


def cause_error(cause: Failure | Death, world_size: int, stopped: list[int], note: str = "",
                diag: str = "") -> RankFailedError:
    """The notebook's error for one rank's failure or death (see :func:`failure_error`, :func:`death_error`)."""
    if isinstance(cause, Failure):
        return failure_error(cause, world_size, stopped, note=note)
    return death_error(cause, world_size, stopped, note=note, diag=diag)


def earliest(failures: list[Failure | Death]) -> Failure | Death:
    """The root cause: a rank that died, else the first failure in time.

    Later failures are usually echoes of the first. A death is the exception: its peers'
    collectives fail at once ("Connection reset by peer") and their errors can reach us
    before the factory reports the death, so a rank that died without an error of its own
    comes first.
    """
    raised = {f.rank for f in failures if isinstance(f, Failure)}
    deaths = [f for f in failures if isinstance(f, Death) and f.rank not in raised]
    return min(deaths or failures, key=lambda f: (f.time, f.rank))


def in_distributed_call(failure: Failure | Death) -> bool:
    """Whether an error was raised inside torch.distributed (maybe because a peer died)."""
    if not isinstance(failure, Failure) or not failure.error.frames:
        return False
    return diagnose.is_distributed(failure.error.frames[-1].filename)


def outcome_error(
    outcome: Outcome,
    world_size: int,
    timeout: float,
    *,
    what: str = "The ranks",
    note: str = "",
    stopped: list[int] = (),
) -> LaunchError:
    """The exception for a request that did not end well.

    ``what`` names what ran ("The cell"); ``timeout`` is the request's (ranks that had not
    started it, ``outcome.unstarted``, are reported with ``outcome.start_limit``); ``note``
    says what was done about the other ranks (added after a failure's traceback, or in a hang report's
    first line); ``stopped`` lists the ranks stopped because of a failure.
    """
    if outcome.cause is not None:
        return cause_error(outcome.cause, world_size, list(stopped), note=note, diag=outcome.diag)
    if outcome.unstarted:
        return startup_report(outcome, world_size, outcome.start_limit or timeout, what=what, recovery=note)
    return hang_report(outcome, world_size, timeout, what=what, recovery=note)


def group_stopped_error(outcome: Outcome, live: list[int], world_size: int, timeout: float,
                        what: str = "The ranks") -> LaunchError:
    """The error for a request after which the whole group is stopped (``live``: its ranks
    still running): the failure's other ranks, or every rank of a hang, are named as stopped."""
    if outcome.cause is None:
        return outcome_error(outcome, world_size, timeout, what=what, note="All ranks were stopped.")
    stopped = [r for r in live if r != outcome.cause.rank]
    many = len(stopped) > 1
    note = (f"The other rank{'s' if many else ''} ({', '.join(map(str, stopped))}) "
            f"{'were' if many else 'was'} stopped.") if stopped else ""
    return outcome_error(outcome, world_size, timeout, what=what, note=note, stopped=stopped)


#: The advice a hang report adds for each kind of finding that has one, in this order.
_FIXES = {
    diagnose.RECEIVE_FIRST: "Fix: let some ranks send first (for example even ranks send while odd ranks "
                            "receive), or post the receives with irecv and wait after sending.",
    diagnose.SEND_FIRST: "Fix: let some ranks receive first (for example even ranks send while odd ranks "
                         "receive), or send with isend and wait after receiving.",
    diagnose.CALLS_DISAGREE: "Fix: every rank must make the same collectives in the same order, with tensors of "
                             "the same size and dtype. Compare what each rank passes, or set "
                             "TORCH_DISTRIBUTED_DEBUG=DETAIL before the group is created: it checks every "
                             "collective across ranks and names what differs.",
}


def hang_report(
    outcome: Outcome, world_size: int, timeout: float, what: str = "The ranks", recovery: str = ""
) -> LaunchTimeoutError:
    """The error for ranks still running at the timeout, from their stacks and the board.

    When waiting stopped because ranks were found deadlocked (``outcome.deadlock``), the
    same report is a :class:`~helpers.DeadlockError` whose first line says so.
    """
    busy = outcome.pending
    frames = {r: diagnose.main_stack(outcome.stacks.get(r, ""), outcome.main_threads.get(r)) for r in busy}
    stacks = {r: diagnose.format_stack(frames[r]) for r in busy}
    waiting, findings = diagnose.explain_hang(outcome.board, frames, busy, outcome.finished)
    notes = [f.text for f in findings]
    finished = outcome.finished
    deadlock = outcome.deadlock
    if deadlock is not None:
        stuck = deadlock.ranks
        head = (f"{what} deadlocked: found after {deadlock.seconds:.1f} s, "
                f"rank{'s' if len(stuck) != 1 else ''} {', '.join(map(str, stuck))} of {world_size} "
                f"{'are blocked in point-to-point calls' if len(stuck) != 1 else 'is blocked in a point-to-point call'} "
                f"that no rank can ever match. {recovery}")
    else:
        head = (f"{what} did not finish within {timeout:g} s: "
                f"{len(busy)} of {world_size} rank{'s' if world_size != 1 else ''} still running. {recovery}")
    lines = [head.rstrip(), ""]
    lines += [waiting[r] for r in busy]
    if finished:
        lines.append(f"finished: rank{'s' if len(finished) > 1 else ''} {', '.join(map(str, finished))}")
    if notes:
        lines += ["", *notes]
    kinds = {f.kind for f in findings}
    lines += [fix for kind, fix in _FIXES.items() if kind in kinds]
    evidence = dict(timeout=timeout, stacks=stacks, waiting=waiting, finished=finished, notes=notes,
                    findings=list(findings), unstarted=[])
    if deadlock is not None:
        lines += ["", "Each rank's full stack is on the error's .stacks."]
        return DeadlockError("\n".join(lines), **evidence, seconds=deadlock.seconds, ranks=list(deadlock.ranks))
    lines += ["", "Each rank's full stack is on the error's .stacks. If the work is just slow, pass "
              "a larger timeout=."]
    return LaunchTimeoutError("\n".join(lines), **evidence)


def startup_report(outcome: Outcome, world_size: int, limit: float, what: str = "The ranks",
                   recovery: str = "") -> LaunchTimeoutError:
    """The error for ranks that had not started a request after ``limit`` seconds (``outcome.unstarted``).

    Start-up (forking, joining the process group, loading what was sent) is not the learner's
    code, so this says where each late rank was in it and nothing about the code: the
    error's ``unstarted`` lists those ranks (empty on a hang report), ``waiting`` says where
    each was, ``stacks`` holds the stacks read.
    """
    late, board = outcome.unstarted, {rec.rank: rec for rec in outcome.board}
    frames = {r: diagnose.main_stack(outcome.stacks.get(r, ""), outcome.main_threads.get(r)) for r in outcome.pending}
    waiting = {r: _not_started(r, board.get(r), frames[r]) for r in late}
    running = [r for r in outcome.pending if r not in late]
    lines = [f"{what} did not start within {limit:g} s: {_ranks(late).lower()} of {world_size} had not started. "
             f"{recovery}".rstrip(), "", *waiting.values()]
    if running:
        lines.append(f"started: {_ranks(running).lower()} (running, maybe waiting for the others)")
    if outcome.finished:
        lines.append(f"finished: {_ranks(outcome.finished).lower()}")
    lines += ["", f"Start-up (forking a rank, joining the process group, loading the function sent and the modules it "
              f"imports) has its own limit, {limit:g} s; timeout= counts only your code, from the moment every rank "
              "started it. A very busy machine, or a module that takes this long to import, is the likely cause: "
              "free the machine and run it again. Each rank's stack is on the error's .stacks."]
    stacks = {r: diagnose.format_stack(f) for r, f in frames.items()}
    return LaunchTimeoutError("\n".join(lines), timeout=limit, stacks=stacks, waiting=waiting,
                              finished=outcome.finished, notes=[], findings=[], unstarted=list(late))


def _not_started(rank: int, record: BoardRecord | None, frames: list[dict]) -> str:
    """One sentence: where in its start-up a rank was (the board says whether it had joined)."""
    if record is None or record.phase == "starting":
        return diagnose.summarize(rank, frames, record)
    user = diagnose.describe_wait([f for f in frames if not f["filename"].startswith("<frozen")])["user"]
    code = diagnose.source_line(user) if user else ""
    at = f" at {diagnose.frame_label(user)}" + (f": {code}" if code else "") if user else ""
    return (f"rank {rank} was still loading what was sent to it (unpickling the function and its arguments "
            f"imports the modules they use){at}")


def _ranks(ranks: list[int]) -> str:
    """``Rank 1`` or ``Ranks 0, 2``."""
    return f"Rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def kept_ranks_error(outcome: Outcome, world_size: int, timeout: float, *, deadlocked: list[int], stuck: list[int],
                     what: str = "The call") -> LaunchError:
    """The error for a request on persistent ranks (:class:`helpers.Cluster`), saying what
    state the group is left in: ``deadlocked`` ranks were not tried (an interrupt cannot
    reach them inside gloo), ``stuck`` ones did not stop when interrupted, the others were
    interrupted and keep their variables.
    """
    if outcome.cause is None:
        if deadlocked:
            blocked = sorted(deadlocked + stuck)
            note = (f"{_ranks(blocked)} {'are' if len(blocked) > 1 else 'is'} blocked for good inside "
                    "communication calls, where an interrupt cannot reach them: run %dist_restart (or "
                    "cluster.restart()) for a fresh group.")
        else:
            note = ("They were interrupted and keep their variables." if not stuck else
                    f"{_ranks(stuck)} could not be interrupted (blocked in a communication call): run "
                    "%dist_restart (or cluster.restart()) for a fresh group.")
        return outcome_error(outcome, world_size, timeout, what=what, note=note)
    extra = []
    if outcome.finished:
        extra.append(f"{_ranks(outcome.finished)} finished this request.")
    if stuck:
        board = {rec.rank: rec for rec in outcome.board}
        waits = [diagnose.summarize(r, diagnose.main_stack(outcome.stacks.get(r, ""), outcome.main_threads.get(r)),
                                    board.get(r)) for r in stuck]
        extra.append("Still blocked: " + "; ".join(waits) + ".")
        extra.append("Run %dist_restart (or cluster.restart()) for a fresh group.")
    elif isinstance(outcome.cause, Death):
        extra.append("A rank died, so the group is broken: run %dist_restart (or cluster.restart()).")
    else:
        extra.append("The other ranks keep their variables.")
    return outcome_error(outcome, world_size, timeout, what=what, note=" ".join(extra))


def stopped_ranks(ranks: list[int]) -> str:
    """How a stopped launch's ranks are named: ``stopped ranks 0, 1``, or that none was running.

    >>> stopped_ranks([0, 1]), stopped_ranks([])
    ('stopped ranks 0, 1', 'no rank was running')
    """
    return f"stopped rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else "no rank was running"


def interrupted_launch(stopped: list[int]) -> Interrupted:
    """The error for a launch the stop button ended; ``stopped``: the ranks still running then."""
    return Interrupted(f"the launch was interrupted; {stopped_ranks(stopped)}.")


def interrupted_cell(busy: list[int], stuck: list[int]) -> Interrupted:
    """The error for a request on persistent ranks the stop button ended: ``busy`` ranks were
    interrupted, ``stuck`` ones did not stop (blocked in a communication call)."""
    where = f"rank{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))}" if busy else "no busy rank"
    still = f"; still blocked: {', '.join(map(str, stuck))} (run %dist_restart)" if stuck else ""
    return Interrupted(f"the cell was interrupted on {where}{still}.")


def not_interrupted_note(stuck: list[int]) -> str:
    """The note for persistent ranks an interrupt did not stop (blocked in a communication call)."""
    return (f"Rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck))} did not stop: blocked inside a "
            "communication call, which cannot be interrupted. Run %dist_restart (or cluster.restart()) for a "
            "fresh group.")


def unusable_rank_error(rank: int, state: str, exitcode: int | None) -> ClusterError | None:
    """Why a persistent rank cannot take a request (its ``state``: exited, busy), or None when it can.

    >>> print(unusable_rank_error(1, "exited", -9))
    rank 1 was killed by SIGKILL earlier, so the process group is broken. Run %dist_restart (or cluster.restart()) for a fresh group; variables on the ranks are lost.
    """
    if state == "exited":
        how = (f"was killed by {signal_name(exitcode)}" if exitcode is not None and exitcode < 0
               else f"exited with code {exitcode}")
        return ClusterError(
            f"rank {rank} {how} earlier, so the process group is broken. Run %dist_restart "
            "(or cluster.restart()) for a fresh group; variables on the ranks are lost."
        )
    if state == "busy":
        return ClusterError(
            f"rank {rank} is still busy with an earlier request (probably blocked in a "
            "communication call nobody answers). Run %dist_restart (or cluster.restart()) "
            "for a fresh group, or target other ranks with --ranks."
        )
    return None


def signal_name(code: int) -> str:
    """``SIGKILL`` for an exit code of -9 (a process killed by a signal)."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
