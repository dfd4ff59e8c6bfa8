"""Finding a deadlock as it forms: ranks blocked in point-to-point calls nobody can match.

A learner's deadlock (a ring where every rank calls ``recv`` first) used to wait out the
launch timeout before its hang report. While the notebook waits for a request, it now
reads the board (:class:`helpers._runtime.board.Board`) a few times a second; when some ranks
are blocked in point-to-point calls that provably can never complete, it stops at once
with the same report (:class:`helpers.DeadlockError`, a
:class:`~helpers.LaunchTimeoutError`). The timeout stays the last resort for what the
board cannot show: an endless loop, a collective one rank never calls.

What the board holds, per rank: the call it is in (phase, call, peer, when it entered
it), and four message counts per peer kept by its wrappers (:class:`P2PCounts`): sends
posted and sends seen complete, receives posted and receives seen complete. "Posted"
goes up before the call enters torch, "complete" after the blocking call returned or
after ``wait()`` on its request returned (a request nobody waited for never counts as
complete; that only makes the rules below more cautious).

The rules (:func:`stuck_ranks`), for rank R blocked on a call to or from peer P:

- R waits in ``recv`` (or ``wait()`` on an ``irecv``) from P: it cannot go on by itself
  when every send P ever posted to R was already taken by a receive R saw complete
  (``sends_posted[P->R] <= recvs_done[R<-P]``): a receive from one source is matched
  only by that source's sends, each by one receive, whatever the tags.
- R waits in ``send`` (or ``wait()`` on an ``isend``) to P: it cannot go on by itself when
  P has no receive from R outstanding (``recvs_posted[P<-R] == recvs_done[P<-R]``) and
  P has not completed more receives from R than R has completed sends to P (else one of
  them took R's send, and R is about to return). This relies on gloo's rendezvous: a
  send moves only once its receive is posted, so every send R saw complete was taken by
  one of P's receives.
- A blocked rank is *live* if its call can go on by itself, or if its peer is live; a
  rank that is running Python, starting, idle with a request not yet answered, or in any
  call other than these four, is live. Finished ranks (they answered this request, or,
  on persistent ranks, were not asked and are idle) are not, and never post again.
- What is left, blocked ranks that are not live, is a deadlock: each waits on a peer
  that can never post what it needs. The rules read only those ranks' slots and the
  counts between them and their peers, so the set is deadlocked whatever other ranks
  do; this goes beyond "every rank blocked" (ranks 0 and 1 in a receive cycle while
  ranks 2 and 3 wait in an all_reduce for them is found too). It is reported only when
  it includes a rank the request waits for.

Collectives are left to the timeout: a rank in one counts as live. Their counts
(``world_seq``) miss calls made below the Python functions (DDP's built-in hooks, FSDP2,
DTensor), so no rule about them could be proved safe here.

What switches detection off, for the whole group, for the rest of the ranks' life (the
slot's :data:`~helpers._runtime.board.FLAG_UNSURE`; conservative: the counts no longer tell
the whole story, and a miss only means the timeout reports it):

- a receive from any source (``src=None``): it may be matched by any peer;
- ``send_object_list`` / ``recv_object_list`` (two messages each, the inner calls not
  counted) and ``batch_isend_irecv`` (its requests are not counted);
- a point-to-point call or wait made while the rank runs other Python threads, or from
  one of them: the board shows one call per rank, and another thread may be about to
  send what the shown call waits for;
- a point-to-point call on a tensor off the CPU: nccl's sends can finish before their
  receive is posted, and the send rule relies on gloo's never doing so (for the same
  reason nothing is watched unless the group's backend includes gloo).

A wait with a timeout of its own (``work.wait(timeout)``) is live: it can return with no
peer's help. A call on a group the rank is not in does nothing in torch and is not
counted. Communication below the Python functions (a ``ProcessGroup``'s own ``send``) is
not counted either: code that mixes it with ``dist.send``/``dist.recv`` can be misjudged.
A request completed twice (a second ``wait()``) is counted once: counting it again would
make a receive look unmatched, the one direction in which a wrong count is not cautious.

Reading the board while ranks write it: a state is believed only when two reads at
least :data:`STABLE` seconds apart, each the slots then the counts, give the same slots
(each write stamps the time, so a rank that left its call and came back differs) and the
same counts (they only grow). Then nothing changed from the first read's counts to the
second read's slots, and what was read is one consistent moment. The order of the
wrappers' writes makes a call that finished but has not yet returned to Python harmless
without any waiting: a message is counted posted before it can exist, and complete only
after the board stopped saying "call". The half second is a margin for what the model
does not see, and is why a deadlock is reported about a second after it forms.

Where this goes beyond the first design (a deadlock only when every rank of the request
is blocked or finished): a closed set of stuck ranks is reported whatever the other ranks
do (above); ranks outside a persistent-rank request count as finished only while their
slot says idle (one still busy with an earlier request, say blocked in a ``recv`` this
request's ``send`` will match, is judged by its slot like the others, and a dead one is
live); a target whose slot says idle but whose answer has not arrived is live (it may
not have read the request yet); and the guards above (threads, tensors off the CPU,
timed waits, groups the rank is not in, waits counted once, gloo only).

Example::

    >>> from helpers._runtime.board import BoardRecord, P2PCounts
    >>> board = [BoardRecord(0, "call", "recv", peer=1), BoardRecord(1, "call", "recv", peer=0)]
    >>> stuck_ranks(board, P2PCounts.zero(2), finished=set())
    [0, 1]
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

from .board import RECVS_DONE, RECVS_POSTED, SENDS_DONE, SENDS_POSTED, Board, BoardRecord, P2PCounts

__all__ = ["Deadlock", "DeadlockWatch", "stuck_ranks", "blocked_on", "STABLE", "CHECK_EVERY"]

#: Seconds between the two reads that must agree before a deadlock is reported.
STABLE = 0.5
#: The board is read at most this often while a request is waited for.
CHECK_EVERY = 0.2

# (phase, call) -> what the rank waits for: its message to go out, or one to come in.
_BLOCKED = {
    ("call", "send"): "send",
    ("call", "recv"): "recv",
    ("wait", "isend"): "send",
    ("wait", "irecv"): "recv",
}


@dataclass(frozen=True)
class Deadlock:
    """What was found: the ranks that wait for one another (or for a finished rank) for
    good, and how many seconds after the request was sent."""

    ranks: list[int]
    seconds: float


def blocked_on(record: BoardRecord) -> str | None:
    """``"send"`` or ``"recv"`` when the record is a point-to-point call that waits for one
    peer and nothing else (not one with its own timeout), else None.

    >>> blocked_on(BoardRecord(0, "wait", "irecv", peer=1)), blocked_on(BoardRecord(0, "call", "isend", peer=1))
    ('recv', None)
    """
    if record.peer is None or record.timed:
        return None
    return _BLOCKED.get((record.phase, record.call))


def stuck_ranks(board: list[BoardRecord], counts: P2PCounts, finished: Iterable[int]) -> list[int]:
    """The ranks blocked for good in point-to-point calls (empty: none, or cannot tell).

    ``board`` holds one record per rank, ``counts`` every rank's message counts, and
    ``finished`` the ranks that will make no call any more. A rank that is neither
    finished nor blocked (:func:`blocked_on`) is live. Any unsure rank (see the module's
    docstring) makes the answer empty.

    >>> from helpers._runtime.board import BoardRecord as R, P2PCounts
    >>> # rank 1 receives from rank 0, which returned without sending
    >>> stuck_ranks([R(0, "ready"), R(1, "call", "recv", peer=0)], P2PCounts.zero(2), finished={0})
    [1]
    >>> # the same, while rank 0 still runs: it may send yet
    >>> stuck_ranks([R(0, "running"), R(1, "call", "recv", peer=0)], P2PCounts.zero(2), finished=())
    []
    """
    finished = set(finished)
    world = len(board)
    if any(rec.unsure for rec in board):
        return []
    blocked: dict[int, tuple[str, int]] = {}
    for rec in board:
        kind = blocked_on(rec)
        if rec.rank in finished or kind is None or not 0 <= rec.peer < world or rec.peer == rec.rank:
            continue
        blocked[rec.rank] = (kind, rec.peer)

    def can_go_on(rank: int) -> bool:
        kind, peer = blocked[rank]
        if kind == "recv":
            return counts.get(peer, rank, SENDS_POSTED) > counts.get(rank, peer, RECVS_DONE)
        outstanding = counts.get(peer, rank, RECVS_POSTED) > counts.get(peer, rank, RECVS_DONE)
        taken = counts.get(peer, rank, RECVS_DONE) > counts.get(rank, peer, SENDS_DONE)
        return outstanding or taken

    live = {r for r in blocked if can_go_on(r)}
    changed = True
    while changed:
        changed = False
        for rank, (_, peer) in blocked.items():
            if rank in live or peer in finished:
                continue
            if peer not in blocked or peer in live:  # running, in a collective, ... or live itself
                live.add(rank)
                changed = True
    return sorted(r for r in blocked if r not in live)


def _evidence(stuck: list[int], board: list[BoardRecord], counts: P2PCounts, finished: set[int]) -> tuple:
    """Everything the verdict on ``stuck`` rests on: their slots, and the counts between each
    and its peer. Two reads that give the same evidence saw one unchanged state."""
    out = []
    for r in stuck:
        rec = board[r]
        out.append((r, rec.phase, rec.call, rec.peer, rec.start, rec.flags,
                    counts.pair(r, rec.peer), counts.pair(rec.peer, r), rec.peer in finished))
    return tuple(out)


class DeadlockWatch:
    """Looks for a deadlock while one request is waited for (see the module docstring).

    ``targets`` are the ranks the request went to; ``exited`` says whether a rank's
    process is gone (its slot is then stale, and it counts as live: its peers' calls fail
    on their own); ``clock`` is the time source (``started`` is on it). Call :meth:`check` from the wait loop; it reads the board at most every
    :data:`CHECK_EVERY` seconds, and the counts only when a rank the request waits for is
    blocked in a point-to-point call.
    """

    def __init__(self, board: Board | None, targets: Iterable[int], started: float,
                 exited: Callable[[int], bool] = lambda rank: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.board = board
        self.targets = set(targets)
        self.started = started
        self.exited = exited
        self.clock = clock
        self._last_read = float("-inf")
        self._seen: tuple | None = None
        self._seen_at = 0.0

    def check(self, pending: set[int], replied: Iterable[int]) -> Deadlock | None:
        """A :class:`Deadlock` once the same one was read twice :data:`STABLE` s apart."""
        now = self.clock()
        if self.board is None or not pending or now - self._last_read < CHECK_EVERY:
            return None
        self._last_read = now
        board = self.board.read()
        if not any(blocked_on(board[r]) for r in pending if r < len(board)):
            self._seen = None
            return None
        finished = set(replied)
        for rec in board:
            if self.exited(rec.rank):
                board[rec.rank] = BoardRecord(rec.rank, "running")
            elif rec.rank not in self.targets and rec.phase == "ready":
                finished.add(rec.rank)  # not asked, idle: it makes no call while we wait
        counts = self.board.read_counts()
        stuck = stuck_ranks(board, counts, finished)
        if not pending.intersection(stuck):
            self._seen = None
            return None
        evidence = _evidence(stuck, board, counts, finished)
        if evidence != self._seen:
            self._seen, self._seen_at = evidence, now
            return None
        if now - self._seen_at < STABLE:
            return None
        return Deadlock(ranks=stuck, seconds=now - self.started)
